//! Reading and checking generation requests: every field's type and range, unknown and missing
//! fields, and the limits applied once the prompt is tokenized.

use super::*;

const LIMITS: Limits = Limits {
    max_body_bytes: 1 << 20,
    max_prompt_tokens: 100,
    max_new_tokens: 50,
    context: 120,
};

fn completion(body: &str) -> Result<ParsedRequest, ApiError> {
    parse(Endpoint::Completions, body.as_bytes(), &LIMITS)
}

fn chat(body: &str) -> Result<ParsedRequest, ApiError> {
    parse(Endpoint::Chat, body.as_bytes(), &LIMITS)
}

/// The field a rejected request names, and checks the status is 400.
fn rejected_field(result: Result<ParsedRequest, ApiError>) -> String {
    let e = result.expect_err("the request should be refused");
    assert_eq!(e.status.as_u16(), 400, "{e}");
    assert_eq!(e.kind(), "invalid_request_error");
    e.param.unwrap_or_default()
}

#[test]
fn a_full_completion_request_is_read_field_by_field() {
    let r = completion(
        r#"{"model": "m", "prompt": "Hi", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
            "seed": -1, "stop": ["a", "b"], "n": 1, "stream": true,
            "stream_options": {"include_usage": true}, "user": "u",
            "return_token_ids": true, "ignore_eos": true}"#,
    )
    .unwrap();
    assert_eq!(r.model, "m");
    assert_eq!(r.input, Input::Text("Hi".into()));
    assert_eq!(r.max_tokens, Some(7));
    assert_eq!((r.temperature, r.top_p), (0.0, 0.5));
    assert_eq!(r.seed, Some(u64::MAX));
    assert_eq!(r.stop, ["a", "b"]);
    assert!(r.stream && r.include_usage && r.return_token_ids && r.ignore_eos);
    let r =
        completion(r#"{"model": "m", "prompt": [1, 2, 3], "stop": "x", "seed": null}"#).unwrap();
    assert_eq!(r.input, Input::Tokens(vec![1, 2, 3]));
    assert_eq!(r.stop, ["x"]);
    assert_eq!((r.temperature, r.seed, r.stream), (1.0, None, false));
    assert!(!r.return_token_ids && !r.ignore_eos);
    let r = completion(r#"{"model": "m", "prompt": ["one"]}"#).unwrap();
    assert_eq!(r.input, Input::Text("one".into()));
}

#[test]
fn a_chat_request_takes_messages_and_max_completion_tokens() {
    let r = chat(
        r#"{"model": "m", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}], "name": "x"}
        ], "max_completion_tokens": 9}"#,
    )
    .unwrap();
    let Input::Messages(m) = &r.input else {
        panic!("{r:?}")
    };
    assert_eq!(m[0], ChatMessage::new("system", "Be brief."));
    assert_eq!(m[1], ChatMessage::new("user", "Hi there"));
    assert_eq!(r.max_tokens, Some(9));
}

#[test]
fn wrong_types_missing_and_unknown_fields_are_400s_naming_the_field() {
    let cases = [
        (r#"{"prompt": "x"}"#, "model"),
        (r#"{"model": 3, "prompt": "x"}"#, "model"),
        (r#"{"model": "m"}"#, "prompt"),
        (r#"{"model": "m", "prompt": {"a": 1}}"#, "prompt"),
        (r#"{"model": "m", "prompt": []}"#, "prompt"),
        (r#"{"model": "m", "prompt": ["a", "b"]}"#, "prompt"),
        (r#"{"model": "m", "prompt": [1, -2]}"#, "prompt"),
        (
            r#"{"model": "m", "prompt": "x", "max_tokens": "5"}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "prompt": "x", "max_tokens": 2.5}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "prompt": "x", "max_tokens": 0}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "prompt": "x", "max_tokens": 51}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "prompt": "x", "temperature": 2.5}"#,
            "temperature",
        ),
        (
            r#"{"model": "m", "prompt": "x", "temperature": -0.1}"#,
            "temperature",
        ),
        (
            r#"{"model": "m", "prompt": "x", "temperature": "hot"}"#,
            "temperature",
        ),
        (r#"{"model": "m", "prompt": "x", "top_p": 0}"#, "top_p"),
        (r#"{"model": "m", "prompt": "x", "top_p": 1.5}"#, "top_p"),
        (r#"{"model": "m", "prompt": "x", "seed": 1e30}"#, "seed"),
        (r#"{"model": "m", "prompt": "x", "n": 2}"#, "n"),
        (r#"{"model": "m", "prompt": "x", "stop": 5}"#, "stop"),
        (r#"{"model": "m", "prompt": "x", "stop": ["a", 1]}"#, "stop"),
        (r#"{"model": "m", "prompt": "x", "stop": [""]}"#, "stop"),
        (
            r#"{"model": "m", "prompt": "x", "stop": ["a","b","c","d","e"]}"#,
            "stop",
        ),
        (
            r#"{"model": "m", "prompt": "x", "stream": "yes"}"#,
            "stream",
        ),
        (
            r#"{"model": "m", "prompt": "x", "stream_options": {"x": 1}}"#,
            "stream_options.x",
        ),
        (
            r#"{"model": "m", "prompt": "x", "stream_options": 1}"#,
            "stream_options",
        ),
        (
            r#"{"model": "m", "prompt": "x", "frobnicate": true}"#,
            "frobnicate",
        ),
        (
            r#"{"model": "m", "prompt": "x", "max_completion_tokens": 3}"#,
            "max_completion_tokens",
        ),
    ];
    for (body, field) in cases {
        assert_eq!(rejected_field(completion(body)), field, "{body}");
    }
    let chat_cases = [
        (r#"{"model": "m"}"#, "messages"),
        (r#"{"model": "m", "messages": []}"#, "messages"),
        (r#"{"model": "m", "messages": "hi"}"#, "messages"),
        (r#"{"model": "m", "messages": [3]}"#, "messages[0]"),
        (
            r#"{"model": "m", "messages": [{"content": "x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "tool", "content": "x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user"}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": 1}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "a", "extra": 1}]}"#,
            "messages[0].extra",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            "messages[0].content[0].type",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "a"}], "prompt": "x"}"#,
            "prompt",
        ),
    ];
    for (body, field) in chat_cases {
        assert_eq!(rejected_field(chat(body)), field, "{body}");
    }
    let e = completion("{not json").unwrap_err();
    assert_eq!((e.status.as_u16(), e.param), (400, None));
}

#[test]
fn the_tokenized_prompt_is_checked_against_the_limits_and_the_context() {
    let mut r = completion(r#"{"model": "m", "prompt": "x"}"#).unwrap();
    assert_eq!(
        plan_tokens(&r, 10, &LIMITS).unwrap(),
        16,
        "OpenAI's completion default"
    );
    assert_eq!(
        plan_tokens(&r, 110, &LIMITS).unwrap_err().param.as_deref(),
        Some("prompt")
    );
    assert_eq!(
        plan_tokens(&r, 0, &LIMITS).unwrap_err().status.as_u16(),
        400
    );
    let limits = Limits {
        max_prompt_tokens: 200,
        ..LIMITS
    };
    let e = plan_tokens(&r, 120, &limits).unwrap_err();
    assert_eq!(e.code, Some("context_length_exceeded"));
    assert_eq!(
        plan_tokens(&r, 110, &limits).unwrap(),
        10,
        "the default fits the context"
    );
    r.max_tokens = Some(20);
    assert_eq!(plan_tokens(&r, 100, &LIMITS).unwrap(), 20);
    let e = plan_tokens(&r, 101, &limits).unwrap_err();
    assert_eq!(
        (e.param.as_deref(), e.code),
        (Some("max_tokens"), Some("context_length_exceeded"))
    );
    let c = chat(r#"{"model": "m", "messages": [{"role": "user", "content": "a"}]}"#).unwrap();
    assert_eq!(
        plan_tokens(&c, 10, &LIMITS).unwrap(),
        50,
        "chat: the server's cap"
    );
    assert_eq!(
        plan_tokens(&c, 90, &LIMITS).unwrap(),
        30,
        "chat: what the context leaves"
    );
}
