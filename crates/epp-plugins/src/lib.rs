//! epp-plugins
