//! epp-promtext
