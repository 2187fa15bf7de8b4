//! Caps on metric label values that come from requests (model names, target
//! models, fairness ids): without one, clients would choose how many series
//! epp keeps.

use std::{
    collections::HashSet,
    sync::{PoisonError, RwLock},
};

/// Most distinct values one capped label keeps (the reference's cap).
pub const MAX_LABEL_VALUES: usize = 1000;

/// The label value of every value past the cap.
pub const FOLDED_LABEL: &str = "other";

/// The first `max` distinct values a label took; later new ones fold into
/// [`FOLDED_LABEL`]. The set only grows, so a value maps to the same label
/// every time (a gauge's increment and decrement meet).
#[derive(Debug)]
pub struct LabelCap {
    max: usize,
    seen: RwLock<HashSet<String>>,
}

impl Default for LabelCap {
    fn default() -> Self {
        Self::new(MAX_LABEL_VALUES)
    }
}

impl LabelCap {
    /// A cap keeping at most `max` distinct values.
    #[must_use]
    pub fn new(max: usize) -> Self {
        Self {
            max,
            seen: RwLock::new(HashSet::new()),
        }
    }

    /// The label for `value`: itself, or [`FOLDED_LABEL`] once `max` other
    /// values were kept.
    pub fn label<'a>(&self, value: &'a str) -> &'a str {
        {
            let seen = self.seen.read().unwrap_or_else(PoisonError::into_inner);
            if seen.contains(value) {
                return value;
            }
            if seen.len() >= self.max {
                return FOLDED_LABEL;
            }
        }
        let mut seen = self.seen.write().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(value) {
            value
        } else if seen.len() >= self.max {
            FOLDED_LABEL
        } else {
            seen.insert(value.to_owned());
            value
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_fold_and_kept_ones_stay() {
        let cap = LabelCap::new(3);
        assert_eq!(cap.label("a"), "a");
        assert_eq!(cap.label("b"), "b");
        assert_eq!(cap.label("a"), "a");
        assert_eq!(cap.label("c"), "c");
        assert_eq!(cap.label("d"), FOLDED_LABEL);
        assert_eq!(cap.label("e"), FOLDED_LABEL);
        // Kept values keep their own label after the cap is reached.
        assert_eq!(cap.label("b"), "b");
    }
}
