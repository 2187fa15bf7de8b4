//! The holders of a block held by three endpoints or more: which endpoints
//! with ids below 64 hold it, as one bit each, so that a match reads one
//! word per distinct match length instead of walking the block's chain of
//! entries (one cache miss per holder).
//!
//! A block held by one or two endpoints has no record: its table slot names
//! the first entry of its chain, as before. So an index whose blocks have
//! one or two holders each takes no more memory than without these
//! records, and one whose blocks are widely shared pays 24 bytes per such
//! block, split between its (three or more) holders.

use super::{CHUNK, CHUNK_BITS, NIL};

/// A widely shared block's record: its hash (so that a table lookup verifies the
/// slot against it, as it does against the entry of a block with one
/// holder), the bits of its holders below id 64, and the head of its chain
/// of entries (every holder, whatever its id).
#[derive(Debug, Clone, Copy)]
pub(super) struct Holders {
    pub(super) hash: u64,
    /// Bit `i` set when endpoint `i` (< 64) holds the block.
    pub(super) mask: u64,
    /// First entry of the block's chain.
    pub(super) head: u32,
    /// Next free record, while free.
    next_free: u32,
}

const EMPTY: Holders = Holders {
    hash: 0,
    mask: 0,
    head: NIL,
    next_free: NIL,
};

/// `ep`'s bit in a [`Holders::mask`], 0 for ids of 64 and above.
pub(super) fn bit(ep: u32) -> u64 {
    1u64.checked_shl(ep).unwrap_or(0)
}

/// Holders records, allocated in chunks (growing never copies) and reused
/// through a free list.
#[derive(Debug)]
pub(super) struct HolderSlab {
    chunks: Vec<Box<[Holders]>>,
    used: u32,
    free: u32,
    /// Records in use (for the index's checks).
    live: usize,
}

impl Default for HolderSlab {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            used: 0,
            free: NIL,
            live: 0,
        }
    }
}

impl HolderSlab {
    pub(super) fn get(&self, idx: u32) -> &Holders {
        &self.chunks[(idx >> CHUNK_BITS) as usize][idx as usize & (CHUNK - 1)]
    }

    pub(super) fn get_mut(&mut self, idx: u32) -> &mut Holders {
        &mut self.chunks[(idx >> CHUNK_BITS) as usize][idx as usize & (CHUNK - 1)]
    }

    /// A record for a block of `hash` held by `mask`'s endpoints from
    /// `head`; None when 2^32 − 1 are in use. The second value is true when
    /// a chunk was added.
    pub(super) fn alloc(&mut self, hash: u64, mask: u64, head: u32) -> Option<(u32, bool)> {
        let mut grew = false;
        let idx = if self.free != NIL {
            let idx = self.free;
            self.free = self.get(idx).next_free;
            idx
        } else {
            if self.used >= NIL - 1 {
                return None;
            }
            if self.used as usize == self.chunks.len() * CHUNK {
                self.chunks.push(vec![EMPTY; CHUNK].into_boxed_slice());
                grew = true;
            }
            self.used += 1;
            self.used - 1
        };
        *self.get_mut(idx) = Holders {
            hash,
            mask,
            head,
            next_free: NIL,
        };
        self.live += 1;
        Some((idx, grew))
    }

    pub(super) fn free(&mut self, idx: u32) {
        let next_free = self.free;
        *self.get_mut(idx) = Holders { next_free, ..EMPTY };
        self.free = idx;
        self.live -= 1;
    }

    /// Records in use.
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        self.live
    }

    pub(super) fn bytes(&self) -> usize {
        self.chunks.len() * CHUNK * size_of::<Holders>()
            + self.chunks.capacity() * size_of::<Box<[Holders]>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_cover_ids_below_64_only() {
        assert_eq!(bit(0), 1);
        assert_eq!(bit(63), 1 << 63);
        assert_eq!(bit(64), 0);
        assert_eq!(bit(NIL - 1), 0);
    }

    #[test]
    fn freed_records_are_reused_before_new_ones() {
        let mut slab = HolderSlab::default();
        let (a, grew) = slab.alloc(1, 0b11, 7).expect("room");
        assert!(grew, "the first record takes a chunk");
        let (b, grew) = slab.alloc(2, 0b101, 8).expect("room");
        assert!(!grew);
        assert_ne!(a, b);
        slab.free(a);
        assert_eq!(slab.live(), 1);
        let (c, _) = slab.alloc(3, 0b110, 9).expect("room");
        assert_eq!(c, a, "the freed record comes back");
        let h = slab.get(c);
        assert_eq!((h.hash, h.mask, h.head), (3, 0b110, 9));
        assert_eq!(slab.get(b).head, 8);
        assert_eq!(slab.live(), 2);
    }
}
