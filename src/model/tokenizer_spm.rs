//! The SentencePiece-style tokenizer of GGUF files with `tokenizer.ggml.model = "llama"` (Llama 2,
//! Gemma and their kin): BPE over the vocabulary's pieces, merged in the order of their scores,
//! with byte fallback. [`crate::model::tokenizer::Tokenizer`] uses it for such files.
//!
//! Encoding a text does what SentencePiece's BPE model does:
//! 1. With special parsing on, control tokens written in the text (`<start_of_turn>`) are cut out
//!    first, the longest at the leftmost position, each becoming its own id.
//! 2. Every stretch of text between them gets a space in front when the file says
//!    `tokenizer.ggml.add_space_prefix = true` (SentencePiece's dummy prefix), and every space
//!    becomes `▁` (U+2581).
//! 3. User-defined pieces (token_type 4, such as Gemma's runs of spaces, tabs and newlines, which
//!    the GGUF stores with literal spaces) are matched the same way, leftmost-longest, in that
//!    text; each is one token and never merges with its neighbours.
//! 4. What lies between them is split into characters, and adjacent symbols are merged while
//!    their concatenation is a piece of the vocabulary: always the pair whose merged piece has the
//!    highest score, the leftmost pair on ties.
//! 5. A symbol left that is not in the vocabulary (a character it lacks) becomes the `<0xXX>`
//!    byte tokens of its UTF-8 bytes, or the unknown token where byte tokens are missing. A merged
//!    piece of type unused (5) is split back into the two symbols it was made of.
//!
//! Decoding: `▁` is a space, a byte token is its byte, control and unknown tokens are their text.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;

/// The character SentencePiece writes for a space.
const SPACE_PIECE: char = '\u{2581}';

/// GGUF token types, the same numbers as SentencePiece's piece types (0: not given).
const TYPE_UNDEFINED: i32 = 0;
const TYPE_NORMAL: i32 = 1;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;
const TYPE_BYTE: i32 = 6;

/// No symbol: the end of the list of symbols.
const NONE: usize = usize::MAX;

/// Whether a token of this type is special in the SentencePiece sense: control and unknown
/// tokens, which merges never form and which decode to their text.
pub(crate) fn is_special_type(token_type: i32) -> bool {
    token_type == TYPE_CONTROL || token_type == TYPE_UNKNOWN
}

/// What SentencePiece encoding and decoding need beyond the token strings.
#[derive(Clone)]
pub(crate) struct SpmModel {
    /// Pieces that merges may form (normal, user-defined, unused) by their text with spaces
    /// written as `▁`; the first id of a text wins.
    pieces: HashMap<Box<str>, u32>,
    /// Control, unknown and byte tokens by their exact text; the first id of a text wins.
    reserved: HashMap<Box<str>, u32>,
    /// The score of every token.
    scores: Vec<f32>,
    /// The token_type of every token.
    types: Vec<i32>,
    /// The byte token of each byte value, where the vocabulary has one.
    byte_ids: [Option<u32>; 256],
    /// The token for a character with neither a piece nor byte tokens.
    unk: Option<u32>,
    /// User-defined pieces, spaces written as `▁`.
    user_defined: Trie,
    /// Control and unknown tokens, as written in a text.
    control: Trie,
    /// Whether every stretch of text gets a space in front.
    add_space_prefix: bool,
}

impl SpmModel {
    /// Builds the model from the token strings and types already read from `gguf` and its
    /// `tokenizer.ggml.scores` and `tokenizer.ggml.add_space_prefix` (true when missing).
    /// `unk` is `tokenizer.ggml.unknown_token_id`, if given and inside the vocabulary.
    pub(crate) fn from_gguf(
        gguf: &GgufFile,
        tokens: &[String],
        types: &[i32],
        unk: Option<u32>,
    ) -> Result<SpmModel> {
        let scores = gguf.get_f32_array("tokenizer.ggml.scores")?;
        if scores.len() != tokens.len() {
            return Err(gguf.err(format!(
                "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                scores.len(),
                tokens.len()
            )));
        }
        if let Some(i) = scores.iter().position(|s| s.is_nan()) {
            return Err(gguf.err(format!("tokenizer.ggml.scores[{i}] is NaN")));
        }
        let add_space_prefix = gguf
            .opt_bool("tokenizer.ggml.add_space_prefix")?
            .unwrap_or(true);
        let mut model = SpmModel {
            pieces: HashMap::with_capacity(tokens.len()),
            reserved: HashMap::new(),
            scores,
            types: types.to_vec(),
            byte_ids: [None; 256],
            unk,
            user_defined: Trie::default(),
            control: Trie::default(),
            add_space_prefix,
        };
        for (id, (text, &ty)) in tokens.iter().zip(types).enumerate() {
            let id = id as u32;
            match ty {
                TYPE_UNDEFINED | TYPE_NORMAL | TYPE_USER_DEFINED | TYPE_UNUSED => {
                    let piece: Box<str> = if text.contains(' ') {
                        text.replace(' ', "\u{2581}").into()
                    } else {
                        text.as_str().into()
                    };
                    if ty == TYPE_USER_DEFINED {
                        model.user_defined.insert(&piece, id);
                    }
                    model.pieces.entry(piece).or_insert(id);
                }
                TYPE_UNKNOWN | TYPE_CONTROL => {
                    model.control.insert(text, id);
                    model.reserved.entry(text.as_str().into()).or_insert(id);
                    if ty == TYPE_UNKNOWN {
                        model.unk.get_or_insert(id);
                    }
                }
                TYPE_BYTE => {
                    let byte = byte_of_piece(text).ok_or_else(|| {
                        gguf.err(format!(
                            "tokenizer.ggml.tokens[{id}] = `{text}` is a byte token \
                             (token_type 6) but not of the form <0xXX>"
                        ))
                    })?;
                    model.byte_ids[usize::from(byte)].get_or_insert(id);
                    model.reserved.entry(text.as_str().into()).or_insert(id);
                }
                other => {
                    return Err(gguf.err(format!(
                        "tokenizer.ggml.token_type[{id}] = {other} is not a SentencePiece \
                         token type (0 to 6)"
                    )))
                }
            }
        }
        Ok(model)
    }

    /// Whether a space is put in front of the text (`tokenizer.ggml.add_space_prefix`).
    pub(crate) fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Appends the ids of `text`; with `parse_special`, control tokens written in the text become
    /// their ids, without they are ordinary text.
    pub(crate) fn encode(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) -> Result<()> {
        let mut start = 0;
        let mut at = 0;
        while parse_special && at < text.len() {
            if let Some((len, id)) = self.control.longest(&text.as_bytes()[at..]) {
                self.encode_stretch(&text[start..at], out)?;
                out.push(id);
                at += len;
                start = at;
            } else {
                at += text[at..].chars().next().map_or(1, char::len_utf8);
            }
        }
        self.encode_stretch(&text[start..], out)
    }

    /// Encodes text that holds no control token: the space prefix, spaces as `▁`, user-defined
    /// pieces, then BPE on what lies between them.
    fn encode_stretch(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let mut norm = String::with_capacity(text.len() + 3);
        if self.add_space_prefix {
            norm.push(SPACE_PIECE);
        }
        norm.extend(text.chars().map(|c| if c == ' ' { SPACE_PIECE } else { c }));
        let mut run = 0;
        let mut at = 0;
        while at < norm.len() {
            if let Some((len, id)) = self.user_defined.longest(&norm.as_bytes()[at..]) {
                self.merge(&norm[run..at], out)?;
                out.push(id);
                at += len;
                run = at;
            } else {
                at += norm[at..].chars().next().map_or(1, char::len_utf8);
            }
        }
        self.merge(&norm[run..], out)
    }

    /// The BPE proper: `text` as characters, merged pair by pair (best score first, the leftmost
    /// on ties) while the merged piece is in the vocabulary; then the ids of the symbols left.
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Symbol {
                start,
                end: start + c.len_utf8(),
                prev: i.checked_sub(1).unwrap_or(NONE),
                next: i + 1,
                node: i,
                merged_away: false,
            })
            .collect();
        let Some(last) = symbols.last_mut() else {
            return Ok(());
        };
        last.next = NONE;
        let mut nodes: Vec<Node> = symbols
            .iter()
            .map(|s| Node {
                start: s.start,
                end: s.end,
                parts: None,
            })
            .collect();
        let mut queue = BinaryHeap::new();
        for left in 1..symbols.len() {
            self.push_pair(text, &symbols, left - 1, left, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (pair.left, pair.right);
            let (left, right) = (&symbols[l], &symbols[r]);
            // A pair whose symbols changed since it was queued is stale.
            if left.merged_away
                || right.merged_away
                || left.next != r
                || right.end - left.start != pair.len
            {
                continue;
            }
            let node = Node {
                start: left.start,
                end: right.end,
                parts: Some((left.node, right.node)),
            };
            let next = right.next;
            symbols[r].merged_away = true;
            let left = &mut symbols[l];
            left.end = node.end;
            left.next = next;
            left.node = nodes.len();
            nodes.push(node);
            let prev = left.prev;
            if next != NONE {
                symbols[next].prev = l;
                self.push_pair(text, &symbols, l, next, &mut queue);
            }
            if prev != NONE {
                self.push_pair(text, &symbols, prev, l, &mut queue);
            }
        }
        // The first symbol is never merged away: merges keep the left one.
        let mut at = 0;
        while at != NONE {
            self.emit(text, &nodes, symbols[at].node, out)?;
            at = symbols[at].next;
        }
        Ok(())
    }

    /// Queues the merge of two adjacent symbols if their concatenation is a piece.
    fn push_pair(
        &self,
        text: &str,
        symbols: &[Symbol],
        l: usize,
        r: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let piece = &text[symbols[l].start..symbols[r].end];
        if let Some(&id) = self.pieces.get(piece) {
            queue.push(Pair {
                score: self.scores[id as usize],
                left: l,
                right: r,
                len: piece.len(),
            });
        }
    }

    /// Appends the ids of one final symbol: its piece, the two halves of an unused piece, or for
    /// a piece the vocabulary lacks its byte tokens (the unknown token where the vocabulary has
    /// no byte tokens for it).
    fn emit(&self, text: &str, nodes: &[Node], node: usize, out: &mut Vec<u32>) -> Result<()> {
        let n = &nodes[node];
        let piece = &text[n.start..n.end];
        match self.pieces.get(piece) {
            Some(&id) => match (self.types[id as usize], n.parts) {
                (TYPE_UNUSED, Some((a, b))) => {
                    self.emit(text, nodes, a, out)?;
                    self.emit(text, nodes, b, out)?;
                }
                _ => out.push(id),
            },
            None if piece
                .bytes()
                .all(|b| self.byte_ids[usize::from(b)].is_some()) =>
            {
                out.extend(piece.bytes().filter_map(|b| self.byte_ids[usize::from(b)]));
            }
            None => out.push(self.unk.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "`{piece}` is not in the vocabulary, which has neither byte tokens for it \
                     nor an unknown token"
                ))
            })?),
        }
        Ok(())
    }

    /// Appends the bytes a token that is not special stands for: its byte for a byte token, else
    /// its text with `▁` as a space.
    pub(crate) fn push_piece_bytes(&self, id: u32, text: &str, out: &mut Vec<u8>) {
        if self.types.get(id as usize) == Some(&TYPE_BYTE) {
            if let Some(b) = byte_of_piece(text) {
                out.push(b);
                return;
            }
        }
        for c in text.chars() {
            match c {
                SPACE_PIECE => out.push(b' '),
                c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
    }

    /// The id of a vocabulary string (exactly as the GGUF stores it), the first if several.
    pub(crate) fn token_id(&self, tokens: &[String], text: &str) -> Option<u32> {
        let piece = self
            .pieces
            .get(text.replace(' ', "\u{2581}").as_str())
            .copied();
        let reserved = self.reserved.get(text).copied();
        match (piece, reserved) {
            (Some(p), Some(r)) => Some(p.min(r)),
            (Some(p), None) if tokens[p as usize] == text => Some(p),
            (Some(_), None) => tokens.iter().position(|t| t == text).map(|i| i as u32),
            (None, r) => r,
        }
    }
}

/// The byte a `<0xXX>` piece stands for.
fn byte_of_piece(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// One symbol of the text being merged: a span of it, linked to its neighbours.
struct Symbol {
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
    /// The node recording how the symbol was made.
    node: usize,
    merged_away: bool,
}

/// A span of the text and, when it was made by a merge, the nodes of its two halves.
struct Node {
    start: usize,
    end: usize,
    parts: Option<(usize, usize)>,
}

/// A queued merge of the symbols `left` and `right`, made when together they spanned `len` bytes.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    /// The better pair is the greater: higher score, then the one further left.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// A byte trie of token texts, for the longest one a text starts with.
#[derive(Clone, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Clone, Default)]
struct TrieNode {
    /// The next byte and the node it leads to.
    edges: Vec<(u8, u32)>,
    /// The token whose text ends here (the first one added).
    id: Option<u32>,
}

impl Trie {
    /// Adds a token text; empty texts are left out (they would match everywhere).
    fn insert(&mut self, key: &str, id: u32) {
        if key.is_empty() {
            return;
        }
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut at = 0;
        for &b in key.as_bytes() {
            at = match self.nodes[at].edges.iter().find(|e| e.0 == b) {
                Some(&(_, n)) => n as usize,
                None => {
                    let n = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    self.nodes[at].edges.push((b, n as u32));
                    n
                }
            };
        }
        self.nodes[at].id.get_or_insert(id);
    }

    /// The longest text that `text` starts with: its length in bytes and its token.
    fn longest(&self, text: &[u8]) -> Option<(usize, u32)> {
        let mut best = None;
        let mut at = 0;
        if self.nodes.is_empty() {
            return None;
        }
        for (i, &b) in text.iter().enumerate() {
            match self.nodes[at].edges.iter().find(|e| e.0 == b) {
                Some(&(_, n)) => at = n as usize,
                None => break,
            }
            if let Some(id) = self.nodes[at].id {
                best = Some((i + 1, id));
            }
        }
        best
    }
}

#[cfg(test)]
#[path = "tokenizer_spm_tests.rs"]
mod tests;
