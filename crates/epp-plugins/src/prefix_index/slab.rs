//! Fixed-size records addressed by `u32` index, allocated in chunks of
//! [`CHUNK`] (growing never copies or moves a record) and reused through a
//! free list linked through the records themselves: the index's entries
//! and its shared blocks' holders records.

use super::{CHUNK, CHUNK_BITS, NIL};

/// A record a [`Slab`] holds: what a free one looks like, and its free-list
/// link.
pub(super) trait Record: Copy {
    /// A free record whose next free record is `next_free`.
    fn freed(next_free: u32) -> Self;
    /// The next free record, while this one is free.
    fn next_free(&self) -> u32;
}

#[derive(Debug)]
pub(super) struct Slab<T> {
    chunks: Vec<Box<[T]>>,
    /// Records handed out from the chunks so far.
    used: u32,
    /// Head of the free list.
    free: u32,
    /// Records in use.
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            used: 0,
            free: NIL,
            live: 0,
        }
    }
}

impl<T: Record> Slab<T> {
    pub(super) fn get(&self, idx: u32) -> &T {
        &self.chunks[(idx >> CHUNK_BITS) as usize][idx as usize & (CHUNK - 1)]
    }

    pub(super) fn get_mut(&mut self, idx: u32) -> &mut T {
        &mut self.chunks[(idx >> CHUNK_BITS) as usize][idx as usize & (CHUNK - 1)]
    }

    /// A record set to `value`; None when 2^32 − 1 are in use. The second
    /// value is true when a chunk was added.
    pub(super) fn alloc(&mut self, value: T) -> Option<(u32, bool)> {
        let mut grew = false;
        let idx = if self.free != NIL {
            let idx = self.free;
            self.free = self.get(idx).next_free();
            idx
        } else {
            if self.used >= NIL - 1 {
                return None;
            }
            if self.used as usize == self.chunks.len() * CHUNK {
                self.chunks
                    .push(vec![T::freed(NIL); CHUNK].into_boxed_slice());
                grew = true;
            }
            self.used += 1;
            self.used - 1
        };
        *self.get_mut(idx) = value;
        self.live += 1;
        Some((idx, grew))
    }

    pub(super) fn free(&mut self, idx: u32) {
        *self.get_mut(idx) = T::freed(self.free);
        self.free = idx;
        self.live -= 1;
    }

    /// Records in use.
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        self.live
    }

    pub(super) fn bytes(&self) -> usize {
        self.chunks.len() * CHUNK * size_of::<T>() + self.chunks.capacity() * size_of::<Box<[T]>>()
    }
}
