//! epp-sim
fn main() {}
