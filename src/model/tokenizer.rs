//! The model's tokenizer, built from GGUF metadata.
//!
//! Supported: `tokenizer.ggml.model = "llama"`, the SentencePiece-style BPE with byte fallback of
//! Llama 2 and Gemma (in [`crate::model::tokenizer_spm`]), and `tokenizer.ggml.model = "gpt2"`
//! (byte-level BPE, on top of the `tokenizers` crate) with the pre-tokenizers
//! `smollm` (every digit on its own, then the GPT-2 split pattern), `llama-bpe` / `llama3` /
//! `llama-v3` (the Llama-3 split pattern; merges ignored for words already in the vocabulary) and
//! `gpt-2` / `default` (the GPT-2 pattern alone). Tokens of token_type 3 (control) become special
//! tokens, tokens of type 4 (user-defined) are matched whole in the text as ordinary added tokens.
//!
//! Decoding is done here from the token strings (for byte-level BPE the same bytes the
//! `tokenizers` ByteLevel decoder produces; for SentencePiece `▁` is a space and `<0xXX>` a byte),
//! so that [`StreamDecoder`] can hand out text exactly at UTF-8 character boundaries while tokens
//! arrive one by one.

use std::collections::HashMap;
use std::sync::OnceLock;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;
use crate::model::tokenizer_spm::{self, SpmModel};

/// The Llama-3 pre-tokenizer split pattern (also used by llama.cpp for `llama-bpe`).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token_type of control (special) tokens.
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token_type of user-defined tokens.
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Token texts that end a generation when present in the vocabulary.
const END_OF_GENERATION_TEXTS: [&str; 6] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<end_of_turn>",
];

/// The pre-tokenizer named by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `smollm`: digits one by one, then the GPT-2 pattern.
    SmolLm,
    /// `llama-bpe` (also `llama3`, `llama-v3`): the Llama-3 pattern.
    Llama3,
    /// `gpt-2` (or `default`): the GPT-2 pattern.
    Gpt2,
    /// None: a SentencePiece tokenizer (`tokenizer.ggml.model = "llama"`) merges over the whole
    /// text, `tokenizer.ggml.pre` aside.
    SentencePiece,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, or `None` for one not supported.
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "smollm" => Some(PreTokenizer::SmolLm),
            "llama-bpe" | "llama3" | "llama-v3" => Some(PreTokenizer::Llama3),
            "gpt-2" | "gpt2" | "default" => Some(PreTokenizer::Gpt2),
            _ => None,
        }
    }

    fn build(self) -> Result<PreTokenizerWrapper, String> {
        Ok(match self {
            PreTokenizer::SmolLm => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
            ])),
            PreTokenizer::Llama3 => {
                let split = Split::new(
                    SplitPattern::Regex(LLAMA3_PATTERN.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| format!("the Llama-3 split pattern: {e}"))?;
                PreTokenizerWrapper::Sequence(Sequence::new(vec![
                    PreTokenizerWrapper::Split(split),
                    PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
                ]))
            }
            PreTokenizer::Gpt2 => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
            PreTokenizer::SentencePiece => {
                return Err("SentencePiece has no byte-level pre-tokenizer".into())
            }
        })
    }
}

/// A tokenizer read from a GGUF file: byte-level BPE or SentencePiece.
#[derive(Clone)]
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    special: Vec<bool>,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

/// How a text becomes ids.
#[derive(Clone)]
enum Model {
    /// `gpt2`: byte-level BPE through the `tokenizers` crate.
    ByteLevel(Box<ByteLevelModel>),
    /// `llama`: SentencePiece-style BPE.
    SentencePiece(Box<SpmModel>),
}

/// The byte-level BPE, as the `tokenizers` crate runs it.
#[derive(Clone)]
struct ByteLevelModel {
    /// Splits special tokens written in the text out as single tokens.
    with_special: tokenizers::Tokenizer,
    /// The same, but special-token text is tokenized as ordinary text (built on first use).
    without_special: OnceLock<std::result::Result<tokenizers::Tokenizer, String>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.tokens.len())
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("eog", &self.eog)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        let kind = gguf.get_str("tokenizer.ggml.model")?;
        let pre = match kind {
            "llama" => PreTokenizer::SentencePiece,
            "gpt2" => {
                let pre_name = gguf.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
                PreTokenizer::from_name(pre_name).ok_or_else(|| {
                    gguf.err(format!(
                        "tokenizer.ggml.pre = `{pre_name}` is not supported (supported: smollm, llama-bpe, gpt-2)"
                    ))
                })?
            }
            _ => {
                return Err(gguf.err(format!(
                    "tokenizer.ggml.model = `{kind}` is not supported (supported: `gpt2`, \
                     byte-level BPE, and `llama`, SentencePiece)"
                )))
            }
        };
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(gguf.err(format!("tokenizer.ggml.tokens has {n} entries")));
        }
        let types = match gguf.get("tokenizer.ggml.token_type") {
            Some(_) => gguf.get_i32_array("tokenizer.ggml.token_type")?,
            None => vec![1; n],
        };
        if types.len() != n {
            return Err(gguf.err(format!(
                "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n}",
                types.len()
            )));
        }
        let id_key = |key: &str| -> Result<Option<u32>> {
            match gguf.opt_u32(key)? {
                Some(id) if id as usize >= n => Err(gguf.err(format!(
                    "{key} = {id} is outside the vocabulary of {n} tokens"
                ))),
                other => Ok(other),
            }
        };
        let bos = id_key("tokenizer.ggml.bos_token_id")?;
        let eos = id_key("tokenizer.ggml.eos_token_id")?;
        let unk = id_key("tokenizer.ggml.unknown_token_id")?;
        let (model, special) = if pre == PreTokenizer::SentencePiece {
            let spm = SpmModel::from_gguf(gguf, &tokens, &types, unk)?;
            let special = types
                .iter()
                .map(|&t| tokenizer_spm::is_special_type(t))
                .collect();
            (Model::SentencePiece(Box::new(spm)), special)
        } else {
            let model = byte_level_model(gguf, &tokens, &types, pre, unk)?;
            let special = types.iter().map(|&t| t == TOKEN_TYPE_CONTROL).collect();
            (model, special)
        };
        // Llama-3 and SentencePiece models add a BOS unless they say otherwise.
        let add_bos = gguf
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(matches!(
                pre,
                PreTokenizer::Llama3 | PreTokenizer::SentencePiece
            ));
        let add_eos = gguf
            .opt_bool("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false);

        let mut eog: Vec<u32> = eos.into_iter().collect();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            eog.extend(id_key(key)?);
        }
        for text in END_OF_GENERATION_TEXTS {
            if let Some(id) = vocab_first(&tokens, text) {
                eog.push(id as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            model,
            tokens,
            special,
            pre,
            bos,
            eos,
            add_bos,
            add_eos,
            eog,
        })
    }

    /// Tokenizes `text`. With `parse_special`, special-token text such as `<|im_start|>` becomes
    /// that single token; without, it is tokenized as ordinary text. When the model asks for a BOS
    /// token ([`Tokenizer::add_bos`]) one is put in front, unless the ids already start with it
    /// (as after a chat template that writes the BOS text itself); likewise an EOS at the end
    /// when it asks for one ([`Tokenizer::add_eos`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = self.encode_plain(text, parse_special)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        if let (true, Some(eos)) = (self.add_eos, self.eos) {
            if ids.last() != Some(&eos) {
                ids.push(eos);
            }
        }
        Ok(ids)
    }

    /// Tokenizes `text` without ever adding a BOS or EOS token. A SentencePiece model that asks
    /// for a space prefix (`tokenizer.ggml.add_space_prefix`) still gets it: it is part of how
    /// such a model reads a text.
    pub fn encode_plain(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let (with_special, without_special) = match &self.model {
            Model::SentencePiece(spm) => {
                let mut ids = Vec::with_capacity(text.len() / 3 + 1);
                spm.encode(text, parse_special, &mut ids)?;
                return Ok(ids);
            }
            Model::ByteLevel(m) => (&m.with_special, &m.without_special),
        };
        let tokenizer = if parse_special {
            with_special
        } else {
            let built = without_special.get_or_init(|| {
                let mut t = with_special.clone();
                t.set_encode_special_tokens(true);
                Ok(t)
            });
            built
                .as_ref()
                .map_err(|e| Error::InvalidArgument(e.clone()))?
        };
        let encoding = tokenizer
            .encode(text, false)
            .map_err(|e| Error::InvalidArgument(format!("tokenizing failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes ids to text, special tokens included; bytes that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            self.push_token_bytes(id, &mut bytes)?;
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Decodes ids to text, leaving out special (control) tokens.
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids.iter().filter(|&&id| !self.is_special(id)) {
            self.push_token_bytes(id, &mut bytes)?;
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Appends the bytes one token stands for.
    pub fn push_token_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        let text = self.token_str(id).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "token id {id} is outside the vocabulary of {} tokens",
                self.tokens.len()
            ))
        })?;
        if self.is_special(id) {
            out.extend_from_slice(text.as_bytes());
        } else if let Model::SentencePiece(spm) = &self.model {
            spm.push_piece_bytes(id, text, out);
        } else {
            for c in text.chars() {
                match byte_of_char(c) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        }
        Ok(())
    }

    /// A decoder for ids that arrive one at a time.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
            skip_special: false,
        }
    }

    /// The vocabulary string of a token as the GGUF stores it (byte-level BPE: `Ġ` for a space;
    /// SentencePiece: `▁` for a space, `<0xXX>` for a byte), if the id exists.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary string, if present.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.model {
            Model::ByteLevel(m) => m.with_special.token_to_id(text),
            Model::SentencePiece(spm) => spm.token_id(&self.tokens, text),
        }
    }

    /// The number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the token is a special token: a control token (token_type 3), and for
    /// SentencePiece models also the unknown token (type 2).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The pre-tokenizer in use ([`PreTokenizer::SentencePiece`] for SentencePiece models).
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// The beginning-of-sequence token, if the model names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the model names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether [`Tokenizer::encode`] puts a BOS token in front (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`Tokenizer::encode`] puts an EOS token at the end (`tokenizer.ggml.add_eos_token`).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether a SentencePiece model puts a space in front of a text
    /// (`tokenizer.ggml.add_space_prefix`); false for byte-level BPE. [`Tokenizer::decode`]
    /// keeps that space: ids are decoded piece by piece, the same whether they start a text or
    /// continue one.
    pub fn add_space_prefix(&self) -> bool {
        match &self.model {
            Model::SentencePiece(spm) => spm.add_space_prefix(),
            Model::ByteLevel(_) => false,
        }
    }

    /// The tokens that end a generation: EOS, EOT/EOM ids when given, and `<|im_end|>`,
    /// `<|eot_id|>`, `<|endoftext|>` and similar where the vocabulary has them; sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether the token ends a generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
}

/// The byte-level BPE of a `gpt2` vocabulary: its merges, the pre-tokenizer, control tokens
/// (type 3) as special tokens and user-defined ones (type 4) as added tokens.
fn byte_level_model(
    gguf: &GgufFile,
    tokens: &[String],
    types: &[i32],
    pre: PreTokenizer,
    unk: Option<u32>,
) -> Result<Model> {
    let merges = gguf
        .get_str_array("tokenizer.ggml.merges")?
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| {
                    gguf.err(format!(
                        "tokenizer.ggml.merges[{i}] = `{m}` is not two tokens separated by a space"
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut vocab = Vocab::default();
    for (id, t) in tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(id as u32);
    }
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre == PreTokenizer::Llama3);
    if let Some(unk) = unk {
        builder = builder.unk_token(tokens[unk as usize].clone());
    }
    let model = builder
        .build()
        .map_err(|e| gguf.err(format!("building the BPE model: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(pre.build().map_err(|e| gguf.err(e))?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    let added = |ty: i32, is_special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(types)
            .filter(|&(_, &t)| t == ty)
            .map(|(s, _)| AddedToken::from(s.clone(), is_special).normalized(false))
            .collect()
    };
    inner
        .add_special_tokens(added(TOKEN_TYPE_CONTROL, true))
        .and_then(|_| inner.add_tokens(added(TOKEN_TYPE_USER_DEFINED, false)))
        .map_err(|e| gguf.err(format!("adding the special tokens: {e}")))?;
    for (id, t) in tokens.iter().enumerate() {
        if types[id] == TOKEN_TYPE_CONTROL || types[id] == TOKEN_TYPE_USER_DEFINED {
            let got = inner.token_to_id(t);
            if got != Some(id as u32) && vocab_first(tokens, t) == Some(id) {
                return Err(gguf.err(format!(
                    "added token `{t}` (id {id}) resolved to id {got:?}"
                )));
            }
        }
    }
    Ok(Model::ByteLevel(Box::new(ByteLevelModel {
        with_special: inner,
        without_special: OnceLock::new(),
    })))
}

fn vocab_first(tokens: &[String], text: &str) -> Option<usize> {
    tokens.iter().position(|t| t == text)
}

/// The byte a GPT-2 byte-level character stands for. Printable bytes (`!`..=`~`, `¡`..=`¬`,
/// `®`..=`ÿ`) stand for themselves; the other 68 bytes are shifted to U+0100 onwards in order.
fn byte_of_char(c: char) -> Option<u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 0u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    (char::from(b), b)
                } else {
                    shifted += 1;
                    (
                        char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER),
                        b,
                    )
                }
            })
            .collect()
    });
    table.get(&c).copied()
}

/// Turns ids arriving one at a time into text, handing out only whole UTF-8 characters: the bytes
/// of a character split across tokens are held back until the character is complete.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
    skip_special: bool,
}

impl StreamDecoder<'_> {
    /// Leaves special (control) tokens out of the text.
    pub fn skip_special(mut self, skip: bool) -> Self {
        self.skip_special = skip;
        self
    }

    /// Adds one token; returns the text that is now complete (possibly empty). Byte sequences
    /// that can never become valid UTF-8 are given out as U+FFFD, as [`Tokenizer::decode`] does.
    pub fn push(&mut self, id: u32) -> Result<String> {
        if self.skip_special && self.tokenizer.is_special(id) {
            return Ok(String::new());
        }
        self.tokenizer.push_token_bytes(id, &mut self.pending)?;
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The prefix up to `good` was just validated.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                        None => {
                            self.pending.drain(..good);
                            break;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Ends the stream: bytes still held back (an unfinished character) come out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf_write::GgufWriter;

    /// A small byte-level vocabulary: three added tokens, the 256 byte characters, then words
    /// with the merges that build them (and `xyz`, which no merge builds).
    fn tiny_gguf(pre: Option<&str>, edit: impl FnOnce(&mut GgufWriter<'_>)) -> GgufFile {
        let mut byte_chars = vec!['\0'; 256];
        for c in (0..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_of_char(c) {
                byte_chars[b as usize] = c;
            }
        }
        let mut tokens: Vec<String> = vec![
            "<|begin_of_text|>".into(),
            "<|eot_id|>".into(),
            "<tool>".into(),
        ];
        let mut types = vec![3, 3, 4];
        tokens.extend(byte_chars.iter().map(|c| c.to_string()));
        let words = [
            "12", "123", "45", "IT", "'S", "he", "hel", "hell", "hello", "Ġw", "Ġwo", "Ġworld",
            "xyz",
        ];
        tokens.extend(words.iter().map(|w| w.to_string()));
        types.resize(tokens.len(), 1);
        let merges = [
            "1 2", "12 3", "4 5", "I T", "' S", "h e", "he l", "hel l", "hell o", "Ġ w", "Ġw o",
            "Ġwo rld",
        ];
        // `rld` must exist for the last merge: add it and the merges that make it.
        tokens.extend(["rl".to_string(), "rld".to_string()]);
        types.extend([1, 1]);
        let mut all_merges: Vec<&str> = vec!["r l", "rl d"];
        all_merges.extend(merges);
        let mut w = GgufWriter::new();
        w.add_str("tokenizer.ggml.model", "gpt2").unwrap();
        if let Some(pre) = pre {
            w.add_str("tokenizer.ggml.pre", pre).unwrap();
        }
        w.add_str_array("tokenizer.ggml.tokens", &tokens).unwrap();
        w.add_i32_array("tokenizer.ggml.token_type", &types)
            .unwrap();
        w.add_str_array("tokenizer.ggml.merges", &all_merges)
            .unwrap();
        w.add_u32("tokenizer.ggml.bos_token_id", 0).unwrap();
        w.add_u32("tokenizer.ggml.eos_token_id", 1).unwrap();
        edit(&mut w);
        GgufFile::from_bytes(&w.to_bytes().unwrap(), "tiny.gguf").unwrap()
    }

    fn pieces(tok: &Tokenizer, text: &str) -> Vec<String> {
        let ids = tok.encode_plain(text, true).unwrap();
        ids.iter()
            .map(|&id| tok.token_str(id).unwrap().to_string())
            .collect()
    }

    #[test]
    fn llama3_and_smollm_pre_tokenizers_split_differently() {
        let llama = Tokenizer::from_gguf(&tiny_gguf(Some("llama-bpe"), |_| {})).unwrap();
        let smol = Tokenizer::from_gguf(&tiny_gguf(Some("smollm"), |_| {})).unwrap();
        assert_eq!(llama.pre_tokenizer(), PreTokenizer::Llama3);
        // Llama-3: numbers in groups of three; smollm: every digit alone.
        assert_eq!(pieces(&llama, "12345"), ["123", "45"]);
        assert_eq!(pieces(&smol, "12345"), ["1", "2", "3", "4", "5"]);
        // Llama-3 contractions match case-insensitively; GPT-2's do not.
        assert_eq!(pieces(&llama, "IT'S"), ["IT", "'S"]);
        assert_eq!(pieces(&smol, "IT'S"), ["IT", "'", "S"]);
        // Llama-3 ignores merges for words already in the vocabulary.
        assert_eq!(pieces(&llama, "xyz"), ["xyz"]);
        assert_eq!(pieces(&smol, "xyz"), ["x", "y", "z"]);
        for tok in [&llama, &smol] {
            assert_eq!(pieces(tok, "hello world"), ["hello", "Ġworld"]);
            let ids = tok.encode_plain("hello world\n\t€", true).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), "hello world\n\t€");
        }
    }

    #[test]
    fn special_and_user_defined_tokens_bos_and_eog() {
        let tok = Tokenizer::from_gguf(&tiny_gguf(Some("llama-bpe"), |_| {})).unwrap();
        // Missing add_bos_token: Llama-3 tokenizers add BOS, but never twice.
        assert!(tok.add_bos());
        let hello = tok.token_id("hello").unwrap();
        assert_eq!(tok.encode("hello", true).unwrap(), [0, hello]);
        assert_eq!(
            tok.encode("<|begin_of_text|>hello", true).unwrap(),
            [0, hello]
        );
        assert_eq!(tok.encode("<|eot_id|>", true).unwrap(), [0, 1]);
        assert!(tok.encode("<|eot_id|>", false).unwrap().len() > 3);
        assert!(tok.encode_plain("he<tool>he", false).unwrap().contains(&2));
        assert!(tok.is_special(1) && !tok.is_special(2) && !tok.is_special(hello));
        assert_eq!(tok.eog_ids(), [1]);
        assert_eq!(
            tok.decode(&[0, hello, 1]).unwrap(),
            "<|begin_of_text|>hello<|eot_id|>"
        );
        assert_eq!(tok.decode_skip_special(&[0, hello, 1]).unwrap(), "hello");
        let no_bos = Tokenizer::from_gguf(&tiny_gguf(Some("llama-bpe"), |w| {
            w.add_bool("tokenizer.ggml.add_bos_token", false).unwrap();
        }))
        .unwrap();
        assert_eq!(no_bos.encode("hello", true).unwrap(), [hello]);
    }

    #[test]
    fn bad_tokenizer_metadata_is_an_error_naming_the_key() {
        type Edit = Box<dyn FnOnce(&mut GgufWriter<'_>)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|w| drop(w.add_str("tokenizer.ggml.model", "t5"))),
                "tokenizer.ggml.model",
            ),
            (
                Box::new(|w| drop(w.add_str("tokenizer.ggml.pre", "qwen2"))),
                "qwen2",
            ),
            (
                Box::new(|w| drop(w.add_str_array("tokenizer.ggml.merges", &["ab"]))),
                "tokenizer.ggml.merges[0]",
            ),
            (
                Box::new(|w| drop(w.add_str_array("tokenizer.ggml.merges", &["q z"]))),
                "BPE",
            ),
            (
                Box::new(|w| drop(w.add_u32("tokenizer.ggml.bos_token_id", 10_000))),
                "bos_token_id",
            ),
            (
                Box::new(|w| drop(w.add_i32_array("tokenizer.ggml.token_type", &[1, 3]))),
                "token_type",
            ),
            (
                Box::new(|w| drop(w.add_str_array::<&str>("tokenizer.ggml.tokens", &[]))),
                "tokenizer.ggml.tokens",
            ),
            (
                Box::new(|w| drop(w.add_f32("tokenizer.ggml.eos_token_id", 1.0))),
                "eos_token_id",
            ),
        ];
        for (edit, needle) in cases {
            let err = Tokenizer::from_gguf(&tiny_gguf(Some("smollm"), edit))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "`{err}` does not mention `{needle}`");
        }
        let missing =
            GgufFile::from_bytes(&GgufWriter::new().to_bytes().unwrap(), "empty.gguf").unwrap();
        assert!(Tokenizer::from_gguf(&missing)
            .unwrap_err()
            .to_string()
            .contains("tokenizer.ggml.model"));
    }

    #[test]
    fn stream_decoder_replaces_invalid_bytes_like_decode() {
        let tok = Tokenizer::from_gguf(&tiny_gguf(Some("smollm"), |_| {})).unwrap();
        // Byte tokens are ids 3 + byte. 0xE2 0x82 0xAC is '€'; 0xFF is never valid; 0xE2 alone is cut.
        let ids: Vec<u32> = [b'a', 0xE2, 0x82, 0xAC, 0xFF, b'b', 0xE2]
            .iter()
            .map(|&b| 3 + u32::from(b))
            .collect();
        let mut s = tok.stream_decoder();
        let got: Vec<String> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
        assert_eq!(got, ["a", "", "", "€", "\u{fffd}", "b", ""]);
        assert_eq!(s.finish(), "\u{fffd}");
        assert_eq!(tok.decode(&ids).unwrap(), "a€\u{fffd}b\u{fffd}");
    }

    #[test]
    fn byte_level_table_is_a_bijection() {
        let mut seen = [false; 256];
        for c in (0..=0x1ff).filter_map(char::from_u32) {
            if let Some(b) = byte_of_char(c) {
                assert!(!seen[b as usize], "byte {b} mapped twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_of_char('Ġ'), Some(b' '));
        assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char('ĉ'), Some(b'\t'));
        assert_eq!(byte_of_char('č'), Some(b'\r'));
        assert_eq!(byte_of_char('a'), Some(b'a'));
        assert_eq!(byte_of_char('€'), None);
    }
}
