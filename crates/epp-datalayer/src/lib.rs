//! epp-datalayer
