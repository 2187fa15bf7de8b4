//! Any bytes: see `check.rs`, which `cargo test` also runs on a bounded set
//! of generated inputs (`tests/fuzz.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod check;

fuzz_target!(|data: &[u8]| check::check(data));
