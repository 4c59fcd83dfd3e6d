//! `onepass serve`: an OpenAI-compatible HTTP server over a [`SlotModel`], with continuous
//! batching.
//!
//! The async side (axum on tokio) reads and checks requests, tokenizes them and streams answers;
//! the scheduler ([`scheduler`]) runs on its own OS thread, owns the model, and mixes prefill
//! chunks of new requests with decode steps of running ones. They talk through channels: a
//! bounded queue of [`sequence::Job`]s one way, a channel of [`sequence::Event`]s per request
//! the other.

pub mod auth;
pub mod error;
pub mod fields;
pub mod listen;
pub mod metrics;
pub mod request;
pub mod response;
pub mod router;
pub mod scheduler;
pub mod sequence;
pub mod sse;
pub mod stop;
pub mod text;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::model::chat::ChatTemplate;
use crate::model::slots::SlotModel;

pub use error::ApiError;
pub use request::Limits;
pub use text::TextCodec;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The key `/v1` routes require, if any.
    pub api_key: Option<String>,
    /// The model id `/v1/models` lists and requests must name.
    pub model_id: String,
    /// Request limits (the context is clamped to the model's slot size).
    pub limits: Limits,
    /// Requests that may wait for a slot; beyond them, 429.
    pub queue: usize,
    /// Longest time to read a request's headers.
    pub header_timeout: Duration,
    /// How long open answers may go on after a shutdown signal.
    pub shutdown_grace: Duration,
    /// Threads of the async runtime.
    pub http_threads: usize,
    /// Run a decode step of every batch size before listening ([`scheduler::warm_up`]).
    pub warm_up: bool,
    /// Prompts of at most this many tokens are prefilled as rows of decode steps (`None`: four
    /// steps' rows, [`scheduler::default_mix_limit`]; 0: every prompt takes prefill passes).
    pub mix_limit: Option<usize>,
}

/// The model a server serves, with its text side.
pub struct ServedModel {
    /// The model, with its KV-cache slots.
    pub model: Box<dyn SlotModel>,
    /// Its tokenizer.
    pub codec: Arc<dyn TextCodec>,
    /// Its chat template (`None`: chat requests are refused).
    pub template: Option<ChatTemplate>,
}

/// Binds `host:port` (port 0: any free port) for [`run`]: done first, so that an address in use
/// is reported before a model is loaded.
pub fn bind(host: &str, port: u16) -> Result<std::net::TcpListener> {
    let address = format!("{host}:{port}");
    let listener = std::net::TcpListener::bind(&address)
        .map_err(|e| Error::io(format!("binding {address}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(format!("binding {address}"), e))?;
    Ok(listener)
}

/// Runs the server on `listener` (from [`bind`]) until SIGINT or SIGTERM; calls `on_listening`
/// with the bound address once connections are accepted. Returns after a graceful end.
pub fn run(
    listener: std::net::TcpListener,
    options: ServeOptions,
    served: ServedModel,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    run_until(
        listener,
        options,
        served,
        on_listening,
        listen::shutdown_signal(),
    )
}

/// [`run`], ending when `shutdown` resolves instead of at a signal.
pub fn run_until(
    listener: std::net::TcpListener,
    options: ServeOptions,
    served: ServedModel,
    on_listening: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.http_threads.max(1))
        .thread_name("onepass-http")
        .enable_all()
        .build()
        .map_err(|e| Error::Backend(format!("cannot start the async runtime: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::io("the listening socket", e))?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::io(format!("listening on {local}"), e))?
    };
    let mut model = served.model;
    if options.warm_up {
        let t0 = std::time::Instant::now();
        let sizes = scheduler::warm_up(model.as_mut())?;
        tracing::info!("warmed up {sizes} decode step sizes in {:?}", t0.elapsed());
    }
    let metrics = Arc::new(metrics::Metrics::new(model.slots()));
    let slot_ctx = model.slot_ctx();
    let vocab = model.vocab();
    let mix_limit = options
        .mix_limit
        .unwrap_or_else(|| scheduler::default_mix_limit(model.max_rows()));
    let scheduler = scheduler::spawn(
        model,
        served.codec.clone(),
        metrics.clone(),
        options.queue,
        mix_limit,
    )?;
    let limits = Limits {
        context: slot_ctx,
        max_prompt_tokens: options.limits.max_prompt_tokens.min(slot_ctx),
        ..options.limits
    };
    let state = Arc::new(router::AppState {
        scheduler,
        codec: served.codec,
        template: served.template,
        model_id: options.model_id.clone(),
        vocab,
        limits,
        metrics,
        api_key: options.api_key.clone(),
        started: router::unix_now(),
        serial: AtomicU64::new(0),
    });
    let app = router::router(state.clone());
    on_listening(local);
    let drain_state = state.clone();
    let abort_state = state.clone();
    runtime.block_on(listen::serve_connections(
        listener,
        app,
        options.header_timeout,
        listen::Shutdown {
            signal: async move {
                shutdown.await;
                tracing::info!("shutting down: no new connections; open answers may finish");
                drain_state.scheduler.drain();
            },
            grace: options.shutdown_grace,
            on_grace_over: move || abort_state.scheduler.abort(),
        },
    ));
    let stopped = state.scheduler.stop();
    runtime.shutdown_timeout(Duration::from_secs(1));
    stopped
}
