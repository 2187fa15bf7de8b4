//! epp-bin
fn main() {}
