//! `onepass tokenize`: show the token ids of a text, each with the text it stands for.

use std::io::Write;

use clap::Args;
use onepass::model::tokenizer::Tokenizer;

use super::common::{open_model, ModelArgs};

/// Flags of `tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The text.
    pub text: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print `{"ids": [...], "text": [...], "tokens": [...]}`: the ids, the text of each token
    /// (bytes that are not UTF-8 on their own become U+FFFD) and its vocabulary string.
    #[arg(long)]
    pub json: bool,
}

/// The bytes of one token as a quoted string: UTF-8 text escaped as Rust does, and each byte that
/// is not UTF-8 on its own (a piece of a character split over tokens) as `\xNN`.
pub fn quoted_bytes(bytes: &[u8]) -> String {
    let mut s = String::from("\"");
    for chunk in bytes.utf8_chunks() {
        s.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for b in chunk.invalid() {
            s.push_str(&format!("\\x{b:02X}"));
        }
    }
    s.push('"');
    s
}

/// Runs `tokenize`.
pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let file = open_model(&args.model.model, &onepass::RuntimeConfig::from_env())?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&args.text, true)?;
    let mut bytes = Vec::with_capacity(ids.len());
    for &id in &ids {
        let mut b = Vec::new();
        tok.push_token_bytes(id, &mut b)?;
        bytes.push(b);
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let tokens: Vec<&str> = ids
            .iter()
            .map(|&i| tok.token_str(i).unwrap_or(""))
            .collect();
        let text: Vec<String> = bytes
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        let obj = serde_json::json!({ "ids": ids, "text": text, "tokens": tokens });
        writeln!(out, "{obj}")?;
    } else {
        for (id, b) in ids.iter().zip(&bytes) {
            writeln!(out, "{id:>8}  {}", quoted_bytes(b))?;
        }
        eprintln!("{} tokens", ids.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::quoted_bytes;

    #[test]
    fn token_bytes_are_quoted_with_split_characters_escaped() {
        assert_eq!(quoted_bytes(b" world"), "\" world\"");
        assert_eq!(quoted_bytes(b"a\n\"b\""), "\"a\\n\\\"b\\\"\"");
        assert_eq!(quoted_bytes(" é".as_bytes()), "\" é\"");
        // The first two bytes of U+1F600, as a byte-level tokenizer splits it.
        assert_eq!(quoted_bytes(&[0x20, 0xF0, 0x9F]), "\" \\xF0\\x9F\"");
    }
}
