//! Server-sent events: a job's [`Event`]s as `data: {json}` frames, ending with `data: [DONE]`.
//! A failure after the stream has begun is sent as a frame holding the error object, then
//! `[DONE]`, since the status line has already gone out.

use std::convert::Infallible;

use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::Stream;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::response::{ResponseMeta, Usage};
use super::sequence::Event;

/// The frame that ends every stream.
pub const DONE_FRAME: &str = "data: [DONE]\n\n";

/// One `data:` frame.
pub fn frame(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// Turns events into the frames of one streamed answer.
#[derive(Debug)]
pub struct ChunkWriter {
    meta: ResponseMeta,
    include_usage: bool,
    first: bool,
}

impl ChunkWriter {
    /// A writer for the answer `meta` describes.
    pub fn new(meta: ResponseMeta, include_usage: bool) -> Self {
        ChunkWriter {
            meta,
            include_usage,
            first: true,
        }
    }

    /// The frames of one event, and whether the stream is over.
    pub fn frames(&mut self, event: Event) -> (String, bool) {
        match event {
            Event::Text(text) => {
                let chunk = self
                    .meta
                    .chunk(Some(&text), self.first, None, self.include_usage);
                self.first = false;
                (frame(&chunk), false)
            }
            Event::Done {
                reason,
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                let last = self
                    .meta
                    .chunk(None, self.first, Some(reason), self.include_usage);
                let mut out = frame(&last);
                if self.include_usage {
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens,
                    };
                    out.push_str(&frame(&self.meta.usage_chunk(usage)));
                }
                out.push_str(DONE_FRAME);
                (out, true)
            }
            Event::Failed(error) => (Self::error_frames(&error), true),
        }
    }

    /// An error frame and `[DONE]`.
    pub fn error_frames(error: &ApiError) -> String {
        frame(&error.body()) + DONE_FRAME
    }
}

/// The body stream of a streamed answer: frames as the events come, until the last one. Dropping
/// the stream (the client went) drops the receiver, which tells the scheduler to free the slot.
pub fn body_stream(
    writer: ChunkWriter,
    events: UnboundedReceiver<Event>,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures_util::stream::unfold(Some((writer, events)), |state| async move {
        let (mut writer, mut events) = state?;
        let (text, over) = match events.recv().await {
            Some(event) => writer.frames(event),
            None => (
                ChunkWriter::error_frames(&ApiError::with_status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the generation ended without a result",
                )),
                true,
            ),
        };
        let next = (!over).then_some((writer, events));
        Some((Ok(Bytes::from(text)), next))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::request::Endpoint;
    use crate::serve::sequence::FinishReason;

    /// The JSON of every frame but `[DONE]`, checking the framing on the way.
    fn parse_frames(text: &str) -> Vec<Value> {
        assert!(text.ends_with("\n\n"), "{text:?}");
        text.split_terminator("\n\n")
            .filter(|f| *f != "data: [DONE]")
            .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn a_chat_stream_carries_the_role_first_the_reason_last_then_usage_and_done() {
        let meta = ResponseMeta::new(Endpoint::Chat, 1, 2, "m");
        let mut w = ChunkWriter::new(meta, true);
        let (a, over) = w.frames(Event::Text("Hel".into()));
        assert!(!over);
        let (b, _) = w.frames(Event::Text("lo".into()));
        let (end, over) = w.frames(Event::Done {
            reason: FinishReason::Stop,
            prompt_tokens: 4,
            completion_tokens: 2,
            token_ids: vec![5, 6],
        });
        assert!(over && end.ends_with(DONE_FRAME));
        let a = &parse_frames(&a)[0];
        assert_eq!(a["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(a["choices"][0]["delta"]["content"], "Hel");
        let b = &parse_frames(&b)[0];
        assert!(b["choices"][0]["delta"].get("role").is_none());
        let end = parse_frames(&end);
        assert_eq!(end.len(), 2);
        assert_eq!(end[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(end[1]["usage"]["total_tokens"], 6);
    }

    #[test]
    fn a_failure_is_an_error_frame_then_done() {
        let meta = ResponseMeta::new(Endpoint::Completions, 1, 2, "m");
        let mut w = ChunkWriter::new(meta, false);
        let (text, over) = w.frames(Event::Failed(ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )));
        assert!(over && text.ends_with(DONE_FRAME));
        let frames = parse_frames(&text);
        assert_eq!(frames[0]["error"]["message"], "the server is shutting down");
    }

    #[test]
    fn the_body_stream_ends_after_the_last_event_or_a_lost_sender() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            use futures_util::StreamExt;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tx.send(Event::Text("a".into())).unwrap();
            tx.send(Event::Done {
                reason: FinishReason::Length,
                prompt_tokens: 1,
                completion_tokens: 1,
                token_ids: vec![9],
            })
            .unwrap();
            let meta = ResponseMeta::new(Endpoint::Completions, 1, 2, "m");
            let parts: Vec<_> = body_stream(ChunkWriter::new(meta.clone(), false), rx)
                .collect()
                .await;
            assert_eq!(parts.len(), 2);
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
            drop(tx);
            let parts: Vec<_> = body_stream(ChunkWriter::new(meta, false), rx)
                .collect()
                .await;
            assert_eq!(parts.len(), 1);
            let text = String::from_utf8(parts[0].clone().unwrap().to_vec()).unwrap();
            assert!(text.contains("without a result") && text.ends_with(DONE_FRAME));
        });
    }
}
