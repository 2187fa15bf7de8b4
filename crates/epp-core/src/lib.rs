//! epp-core
