//! Fixed-length arrays in a memory mapping of their own, which the kernel is
//! asked to back with transparent huge pages.
//!
//! The index reads its table at random. With 4 KiB pages, a table of a few
//! megabytes spans more pages than the TLB holds, so nearly every such read
//! pays a page walk on top of its cache miss; with 2 MiB pages the whole
//! table needs a handful of TLB entries. Arrays smaller than one huge page,
//! or any array where mapping fails, live on the heap as usual.

use std::{
    fmt,
    ops::{Deref, DerefMut},
};

use bytemuck::Pod;
use memmap2::MmapMut;

/// Below this, an array stays on the heap (a mapping could not hold even one
/// huge page).
const HUGE_PAGE: usize = 2 << 20;

/// A fixed-length `[T]`, possibly in huge pages.
pub(super) enum Pages<T> {
    Heap(Vec<T>),
    /// Whole `T`s: the mapping's length is a multiple of `size_of::<T>()`
    /// and its start is page-aligned, checked when it is made.
    Mapped(MmapMut),
}

impl<T> Default for Pages<T> {
    fn default() -> Self {
        Self::Heap(Vec::new())
    }
}

impl<T: Pod> Pages<T> {
    /// `len` copies of `value`.
    pub(super) fn filled(len: usize, value: T) -> Self {
        let bytes = len.saturating_mul(size_of::<T>());
        if bytes >= HUGE_PAGE
            && let Ok(mut map) = MmapMut::map_anon(bytes)
        {
            // Only a hint: without it (another OS, THP disabled) the
            // array works the same on small pages.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            if let Ok(items) = bytemuck::try_cast_slice_mut::<u8, T>(&mut map) {
                items.fill(value);
                return Self::Mapped(map);
            }
        }
        Self::Heap(vec![value; len])
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Self::Heap(v) => v.capacity() * size_of::<T>(),
            Self::Mapped(m) => m.len(),
        }
    }
}

impl<T: Pod> Deref for Pages<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::Heap(v) => v,
            // Cannot fail: the cast succeeded when the mapping was made.
            Self::Mapped(m) => bytemuck::try_cast_slice(m).unwrap_or_default(),
        }
    }
}

impl<T: Pod> DerefMut for Pages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Self::Heap(v) => v,
            Self::Mapped(m) => bytemuck::try_cast_slice_mut(m).unwrap_or_default(),
        }
    }
}

impl<T: Pod> fmt::Debug for Pages<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Self::Heap(_) => "heap",
            Self::Mapped(_) => "mapped",
        };
        write!(
            f,
            "Pages({} × {} bytes, {kind})",
            self.len(),
            size_of::<T>()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_arrays_stay_on_the_heap_and_large_ones_are_mapped() {
        let small = Pages::filled(16, 7u64);
        assert!(matches!(small, Pages::Heap(_)));
        assert_eq!(&small[..], &[7u64; 16]);

        let n = HUGE_PAGE / size_of::<u64>() + 3;
        let mut large = Pages::filled(n, u64::MAX);
        assert!(matches!(large, Pages::Mapped(_)), "{large:?}");
        assert_eq!(large.len(), n);
        assert!(large.iter().all(|&x| x == u64::MAX));
        large[n - 1] = 5;
        assert_eq!(large[n - 1], 5);
        assert!(large.bytes() >= n * 8);
    }
}
