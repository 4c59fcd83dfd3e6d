//! Tokens to text for a server: what the server needs from a tokenizer ([`TextCodec`]), and
//! [`Utf8Stream`], which hands out text only in whole UTF-8 characters, so a character whose
//! bytes are split across tokens never splits across two streamed chunks.

use crate::error::Result;
use crate::model::tokenizer::Tokenizer;

/// What the server needs from a tokenizer.
pub trait TextCodec: Send + Sync {
    /// The ids of a prompt (special-token text in it becomes those tokens, as `generate` does).
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Appends the bytes token `id` stands for (an id outside the vocabulary is an error).
    fn token_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<()>;
    /// Whether `id` is a special (control) token, left out of the text.
    fn is_special(&self, id: u32) -> bool;
    /// The tokens that end a generation (end of sequence, end of turn).
    fn end_ids(&self) -> Vec<u32>;
}

impl TextCodec for Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Tokenizer::encode(self, text, true)
    }

    fn token_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        self.push_token_bytes(id, out)
    }

    fn is_special(&self, id: u32) -> bool {
        Tokenizer::is_special(self, id)
    }

    fn end_ids(&self) -> Vec<u32> {
        self.eog_ids().to_vec()
    }
}

/// Bytes in, whole UTF-8 characters out.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that is complete now (maybe empty). The bytes of an
    /// unfinished character wait for the next call; bytes that can never be valid UTF-8 come
    /// out as U+FFFD.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..good]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: an unfinished character comes out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_pushes_comes_out_whole_once() {
        // "é" (2 bytes), "€" (3 bytes), "🦀" (4 bytes), fed one byte at a time.
        let text = "aé€🦀z";
        let mut s = Utf8Stream::default();
        let mut pieces = Vec::new();
        for b in text.as_bytes() {
            pieces.push(s.push(&[*b]));
        }
        pieces.push(s.finish());
        assert_eq!(pieces.concat(), text);
        for piece in &pieces {
            // Every piece is valid on its own: no character is split between pieces.
            assert!(piece.chars().count() <= 1, "{pieces:?}");
        }
        assert_eq!(pieces[1], "", "the first byte of é waits");
        assert_eq!(pieces[2], "é");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters_and_an_unfinished_tail_too() {
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(s.push(b"\xe2\x82"), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.finish(), "");
    }
}
