//! What the integration tests share: the real-shaped pages in
//! `tests/fixtures/`.

/// The fixture page `name` (e.g. `vllm.txt`).
pub(crate) fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture file")
}
