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

use super::{NIL, slab::Record};

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

impl Record for Holders {
    fn freed(next_free: u32) -> Self {
        Self { next_free, ..EMPTY }
    }
    fn next_free(&self) -> u32 {
        self.next_free
    }
}

impl Holders {
    /// The record of a block of `hash` held by `mask`'s endpoints from
    /// `head`.
    pub(super) fn new(hash: u64, mask: u64, head: u32) -> Self {
        Self {
            hash,
            mask,
            head,
            next_free: NIL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::slab::Slab, *};

    #[test]
    fn bits_cover_ids_below_64_only() {
        assert_eq!(bit(0), 1);
        assert_eq!(bit(63), 1 << 63);
        assert_eq!(bit(64), 0);
        assert_eq!(bit(NIL - 1), 0);
    }

    #[test]
    fn freed_records_are_reused_before_new_ones() {
        let mut slab = Slab::<Holders>::default();
        let (a, grew) = slab.alloc(Holders::new(1, 0b11, 7)).expect("room");
        assert!(grew, "the first record takes a chunk");
        let (b, grew) = slab.alloc(Holders::new(2, 0b101, 8)).expect("room");
        assert!(!grew);
        assert_ne!(a, b);
        slab.free(a);
        assert_eq!(slab.live(), 1);
        let (c, _) = slab.alloc(Holders::new(3, 0b110, 9)).expect("room");
        assert_eq!(c, a, "the freed record comes back");
        let h = slab.get(c);
        assert_eq!((h.hash, h.mask, h.head), (3, 0b110, 9));
        assert_eq!(slab.get(b).head, 8);
        assert_eq!(slab.live(), 2);
    }
}
