//! Real tokenization (`--tokenizer`): a Hugging Face `tokenizer.json` loaded
//! with the `tokenizers` crate.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::error::Error;

/// Loads `path`: a `tokenizer.json` file, or a directory holding one (the
/// Hugging Face layout).
///
/// # Errors
/// When there is no such file or it is not a tokenizer.
pub fn load(path: &Path) -> Result<Tokenizer, Error> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    let fail = |reason: String| Error::Tokenizer {
        path: path.display().to_string(),
        reason,
    };
    if !file.is_file() {
        return Err(fail(format!("{} is not a file", file.display())));
    }
    Tokenizer::from_file(&file).map_err(|e| fail(format!("{}: {e}", file.display())))
}

/// `text`'s token ids, special tokens added, as a router computes them for
/// the same prompt.
///
/// # Errors
/// When the tokenizer fails on the text.
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    encode_with(tokenizer, text, true)
}

/// `text`'s token ids, with special tokens added or not.
///
/// # Errors
/// When the tokenizer fails on the text.
pub fn encode_with(
    tokenizer: &Tokenizer,
    text: &str,
    add_special: bool,
) -> Result<Vec<u32>, String> {
    tokenizer
        .encode(text, add_special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| e.to_string())
}
