//! The JSON the API answers with: whole responses, streamed chunks, the usage object.

use serde_json::{json, Value};

use super::request::Endpoint;
use super::sequence::FinishReason;

/// What every response and chunk of one request shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseMeta {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// The served model's id.
    pub model: String,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

impl Usage {
    /// The `usage` object.
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

impl ResponseMeta {
    /// Metadata for a new response; `serial` makes the id unique within the server's life.
    pub fn new(endpoint: Endpoint, serial: u64, created: u64, model: &str) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        ResponseMeta {
            endpoint,
            id: format!("{prefix}-{created:x}{serial:08x}"),
            created,
            model: model.to_owned(),
        }
    }

    /// The whole (non-streamed) response.
    pub fn full(&self, text: &str, reason: FinishReason, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": reason.as_str(),
            }),
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": reason.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage.to_json(),
        })
    }

    /// A streamed chunk carrying `text` (chat's first chunk also carries the role), or, with a
    /// `reason`, the last chunk of the choice. `usage_field` adds `"usage": null`, as OpenAI
    /// does on every chunk when the usage is asked for at the end.
    pub fn chunk(
        &self,
        text: Option<&str>,
        first: bool,
        reason: Option<FinishReason>,
        usage_field: bool,
    ) -> Value {
        let finish = reason.map(FinishReason::as_str);
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({
                    "index": 0,
                    "delta": delta,
                    "logprobs": null,
                    "finish_reason": finish,
                })
            }
        };
        let mut chunk = self.chunk_head();
        chunk["choices"] = json!([choice]);
        if usage_field {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The closing chunk with the usage and no choices (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut chunk = self.chunk_head();
        chunk["choices"] = json!([]);
        chunk["usage"] = usage.to_json();
        chunk
    }

    fn chunk_head(&self) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_and_chunks_have_the_openai_fields() {
        let usage = Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
        };
        let chat = ResponseMeta::new(Endpoint::Chat, 7, 1_700_000_000, "m");
        assert!(chat.id.starts_with("chatcmpl-"));
        let full = chat.full("hi", FinishReason::Stop, usage);
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["content"], "hi");
        assert_eq!(full["choices"][0]["finish_reason"], "stop");
        assert_eq!(full["usage"]["total_tokens"], 8);
        let first = chat.chunk(Some(""), true, None, false);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert!(first.get("usage").is_none());
        let last = chat.chunk(None, false, Some(FinishReason::Length), true);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert!(last["usage"].is_null() && last.get("usage").is_some());
        let end = chat.usage_chunk(usage);
        assert_eq!(end["choices"], json!([]));
        assert_eq!(end["usage"]["completion_tokens"], 3);

        let cmpl = ResponseMeta::new(Endpoint::Completions, 8, 1_700_000_000, "m");
        assert!(cmpl.id.starts_with("cmpl-") && cmpl.id != chat.id);
        let full = cmpl.full("x", FinishReason::Length, usage);
        assert_eq!(full["object"], "text_completion");
        assert_eq!(full["choices"][0]["text"], "x");
        let piece = cmpl.chunk(Some("ab"), true, None, false);
        assert_eq!(piece["choices"][0]["text"], "ab");
        assert!(piece["choices"][0]["finish_reason"].is_null());
    }
}
