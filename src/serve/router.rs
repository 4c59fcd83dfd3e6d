//! The routes and their handlers: `/v1/models`, `/v1/completions`, `/v1/chat/completions`,
//! `/health`, `/metrics`; JSON errors for unknown routes and methods.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::auth::{count_requests, require_api_key};
use super::error::ApiError;
use super::metrics::Metrics;
use super::request::{self, Endpoint, Input, Limits, ParsedRequest};
use super::response::{ResponseMeta, Usage};
use super::scheduler::SchedulerHandle;
use super::sequence::{Event, Job, Sampling};
use super::sse::{body_stream, ChunkWriter};
use super::text::TextCodec;
use crate::model::chat::ChatTemplate;
use crate::model::sampler::SamplerConfig;

/// What every handler shares.
pub struct AppState {
    /// The scheduler.
    pub scheduler: SchedulerHandle,
    /// The tokenizer's side the server needs.
    pub codec: Arc<dyn TextCodec>,
    /// The model's chat template (`None`: chat requests are refused).
    pub template: Option<ChatTemplate>,
    /// The id `/v1/models` lists; requests must name it.
    pub model_id: String,
    /// The model's vocabulary size.
    pub vocab: usize,
    /// Request limits.
    pub limits: Limits,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The key `/v1` routes require, if any.
    pub api_key: Option<String>,
    /// When the server started (seconds since the Unix epoch).
    pub started: u64,
    /// Numbers response ids.
    pub serial: AtomicU64,
}

/// The server's routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn health() -> Response {
    json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.started,
            "owned_by": "onepass",
        }],
    });
    json_response(StatusCode::OK, &body)
}

async fn not_found() -> Response {
    ApiError::with_status(StatusCode::NOT_FOUND, "no such route").into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method",
    )
    .into_response()
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, Endpoint::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, Endpoint::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Both generation endpoints: read, tokenize, check, queue, then answer whole or streamed.
async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body.map_err(|r| {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::with_status(
                status,
                format!(
                    "the request body is larger than this server's limit of {} bytes",
                    state.limits.max_body_bytes
                ),
            )
        } else {
            ApiError::with_status(
                status,
                format!("cannot read the request body: {}", r.body_text()),
            )
        }
    })?;
    let request = request::parse(endpoint, &body, &state.limits)?;
    if request.model != state.model_id {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{}` does not exist: this server serves `{}`",
                request.model, state.model_id
            ),
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
    }
    let prompt = prompt_ids(&state, &request).await?;
    let max_tokens = request::plan_tokens(&request, prompt.len(), &state.limits)?;
    let sampling = if request.temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::Sample(SamplerConfig {
            temperature: request.temperature,
            top_p: request.top_p,
            seed: request.seed.unwrap_or_else(random_seed),
            ..SamplerConfig::default()
        })
    };
    let (events, receiver) = unbounded_channel();
    state.scheduler.submit(Job {
        prompt,
        max_tokens,
        sampling,
        stop: request.stop.clone(),
        ignore_eos: request.ignore_eos,
        events,
        arrived,
    })?;
    let serial = state.serial.fetch_add(1, Ordering::Relaxed);
    let meta = ResponseMeta::new(endpoint, serial, unix_now(), &state.model_id);
    if request.stream {
        let writer = ChunkWriter::new(meta, request.include_usage);
        let body = Body::from_stream(body_stream(writer, receiver));
        return Ok((
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response());
    }
    whole_answer(meta, receiver, request.return_token_ids).await
}

/// Waits for a job's events and answers with the whole text. If the client goes meanwhile, the
/// server drops this future, and with it the receiver: the scheduler frees the slot.
async fn whole_answer(
    meta: ResponseMeta,
    mut receiver: UnboundedReceiver<Event>,
    return_token_ids: bool,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match receiver.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done {
                reason,
                prompt_tokens,
                completion_tokens,
                token_ids,
            }) => {
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens,
                };
                let mut body = meta.full(&text, reason, usage);
                if return_token_ids {
                    body["choices"][0]["token_ids"] = token_ids.into();
                }
                return Ok(json_response(StatusCode::OK, &body));
            }
            Some(Event::Failed(e)) => return Err(e),
            None => {
                return Err(ApiError::with_status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the generation ended without a result",
                ))
            }
        }
    }
}

/// The prompt's token ids: the text tokenized, the chat rendered with the model's template and
/// tokenized, or the ids given (each checked against the vocabulary). Tokenizing runs off the
/// async threads.
async fn prompt_ids(state: &Arc<AppState>, request: &ParsedRequest) -> Result<Vec<u32>, ApiError> {
    let text = match &request.input {
        Input::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= state.vocab) {
                return Err(ApiError::invalid_field(
                    "prompt",
                    format!(
                        "token id {bad} is outside the vocabulary of {} tokens",
                        state.vocab
                    ),
                ));
            }
            return Ok(ids.clone());
        }
        Input::Text(text) => text.clone(),
        Input::Messages(messages) => {
            let template = state.template.as_ref().ok_or_else(|| {
                ApiError::invalid_field(
                    "messages",
                    "this model has no chat template (a base model): use /v1/completions",
                )
            })?;
            template
                .render(messages, true)
                .map_err(|e| ApiError::invalid_field("messages", e.to_string()))?
        }
    };
    let param = match request.endpoint {
        Endpoint::Completions => "prompt",
        Endpoint::Chat => "messages",
    };
    // A prompt's bytes bound its tokens from above (at least one byte per token is not true of
    // every tokenizer, but text many times the token limit is refused before the work).
    let byte_cap = state.limits.max_prompt_tokens.saturating_mul(64);
    if text.len() > byte_cap {
        return Err(ApiError::invalid_field(
            param,
            format!(
                "the prompt has {} bytes, far beyond this server's limit of {} tokens",
                text.len(),
                state.limits.max_prompt_tokens
            ),
        )
        .code("context_length_exceeded"));
    }
    let codec = state.codec.clone();
    tokio::task::spawn_blocking(move || codec.encode(&text))
        .await
        .map_err(|e| {
            ApiError::with_status(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("tokenizing failed: {e}"),
            )
        })?
        .map_err(|e| ApiError::invalid_field(param, format!("cannot tokenize: {e}")))
}

/// A seed for a request that gives none: std's randomly keyed hasher over the time.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = SystemTime::now().duration_since(UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}
