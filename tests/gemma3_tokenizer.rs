//! The SentencePiece tokenizer built from the real Gemma 3 270M GGUF, checked against the
//! reference token ids and texts in `tests/fixtures/gemma3/gemma3_public.json`.

use std::path::PathBuf;

use onepass::model::gguf::GgufFile;
use onepass::model::tokenizer::{PreTokenizer, Tokenizer};
use serde_json::Value as Json;

/// The Gemma 3 270M Q4_K_M GGUF file, fetched into the cache on first use like `--model gemma3`.
fn gemma3_path() -> PathBuf {
    let cache = std::env::var_os("ONEPASS_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dirs::cache_dir().expect("cache dir").join("onepass"));
    onepass::model::fetch::resolve_model("gemma3", &cache, false).expect("fetch gemma3")
}

fn tokenizer() -> Tokenizer {
    let path = gemma3_path();
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&file).unwrap()
}

/// The parsed fixture; panics naming the full path when it is missing or bad.
fn fixture() -> Json {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3/gemma3_public.json");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn prompts() -> Vec<Json> {
    fixture()["prompts"].as_array().unwrap().clone()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

/// The text of `ids` as a stream decoder hands it out, with every piece checked to be free of
/// U+FFFD (the texts here are valid UTF-8 throughout).
fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut stream = tok.stream_decoder();
    let mut text = String::new();
    for &id in ids {
        let piece = stream.push(id).unwrap();
        assert!(!piece.contains('\u{fffd}'), "{piece:?} after id {id}");
        text.push_str(&piece);
    }
    text + &stream.finish()
}

#[test]
fn fixture_prompts_tokenize_exactly_and_round_trip() {
    let tok = tokenizer();
    let prompts = prompts();
    assert_eq!(prompts.len(), 6);
    for p in &prompts {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want = ids(&p["prompt_ids"]);
        assert_eq!(p["bos_added"], true, "prompt {name}");
        assert_eq!(want.len() as u64, p["n_prompt_tokens"].as_u64().unwrap());
        // No prompt spells a control token, so special parsing changes nothing.
        assert_eq!(tok.encode(text, false).unwrap(), want, "prompt {name}");
        assert_eq!(tok.encode(text, true).unwrap(), want, "prompt {name}");
        // The fixture writes the pieces with `▁` for a space; the GGUF stores the user-defined
        // runs of spaces with literal spaces.
        let strs: Vec<String> = want
            .iter()
            .map(|&id| tok.token_str(id).unwrap().replace(' ', "▁"))
            .collect();
        let want_strs: Vec<&str> = p["prompt_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(strs, want_strs, "prompt {name}");
        assert_eq!(tok.decode(&want).unwrap(), format!("<bos>{text}"));
        assert_eq!(tok.decode_skip_special(&want).unwrap(), text);
        assert_eq!(streamed(&tok, &want[1..]), text, "prompt {name}");

        // The greedy continuation decodes to the recorded text, special tokens kept.
        let greedy = &p["greedy"];
        let greedy_ids = ids(&greedy["ids"]);
        let greedy_text = greedy["text"].as_str().unwrap();
        assert_eq!(
            tok.decode(&greedy_ids).unwrap(),
            greedy_text,
            "prompt {name}"
        );
        assert_eq!(streamed(&tok, &greedy_ids), greedy_text, "prompt {name}");
    }
}

#[test]
fn special_ids_and_settings_from_the_file() {
    let tok = tokenizer();
    let fx = fixture();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::SentencePiece);
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(2), Some(1)));
    assert!(tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    let mut eog: Vec<u32> = fx["end_of_generation_ids"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    eog.sort_unstable();
    assert_eq!(tok.eog_ids(), eog);
    assert_eq!(tok.eog_ids(), [1, 106]);
    for (text, id) in fx["tokenizer"]["special_ids_of_note"].as_object().unwrap() {
        let id = id.as_u64().unwrap() as u32;
        assert_eq!(tok.token_id(text), Some(id), "{text}");
        assert_eq!(tok.token_str(id), Some(text.as_str()));
    }
    assert!(tok.is_special(105) && tok.is_special(106) && !tok.is_special(107));
    // Turn markers are parsed only with special parsing on.
    let text = "<start_of_turn>user\nHi<end_of_turn>\n";
    let parsed = tok.encode(text, true).unwrap();
    assert_eq!(parsed[..3], [2, 105, tok.token_id("user").unwrap()]);
    assert_eq!(parsed[parsed.len() - 2..], [106, 107]);
    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&105) && !plain.contains(&106), "{plain:?}");
    assert_eq!(tok.decode_skip_special(&plain).unwrap(), text);
    assert!(tok.decode(&[262_144]).is_err());
}

#[test]
fn whitespace_runs_digits_and_byte_fallback() {
    let tok = tokenizer();
    let enc = |t: &str| tok.encode_plain(t, false).unwrap();
    // Runs of spaces are one user-defined piece each, up to 31 (ids 138..=167 for 2..=31).
    assert_eq!(enc("  "), [138]);
    assert_eq!(enc(&" ".repeat(31)), [167]);
    assert_eq!(enc(&" ".repeat(40)), [167, 145]);
    // Newlines (107.. for 1..) and tabs (255968.. for 1..).
    assert_eq!(enc("\n\n\n"), [109]);
    assert_eq!(enc("\t\t"), [255969]);
    // Every ASCII digit is a token of its own.
    let digits = enc("9876543210");
    assert_eq!(digits.len(), 10);
    for (&id, d) in digits.iter().zip("9876543210".chars()) {
        assert_eq!(tok.token_str(id), Some(d.to_string().as_str()));
    }
    // A character outside the vocabulary becomes its UTF-8 bytes.
    let rare = "\u{378}";
    let bytes: Vec<String> = enc(rare)
        .iter()
        .map(|&id| tok.token_str(id).unwrap().to_string())
        .collect();
    assert_eq!(bytes, ["<0xCD>", "<0xB8>"]);
    for text in [
        "fn main() {\n\tlet x = 1;\n        return;\n}\n",
        "東京の天気 🚀🔥👩‍💻 ok \u{378}\u{10ffff}",
        "a\r\nb\u{0}c",
    ] {
        let ids = enc(text);
        assert_eq!(tok.decode(&ids).unwrap(), text);
        assert_eq!(streamed(&tok, &ids), text);
    }
}
