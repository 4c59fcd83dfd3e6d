//! The checks every request passes before its handler: the API key on `/v1` routes, and the
//! per-endpoint request count of `/metrics` (taken after the answer, whatever its status).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::router::AppState;

/// Requires `Authorization: Bearer KEY` when the server has a key.
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        let message = match given {
            None => Some("no API key: send the header `Authorization: Bearer KEY`"),
            Some(g) if !same_key(g.trim().as_bytes(), key.as_bytes()) => {
                Some("the API key is not valid")
            }
            Some(_) => None,
        };
        if let Some(message) = message {
            return ApiError::with_status(StatusCode::UNAUTHORIZED, message)
                .code("invalid_api_key")
                .into_response();
        }
    }
    next.run(request).await
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme's case does not matter).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Compares keys in a time that depends only on their lengths.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    if given.len() != key.len() {
        return false;
    }
    given.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Counts every answered request by endpoint and status.
pub async fn count_requests(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = endpoint_label(request.uri().path());
    let response = next.run(request).await;
    state
        .metrics
        .count_request(endpoint, response.status().as_u16());
    response
}

/// The metrics label of a path: the route itself, or `other` (so that random paths cannot grow
/// the label set).
pub fn endpoint_label(path: &str) -> &'static str {
    const ROUTES: &[&str] = &[
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/health",
        "/metrics",
    ];
    ROUTES
        .iter()
        .copied()
        .find(|r| *r == path)
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_only_when_equal() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secreT", b"secret"));
        assert!(!same_key(b"secret1", b"secret"));
        assert!(!same_key(b"", b"secret"));
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some(" abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn unknown_paths_share_one_label() {
        assert_eq!(endpoint_label("/v1/completions"), "/v1/completions");
        assert_eq!(endpoint_label("/v1/completions/x"), "other");
        assert_eq!(endpoint_label("/../etc"), "other");
    }
}
