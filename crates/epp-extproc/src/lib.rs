//! epp-extproc
