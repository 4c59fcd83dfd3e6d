//! Accepting connections: HTTP/1.1 through hyper with a time limit on reading a request's
//! headers, and a graceful end (stop accepting, let open answers finish within a grace period,
//! then have the scheduler end what still runs).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// How long open answers get, after the grace period has run out and the scheduler has ended
/// their generations, to send their last bytes.
const FINAL_WAIT: Duration = Duration::from_secs(5);

/// How the server ends.
pub struct Shutdown<F, A> {
    /// Resolves when the server should stop accepting connections.
    pub signal: F,
    /// How long open answers may run on after that.
    pub grace: Duration,
    /// Called when the grace period is over: ends the generations still running.
    pub on_grace_over: A,
}

/// Serves `app` on `listener` until `shutdown.signal` resolves, then ends gracefully.
pub async fn serve_connections<F, A>(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    shutdown: Shutdown<F, A>,
) where
    F: Future<Output = ()>,
    A: FnOnce(),
{
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let signal = shutdown.signal;
    tokio::pin!(signal);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little, go on.
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let service = TowerToHyperService::new(app.clone());
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let watched = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = watched.await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            () = &mut signal => break,
        }
    }
    drop(listener);
    let all_closed = graceful.shutdown();
    tokio::pin!(all_closed);
    tokio::select! {
        () = &mut all_closed => return,
        () = tokio::time::sleep(shutdown.grace) => {}
    }
    (shutdown.on_grace_over)();
    if tokio::time::timeout(FINAL_WAIT, all_closed).await.is_err() {
        tracing::warn!("some connections were still open at exit");
    }
}

/// Resolves at SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
