//! The two generation requests, `/v1/completions` and `/v1/chat/completions`, read and checked
//! field by field into one [`ParsedRequest`]; the limits that apply once the prompt is tokenized.

use serde_json::Value;

use super::error::ApiError;
use super::fields::{kind_of, Fields};
use crate::model::chat::ChatMessage;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`: a prompt continued as plain text.
    Completions,
    /// `POST /v1/chat/completions`: messages rendered with the model's chat template.
    Chat,
}

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A completion prompt given as text.
    Text(String),
    /// A completion prompt given as token ids.
    Tokens(Vec<u32>),
    /// A conversation.
    Messages(Vec<ChatMessage>),
}

/// A generation request whose every field has the right type and lies in range.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The model the client named.
    pub model: String,
    /// The prompt or conversation.
    pub input: Input,
    /// `max_tokens` (or chat's `max_completion_tokens`), when given.
    pub max_tokens: Option<usize>,
    /// Sampling temperature, 0 to 2; 0 is greedy.
    pub temperature: f32,
    /// Nucleus threshold, in (0, 1].
    pub top_p: f32,
    /// The sampler's seed, when given.
    pub seed: Option<u64>,
    /// Stop strings (none empty).
    pub stop: Vec<String>,
    /// Whether to stream server-sent events.
    pub stream: bool,
    /// Whether a streamed answer ends with a chunk that holds the usage.
    pub include_usage: bool,
    /// Whether a whole answer's choice lists the generated token ids (`token_ids`; not in
    /// OpenAI's API: the name vLLM gives the same option).
    pub return_token_ids: bool,
    /// Whether to go on past end-of-generation tokens (`ignore_eos`, not in OpenAI's API: the
    /// name vLLM and llama.cpp give it; load benchmarks need answers of a fixed length).
    pub ignore_eos: bool,
}

/// Limits on what one request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Most prompt tokens.
    pub max_prompt_tokens: usize,
    /// Largest `max_tokens`.
    pub max_new_tokens: usize,
    /// The tokens one sequence may hold (prompt and generated).
    pub context: usize,
}

/// Reads a request body of `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8], limits: &Limits) -> Result<ParsedRequest, ApiError> {
    let mut f = Fields::parse(body)?;
    let model = match f.require("model")? {
        Value::String(s) => s,
        other => {
            return Err(f.error(
                "model",
                format!("must be a string, not {}", kind_of(&other)),
            ))
        }
    };
    let input = match endpoint {
        Endpoint::Completions => prompt(&mut f)?,
        Endpoint::Chat => Input::Messages(messages(&mut f)?),
    };
    let max = i128::try_from(limits.max_new_tokens).unwrap_or(i128::MAX);
    let mut max_tokens = f.integer_in("max_tokens", 1, max)?;
    if endpoint == Endpoint::Chat {
        if let Some(v) = f.integer_in("max_completion_tokens", 1, max)? {
            max_tokens = Some(v);
        }
    }
    let temperature = f.number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(f.error(
            "temperature",
            format!("must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = f.number("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(f.error("top_p", format!("must be in (0, 1], got {top_p}")));
    }
    // A negative seed is taken as its two's-complement bits, so every 64-bit value works.
    let seed = f
        .integer_in("seed", i128::from(i64::MIN), i128::from(u64::MAX))?
        .map(|s| s as u64);
    if let Some(n) = f.integer("n")? {
        if n != 1 {
            return Err(f.error("n", format!("must be 1 (one choice per request), got {n}")));
        }
    }
    let stop = stop_strings(&mut f)?;
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = match f.take("stream_options") {
        None => false,
        Some(v) => {
            let mut opts = Fields::nested("stream_options", v)?;
            let include = opts.boolean("include_usage")?.unwrap_or(false);
            opts.finish()?;
            include
        }
    };
    let return_token_ids = f.boolean("return_token_ids")?.unwrap_or(false);
    let ignore_eos = f.boolean("ignore_eos")?.unwrap_or(false);
    // Accepted and ignored: who the end user is, as OpenAI's API takes it.
    f.string("user")?;
    f.finish()?;
    Ok(ParsedRequest {
        endpoint,
        model,
        input,
        max_tokens: max_tokens.map(|v| v as usize),
        temperature: temperature as f32,
        top_p: top_p as f32,
        seed,
        stop,
        stream,
        include_usage,
        return_token_ids,
        ignore_eos,
    })
}

/// `prompt`: a string, a list of one string, or a list of token ids.
fn prompt(f: &mut Fields) -> Result<Input, ApiError> {
    match f.require("prompt")? {
        Value::String(s) => Ok(Input::Text(s)),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(f.error("prompt", "must not be an empty list"));
            }
            if items.iter().all(Value::is_string) {
                if items.len() != 1 {
                    return Err(f.error(
                        "prompt",
                        format!(
                            "holds {} prompts; this server takes one prompt per request",
                            items.len()
                        ),
                    ));
                }
                return Ok(Input::Text(
                    items[0].as_str().unwrap_or_default().to_owned(),
                ));
            }
            let ids = items
                .iter()
                .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    f.error(
                        "prompt",
                        "must be a string, a list of one string or a list of token ids",
                    )
                })?;
            Ok(Input::Tokens(ids))
        }
        other => Err(f.error(
            "prompt",
            format!("must be a string or a list, not {}", kind_of(&other)),
        )),
    }
}

/// `messages`: a non-empty list of `{role, content}`; content is a string or a list of text
/// parts.
fn messages(f: &mut Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match f.require("messages")? {
        Value::Array(items) if !items.is_empty() => items,
        Value::Array(_) => return Err(f.error("messages", "must hold at least one message")),
        other => {
            return Err(f.error(
                "messages",
                format!("must be a list, not {}", kind_of(&other)),
            ))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let mut m = Fields::nested(&format!("messages[{i}]"), item)?;
        let role = match m.require("role")? {
            Value::String(r) => r,
            other => {
                return Err(m.error("role", format!("must be a string, not {}", kind_of(&other))))
            }
        };
        let role = match role.as_str() {
            "system" | "user" | "assistant" => role,
            // OpenAI's newer name for the system role.
            "developer" => "system".to_owned(),
            _ => {
                return Err(m.error(
                    "role",
                    format!("must be system, developer, user or assistant, got {role:?}"),
                ))
            }
        };
        let content = match m.require("content")? {
            Value::String(s) => s,
            Value::Array(parts) => text_parts(&m, parts)?,
            other => {
                return Err(m.error(
                    "content",
                    format!(
                        "must be a string or a list of text parts, not {}",
                        kind_of(&other)
                    ),
                ))
            }
        };
        // Accepted and ignored: a participant's name.
        m.string("name")?;
        m.finish()?;
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

/// The text of content parts `[{"type": "text", "text": ...}, ...]`, joined.
fn text_parts(m: &Fields, parts: Vec<Value>) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.into_iter().enumerate() {
        let mut p = Fields::nested(&m.path(&format!("content[{j}]")), part)?;
        match p.string("type")?.as_deref() {
            Some("text") => {}
            Some(other) => return Err(p.error("type", format!("must be \"text\", got {other:?}"))),
            None => return Err(p.error("type", "is required")),
        }
        let Some(piece) = p.string("text")? else {
            return Err(p.error("text", "is required"));
        };
        p.finish()?;
        text.push_str(&piece);
    }
    Ok(text)
}

/// `stop`: a string or a list of up to [`MAX_STOP_STRINGS`] strings, none empty.
fn stop_strings(f: &mut Fields) -> Result<Vec<String>, ApiError> {
    let list = match f.take("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => {
            let mut list = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => list.push(s),
                    other => {
                        return Err(f.error(
                            "stop",
                            format!("must hold only strings, not {}", kind_of(&other)),
                        ))
                    }
                }
            }
            list
        }
        Some(other) => {
            return Err(f.error(
                "stop",
                format!(
                    "must be a string or a list of strings, not {}",
                    kind_of(&other)
                ),
            ))
        }
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(f.error(
            "stop",
            format!("may hold at most {MAX_STOP_STRINGS} strings"),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(f.error("stop", "must not hold an empty string"));
    }
    Ok(list)
}

/// Checks a tokenized prompt against the limits and the context, and gives the number of tokens
/// to generate: the request's `max_tokens`, or else (OpenAI's defaults) 16 for a completion and
/// what the context leaves for a chat, capped by the server's limit.
pub fn plan_tokens(
    request: &ParsedRequest,
    prompt_len: usize,
    limits: &Limits,
) -> Result<usize, ApiError> {
    let param = match request.endpoint {
        Endpoint::Completions => "prompt",
        Endpoint::Chat => "messages",
    };
    if prompt_len == 0 {
        return Err(ApiError::invalid_field(
            param,
            "the prompt encodes to no tokens",
        ));
    }
    let context_error =
        |msg: String| ApiError::invalid_field(param, msg).code("context_length_exceeded");
    if prompt_len > limits.max_prompt_tokens {
        return Err(context_error(format!(
            "the prompt has {prompt_len} tokens, more than this server's limit of {}",
            limits.max_prompt_tokens
        )));
    }
    if prompt_len >= limits.context {
        return Err(context_error(format!(
            "the prompt has {prompt_len} tokens and the context holds {}: no room to generate",
            limits.context
        )));
    }
    let room = limits.context - prompt_len;
    match request.max_tokens {
        Some(n) if n > room => Err(ApiError::invalid_field(
            "max_tokens",
            format!(
                "the prompt ({prompt_len} tokens) plus max_tokens ({n}) exceeds the context of {} \
                 tokens",
                limits.context
            ),
        )
        .code("context_length_exceeded")),
        Some(n) => Ok(n),
        None => {
            let default = match request.endpoint {
                Endpoint::Completions => 16,
                Endpoint::Chat => room,
            };
            Ok(default.min(room).min(limits.max_new_tokens))
        }
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
