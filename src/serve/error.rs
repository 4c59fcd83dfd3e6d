//! Errors as the OpenAI API gives them: an HTTP status and a JSON body
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// One error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, in words.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A short machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the request field `param`.
    pub fn invalid_field(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_owned()),
            code: None,
        }
    }

    /// A 400 about the request as a whole (malformed JSON, a body that is not an object).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// An error with any status, no field and no code.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The same error with a machine-readable code.
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// OpenAI's error type for the status: `invalid_request_error` for the client's mistakes,
    /// `authentication_error`, `rate_limit_error` (a full queue), `server_error` otherwise.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_has_openai_shape_and_the_type_follows_the_status() {
        let e = ApiError::invalid_field("temperature", "must be between 0 and 2");
        let body = e.body();
        assert_eq!(body["error"]["param"], "temperature");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["message"], "must be between 0 and 2");
        assert!(body["error"]["code"].is_null());
        let full = ApiError::with_status(StatusCode::TOO_MANY_REQUESTS, "queue full");
        assert_eq!(full.body()["error"]["type"], "rate_limit_error");
        let auth = ApiError::with_status(StatusCode::UNAUTHORIZED, "no key");
        assert_eq!(auth.kind(), "authentication_error");
        let missing =
            ApiError::with_status(StatusCode::NOT_FOUND, "no such model").code("model_not_found");
        assert_eq!(missing.body()["error"]["code"], "model_not_found");
        assert_eq!(
            ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "x").kind(),
            "server_error"
        );
    }
}
