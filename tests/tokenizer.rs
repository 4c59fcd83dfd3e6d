//! The tokenizer and chat template built from the real default model's GGUF metadata, checked
//! against the reference token ids and texts in `tests/fixtures/smollm2/`.

mod smollm2_fixtures;

use onepass::model::chat::{ChatMessage, ChatTemplate};
use onepass::model::fetch;
use onepass::model::gguf::GgufFile;
use onepass::model::tokenizer::{PreTokenizer, Tokenizer};
use serde_json::Value as Json;

fn gguf() -> GgufFile {
    let cache = fetch::default_cache_dir().unwrap();
    GgufFile::open(fetch::default_model(&cache, false).unwrap()).unwrap()
}

fn prompts() -> Vec<Json> {
    smollm2_fixtures::json()["prompts"]
        .as_array()
        .unwrap()
        .clone()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn fixture_prompts_tokenize_exactly_and_round_trip() {
    let tok = Tokenizer::from_gguf(&gguf()).unwrap();
    let prompts = prompts();
    assert_eq!(prompts.len(), 6);
    for p in &prompts {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want = ids(&p["prompt_ids"]);
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, want, "prompt {name}");
        let strs: Vec<&str> = got.iter().map(|&id| tok.token_str(id).unwrap()).collect();
        let want_strs: Vec<&str> = p["prompt_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(strs, want_strs, "prompt {name}");
        assert_eq!(tok.decode(&got).unwrap(), text, "prompt {name}");

        // Streaming gives the same text, in pieces that are each valid UTF-8 on their own.
        let mut stream = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &got {
            streamed.push_str(&stream.push(id).unwrap());
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, text, "prompt {name}");

        // The greedy continuation decodes to the recorded text (special tokens kept).
        let greedy = &p["greedy"];
        assert_eq!(
            tok.decode(&ids(&greedy["ids"])).unwrap(),
            greedy["text"].as_str().unwrap(),
            "prompt {name}"
        );
    }
}

#[test]
fn ecosystem_example_special_tokens_and_ids() {
    let tok = Tokenizer::from_gguf(&gguf()).unwrap();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::SmolLm);
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.add_bos()),
        (Some(1), Some(2), false)
    );
    assert_eq!(tok.eog_ids(), [0, 2]);
    assert!(tok.is_eog(2) && tok.is_eog(0) && !tok.is_eog(1));
    let text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    let want = [
        1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198,
    ];
    assert_eq!(tok.encode(text, true).unwrap(), want);
    // Without special-token parsing the markers are ordinary text: no id 1 or 2 appears.
    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert_eq!(tok.decode(&plain).unwrap(), text);
    assert_eq!(
        tok.decode_skip_special(&want).unwrap(),
        "user\nWhat is 2+2?\nassistant\n"
    );
    // Digits are split one by one.
    let digits = tok.encode("12345", true).unwrap();
    assert_eq!(digits.len(), 5);
    assert!(tok.decode(&[49152]).is_err());
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let tok = Tokenizer::from_gguf(&gguf()).unwrap();
    // Emoji and CJK often span several byte-level tokens; no piece may contain U+FFFD.
    let text = "東京の天気 🚀🔥👩‍💻 ok";
    let ids = tok.encode(text, true).unwrap();
    let mut stream = tok.stream_decoder();
    let pieces: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    assert!(
        pieces.iter().any(String::is_empty),
        "expected a token that ends mid-character: {pieces:?}"
    );
    assert_eq!(pieces.concat() + &stream.finish(), text);
    // A character cut off at the end comes out as U+FFFD when the stream ends.
    let rocket = tok.encode("🚀", true).unwrap();
    if rocket.len() > 1 {
        let mut s = tok.stream_decoder();
        assert_eq!(s.push(rocket[0]).unwrap(), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }
    let mut skipping = tok.stream_decoder().skip_special(true);
    let shown: String = [1u32, 4093, 2]
        .iter()
        .map(|&id| skipping.push(id).unwrap())
        .collect();
    assert_eq!(shown, "user");
}

#[test]
fn chat_template_renders_the_fixture_prompt() {
    let file = gguf();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let template = ChatTemplate::from_gguf(&file, &tok)
        .unwrap()
        .expect("the model has a chat template");
    let chat = prompts()
        .into_iter()
        .find(|p| p["name"] == "chat_boiling_point")
        .unwrap();
    let messages: Vec<ChatMessage> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let text = template.render(&messages, true).unwrap();
    assert_eq!(text, chat["text"].as_str().unwrap());
    assert_eq!(tok.encode(&text, true).unwrap(), ids(&chat["prompt_ids"]));
    // With a system message of its own, no default one is added; without the generation prompt
    // the text ends after the last message.
    let with_system = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::user("Hi"),
    ];
    assert_eq!(
        template.render(&with_system, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
#[should_panic(expected = "tests/fixtures/smollm2/no_such_fixture.bin")]
fn a_missing_fixture_names_its_full_path() {
    smollm2_fixtures::read("no_such_fixture.bin");
}
