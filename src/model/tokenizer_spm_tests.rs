//! The SentencePiece tokenizer on small vocabularies written with the crate's GGUF writer.

use crate::model::gguf::GgufFile;
use crate::model::gguf_write::GgufWriter;
use crate::model::tokenizer::{PreTokenizer, Tokenizer};

/// Byte tokens start here: `<0xNN>` is id `BYTES + 0xNN`.
const BYTES: u32 = 11;

/// One vocabulary entry: text, score, token_type.
type Entry = (String, f32, i32);

/// A small vocabulary: control tokens (`<unk>` as type 2), user-defined whitespace runs, the 256
/// byte tokens, then characters and merged pieces with their scores (higher merges first).
fn entries(with_bytes: bool) -> Vec<Entry> {
    let mut e: Vec<Entry> = [
        ("<pad>", 3),
        ("<eos>", 3),
        ("<bos>", 3),
        ("<unk>", 2),
        ("<start_of_turn>", 3),
        ("<end_of_turn>", 3),
        ("\n", 4),
        ("\n\n", 4),
        ("  ", 4),
        ("    ", 4),
        ("\t", 4),
    ]
    .iter()
    .map(|&(t, ty)| (t.to_string(), 0.0, ty))
    .collect();
    if with_bytes {
        e.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
    }
    let merged: [(&str, f32, i32); 22] = [
        // A tie (`ab`, `bc`), and `cd` better than both.
        ("ab", -1.0, 1),
        ("bc", -1.0, 1),
        ("cd", -0.5, 1),
        // `yz` before `xy`, though `xy` is further left.
        ("xy", -2.0, 1),
        ("yz", -1.5, 1),
        // An unused piece, and a normal one made from it.
        ("ef", -0.1, 5),
        ("efg", -0.4, 1),
        ("he", -3.0, 1),
        ("ll", -3.1, 1),
        ("hell", -3.2, 1),
        ("hello", -3.3, 1),
        ("\u{2581}hello", -3.4, 1),
        ("\u{2581}w", -4.0, 1),
        ("or", -4.1, 1),
        ("\u{2581}wor", -4.2, 1),
        ("ld", -4.3, 1),
        ("\u{2581}world", -4.4, 1),
        ("\u{2581}b", -5.0, 1),
        ("é", -6.0, 1),
        // Pieces that lead up to the text of `<unk>`, which merges must not form.
        ("<u", -8.0, 1),
        ("<un", -8.1, 1),
        ("<unk", -8.2, 1),
    ];
    e.extend(merged.iter().map(|&(t, s, ty)| (t.to_string(), s, ty)));
    let chars = "\u{2581}abcdefghlorwxyz";
    e.extend(
        chars
            .chars()
            .enumerate()
            .map(|(i, c)| (c.to_string(), -100.0 - i as f32, 1)),
    );
    // A control token that begins with the text of another.
    e.push(("<end_of_turn>x".to_string(), 0.0, 3));
    e
}

/// The GGUF of `entries` (scores left out when `scores` is false), with `edit` applied last.
fn gguf(entries: &[Entry], scores: bool, edit: impl FnOnce(&mut GgufWriter<'_>)) -> GgufFile {
    let mut w = GgufWriter::new();
    let texts: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    w.add_str("tokenizer.ggml.model", "llama").unwrap();
    w.add_str("tokenizer.ggml.pre", "default").unwrap();
    w.add_str_array("tokenizer.ggml.tokens", &texts).unwrap();
    if scores {
        let s: Vec<f32> = entries.iter().map(|e| e.1).collect();
        w.add_f32_array("tokenizer.ggml.scores", &s).unwrap();
    }
    let t: Vec<i32> = entries.iter().map(|e| e.2).collect();
    w.add_i32_array("tokenizer.ggml.token_type", &t).unwrap();
    w.add_u32("tokenizer.ggml.bos_token_id", 2).unwrap();
    w.add_u32("tokenizer.ggml.eos_token_id", 1).unwrap();
    w.add_u32("tokenizer.ggml.unknown_token_id", 3).unwrap();
    w.add_bool("tokenizer.ggml.add_space_prefix", false)
        .unwrap();
    edit(&mut w);
    GgufFile::from_bytes(&w.to_bytes().unwrap(), "spm.gguf").unwrap()
}

fn tokenizer(edit: impl FnOnce(&mut GgufWriter<'_>)) -> Tokenizer {
    Tokenizer::from_gguf(&gguf(&entries(true), true, edit)).unwrap()
}

/// The vocabulary strings of the ids of `text`, no BOS, special tokens parsed.
fn pieces(tok: &Tokenizer, text: &str) -> Vec<String> {
    tok.encode_plain(text, true)
        .unwrap()
        .iter()
        .map(|&id| tok.token_str(id).unwrap().to_string())
        .collect()
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_id(text)
        .unwrap_or_else(|| panic!("`{text}` is in the vocabulary"))
}

#[test]
fn merges_go_by_score_with_ties_to_the_leftmost() {
    let tok = tokenizer(|_| {});
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::SentencePiece);
    // `ab` and `bc` score the same: the leftmost wins.
    assert_eq!(pieces(&tok, "abc"), ["ab", "c"]);
    // `cd` scores best, then `ab`.
    assert_eq!(pieces(&tok, "abcd"), ["ab", "cd"]);
    assert_eq!(pieces(&tok, "bcd"), ["b", "cd"]);
    // Best score first, not longest match from the left.
    assert_eq!(pieces(&tok, "xyz"), ["x", "yz"]);
    assert_eq!(pieces(&tok, "xyxy"), ["xy", "xy"]);
    // Merges build on merges, across what a space-splitting tokenizer would call words.
    assert_eq!(pieces(&tok, "hello world"), ["hello", "▁world"]);
    assert_eq!(pieces(&tok, "hellold"), ["hello", "ld"]);
}

#[test]
fn unused_pieces_are_split_back() {
    let tok = tokenizer(|_| {});
    assert_eq!(pieces(&tok, "ef"), ["e", "f"]);
    assert_eq!(pieces(&tok, "efe"), ["e", "f", "e"]);
    // A normal piece made through an unused one stays whole.
    assert_eq!(pieces(&tok, "efg"), ["efg"]);
}

#[test]
fn characters_outside_the_vocabulary_fall_back_to_bytes() {
    let tok = tokenizer(|_| {});
    let byte = |b: u8| BYTES + u32::from(b);
    let (a, e_acute) = (id(&tok, "a"), id(&tok, "é"));
    // `é` is a piece; `è` (C3 A8) is not.
    assert_eq!(
        tok.encode_plain("aéè", false).unwrap(),
        [a, e_acute, byte(0xC3), byte(0xA8)]
    );
    // A four-byte emoji, and CJK between pieces.
    let rocket: Vec<u32> = "🚀".bytes().map(byte).collect();
    let mut want = vec![a];
    want.extend(&rocket);
    want.extend("東".bytes().map(byte));
    want.push(a);
    assert_eq!(tok.encode_plain("a🚀東a", false).unwrap(), want);
    for text in ["aéè", "a🚀東a", "👩\u{200d}💻 ok\t\n", "<0x41>"] {
        let ids = tok.encode_plain(text, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    // A byte token decodes to its byte, not its text.
    assert_eq!(tok.decode(&[byte(b'A')]).unwrap(), "A");
    assert_eq!(tok.token_id("<0x41>"), Some(byte(b'A')));
}

#[test]
fn without_byte_tokens_an_unknown_character_is_the_unknown_token() {
    let tok = Tokenizer::from_gguf(&gguf(&entries(false), true, |_| {})).unwrap();
    let a = id(&tok, "a");
    assert_eq!(tok.encode_plain("aèa🚀", false).unwrap(), [a, 3, a, 3]);
    // With neither bytes nor `<unk>`, encoding such text is an error, not a panic.
    let mut no_unk = entries(false);
    no_unk[3].2 = 3;
    let tok = Tokenizer::from_gguf(&gguf(&no_unk, true, |w| {
        w.add_u32("tokenizer.ggml.unknown_token_id", 0).unwrap();
    }));
    // `<pad>` (id 0) is then the unknown token; without the key there is none.
    assert_eq!(tok.unwrap().encode_plain("è", false).unwrap(), [0]);
    let mut w = GgufWriter::new();
    let texts: Vec<&str> = no_unk.iter().map(|e| e.0.as_str()).collect();
    let scores: Vec<f32> = no_unk.iter().map(|e| e.1).collect();
    let types: Vec<i32> = no_unk.iter().map(|e| e.2).collect();
    w.add_str("tokenizer.ggml.model", "llama").unwrap();
    w.add_str_array("tokenizer.ggml.tokens", &texts).unwrap();
    w.add_f32_array("tokenizer.ggml.scores", &scores).unwrap();
    w.add_i32_array("tokenizer.ggml.token_type", &types)
        .unwrap();
    let file = GgufFile::from_bytes(&w.to_bytes().unwrap(), "bare.gguf").unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let err = tok.encode_plain("aè", false).unwrap_err().to_string();
    assert!(err.contains("`è` is not in the vocabulary"), "{err}");
    // The defaults of a file that says nothing: BOS added, space prefix on, no EOS.
    assert!(tok.add_bos() && tok.add_space_prefix() && !tok.add_eos());
}

#[test]
fn user_defined_runs_match_longest_first_and_never_merge() {
    let tok = tokenizer(|_| {});
    let (two, four, nl, nl2, tab) = (8, 9, 6, 7, 10);
    let space = id(&tok, "▁");
    let b = id(&tok, "b");
    // Stored with literal spaces, matched where the text has spaces.
    assert_eq!(tok.token_str(two), Some("  "));
    assert_eq!(tok.token_id("  "), Some(two));
    assert_eq!(tok.encode_plain("  b", false).unwrap(), [two, b]);
    // A single space is the normal piece `▁`, which merges.
    assert_eq!(pieces(&tok, " b"), ["▁b"]);
    // Longest first: seven spaces are four, two and one.
    assert_eq!(
        tok.encode_plain("       b", false).unwrap(),
        [four, two, id(&tok, "▁b")]
    );
    assert_eq!(tok.encode_plain("\n\n\n\t", false).unwrap(), [nl2, nl, tab]);
    assert_eq!(
        tok.encode_plain("a\n  a", false).unwrap(),
        [id(&tok, "a"), nl, two, id(&tok, "a")]
    );
    assert_eq!(tok.encode_plain("     ", false).unwrap(), [four, space]);
    for text in ["  b", "       b", "\n\n\n\t", "a\n  a", "     "] {
        let ids = tok.encode_plain(text, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    assert!(!tok.is_special(two) && !tok.is_special(nl));
}

#[test]
fn control_tokens_are_parsed_only_when_asked() {
    let tok = tokenizer(|_| {});
    let hello = id(&tok, "hello");
    let text = "<start_of_turn>hello<end_of_turn>\n";
    assert_eq!(tok.encode_plain(text, true).unwrap(), [4, hello, 5, 6]);
    let plain = tok.encode_plain(text, false).unwrap();
    assert!(!plain.contains(&4) && !plain.contains(&5), "{plain:?}");
    assert_eq!(tok.decode(&plain).unwrap(), text);
    // Merges never form a control token, even where the pieces leading up to it exist.
    assert_eq!(
        tok.encode_plain("<unk>", false).unwrap(),
        [id(&tok, "<unk"), BYTES + u32::from(b'>')]
    );
    assert_eq!(tok.encode_plain("<unk>", true).unwrap(), [3]);
    // The longest control token at a position wins over a shorter one.
    assert_eq!(pieces(&tok, "<end_of_turn>xy"), ["<end_of_turn>x", "y"]);
    assert_eq!(pieces(&tok, "<end_of_turn>y"), ["<end_of_turn>", "y"]);
    assert!(tok.is_special(3) && tok.is_special(5) && !tok.is_special(hello));
    assert_eq!(tok.eog_ids(), [1, 5]);
    assert_eq!(
        tok.decode(&[2, hello, 5]).unwrap(),
        "<bos>hello<end_of_turn>"
    );
    assert_eq!(tok.decode_skip_special(&[2, hello, 5]).unwrap(), "hello");
    // BOS in front unless already there; EOS only when the file asks.
    assert_eq!(tok.encode("hello", true).unwrap(), [2, hello]);
    assert_eq!(tok.encode("<bos>hello", true).unwrap(), [2, hello]);
    let eos = tokenizer(|w| {
        w.add_bool("tokenizer.ggml.add_bos_token", false).unwrap();
        w.add_bool("tokenizer.ggml.add_eos_token", true).unwrap();
    });
    assert!(!eos.add_bos() && eos.add_eos());
    assert_eq!(eos.encode("hello", true).unwrap(), [hello, 1]);
}

#[test]
fn space_prefix_both_ways() {
    let off = tokenizer(|_| {});
    let on = tokenizer(|w| {
        w.add_bool("tokenizer.ggml.add_space_prefix", true).unwrap();
    });
    assert!(on.add_space_prefix() && !off.add_space_prefix());
    assert_eq!(pieces(&off, "hello world"), ["hello", "▁world"]);
    assert_eq!(pieces(&on, "hello world"), ["▁hello", "▁world"]);
    // Every stretch of text gets it: at the start and after each control token.
    assert_eq!(
        pieces(&on, "hello<end_of_turn>hello"),
        ["▁hello", "<end_of_turn>", "▁hello"]
    );
    assert_eq!(pieces(&on, "<start_of_turn>"), ["<start_of_turn>"]);
    assert!(on.encode_plain("", true).unwrap().is_empty());
    // The prefix comes before the user-defined runs are matched: one space more.
    assert_eq!(on.encode_plain(" b", false).unwrap(), [8, id(&on, "b")]);
    let ids = on.encode("hello world", true).unwrap();
    assert_eq!(on.decode(&ids).unwrap(), "<bos> hello world");
}

#[test]
fn stream_decoding_holds_back_split_characters() {
    let tok = tokenizer(|_| {});
    let ids = tok.encode_plain("a🚀é\n", false).unwrap();
    let mut stream = tok.stream_decoder();
    let got: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(got, ["a", "", "", "", "🚀", "é", "\n"]);
    assert_eq!(stream.finish(), "");
    // Cut off inside a character: U+FFFD when the stream ends.
    let mut cut = tok.stream_decoder();
    assert_eq!(cut.push(BYTES + 0xF0).unwrap(), "");
    assert_eq!(cut.push(BYTES + 0x9F).unwrap(), "");
    assert_eq!(cut.finish(), "\u{fffd}");
    let mut skipping = tok.stream_decoder().skip_special(true);
    let shown: String = [2, id(&tok, "▁world"), 1]
        .iter()
        .map(|&id| skipping.push(id).unwrap())
        .collect();
    assert_eq!(shown, " world");
}

#[test]
fn bad_vocabularies_are_errors_naming_the_problem() {
    let check = |file: GgufFile, needle: &str| {
        let err = Tokenizer::from_gguf(&file).unwrap_err().to_string();
        assert!(err.contains(needle), "`{err}` does not mention `{needle}`");
    };
    check(gguf(&entries(true), false, |_| {}), "tokenizer.ggml.scores");
    check(
        gguf(&entries(true), true, |w| {
            w.add_f32_array("tokenizer.ggml.scores", &[0.0; 3]).unwrap();
        }),
        "tokenizer.ggml.scores has 3 entries",
    );
    let mut nan = entries(true);
    nan[300].1 = f32::NAN;
    check(
        gguf(&nan, true, |_| {}),
        "tokenizer.ggml.scores[300] is NaN",
    );
    let mut bad_byte = entries(true);
    bad_byte[BYTES as usize + 1].0 = "<0xZZ>".into();
    check(gguf(&bad_byte, true, |_| {}), "<0xZZ>");
    let mut bad_type = entries(true);
    bad_type[7].2 = 9;
    check(gguf(&bad_type, true, |_| {}), "token_type[7] = 9");
    check(
        gguf(&entries(true), true, |w| {
            w.add_u32("tokenizer.ggml.unknown_token_id", 100_000)
                .unwrap();
        }),
        "unknown_token_id",
    );
    check(
        gguf(&entries(true), true, |w| {
            w.add_i32_array("tokenizer.ggml.token_type", &[1; 4])
                .unwrap();
        }),
        "token_type has 4 entries",
    );
    check(
        gguf(&entries(true), true, |w| {
            w.add_str("tokenizer.ggml.add_space_prefix", "yes").unwrap();
        }),
        "add_space_prefix",
    );
}
