//! Reading a JSON request body field by field, so that every error names the field at fault:
//! malformed JSON, a body that is not an object, a value of the wrong type, an unknown field.

use serde_json::{Map, Value};

use super::error::ApiError;

/// The fields of a JSON object not yet read. A `null` value counts as absent, as in OpenAI's API.
#[derive(Debug)]
pub struct Fields {
    /// Where the object sits in the request (`""` for the body, `messages[0].` for a message).
    prefix: String,
    map: Map<String, Value>,
}

impl Fields {
    /// Parses a request body: a JSON object, or a 400 that says what is wrong.
    pub fn parse(body: &[u8]) -> Result<Fields, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid_request(format!("the request body is not valid JSON: {e}"))
        })?;
        match value {
            Value::Object(map) => Ok(Fields {
                prefix: String::new(),
                map,
            }),
            other => Err(ApiError::invalid_request(format!(
                "the request body must be a JSON object, not {}",
                kind_of(&other)
            ))),
        }
    }

    /// The fields of an object nested at `path` (`messages[2]`), or a 400 naming `path` when
    /// `value` is not an object.
    pub fn nested(path: &str, value: Value) -> Result<Fields, ApiError> {
        match value {
            Value::Object(map) => Ok(Fields {
                prefix: format!("{path}."),
                map,
            }),
            other => Err(ApiError::invalid_field(
                path,
                format!("`{path}` must be an object, not {}", kind_of(&other)),
            )),
        }
    }

    /// The full name of field `name` for messages (`messages[0].role`).
    pub fn path(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A 400 naming field `name`.
    pub fn error(&self, name: &str, message: impl std::fmt::Display) -> ApiError {
        let path = self.path(name);
        ApiError::invalid_field(&path, format!("`{path}` {message}"))
    }

    /// Takes a field's raw value (`None` when absent or null).
    pub fn take(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name).filter(|v| !v.is_null())
    }

    /// Takes a field that must be present.
    pub fn require(&mut self, name: &str) -> Result<Value, ApiError> {
        self.take(name).ok_or_else(|| {
            self.error(name, "is required")
                .code("missing_required_parameter")
        })
    }

    /// Takes a string field.
    pub fn string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(name, "a string", &other)),
        }
    }

    /// Takes a boolean field.
    pub fn boolean(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(self.wrong_type(name, "a boolean", &other)),
        }
    }

    /// Takes a number field.
    pub fn number(&mut self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(name, "is not a representable number")),
            Some(other) => Err(self.wrong_type(name, "a number", &other)),
        }
    }

    /// Takes a whole-number field as an `i128` (so that both `-1` and `2^64 - 1` fit).
    pub fn integer(&mut self, name: &str) -> Result<Option<i128>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    Ok(Some(i128::from(i)))
                } else if let Some(u) = n.as_u64() {
                    Ok(Some(i128::from(u)))
                } else {
                    Err(self.error(name, format!("must be a whole number, not {n}")))
                }
            }
            Some(other) => Err(self.wrong_type(name, "a whole number", &other)),
        }
    }

    /// Takes a whole-number field that must lie in `min..=max`.
    pub fn integer_in(
        &mut self,
        name: &str,
        min: i128,
        max: i128,
    ) -> Result<Option<i128>, ApiError> {
        match self.integer(name)? {
            Some(v) if v < min || v > max => {
                Err(self.error(name, format!("must be between {min} and {max}, got {v}")))
            }
            v => Ok(v),
        }
    }

    /// Ends reading: a 400 naming the first field that was not read, if any.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            Some(name) => Err(self
                .error(name, "is not a known field")
                .code("unknown_parameter")),
            None => Ok(()),
        }
    }

    fn wrong_type(&self, name: &str, want: &str, got: &Value) -> ApiError {
        self.error(name, format!("must be {want}, not {}", kind_of(got)))
            .code("invalid_type")
    }
}

/// A JSON value's kind in words (`a string`, `an array`).
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_json_and_non_objects_are_400s_about_the_body() {
        let e = Fields::parse(b"{\"model\": ").unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("not valid JSON"), "{e}");
        assert_eq!(e.param, None);
        let e = Fields::parse(b"[1, 2]").unwrap_err();
        assert!(e.message.contains("an array"), "{e}");
        assert!(Fields::parse(b"\xff\xfe").is_err());
    }

    #[test]
    fn each_error_names_its_field() {
        let body = br#"{"a": "x", "b": 1.5, "c": true, "d": null, "e": 7, "f": {"g": 1}}"#;
        let mut f = Fields::parse(body).unwrap();
        let e = f.number("a").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("a"));
        assert!(e.message.contains("must be a number, not a string"), "{e}");
        assert_eq!(f.integer("b").unwrap_err().param.as_deref(), Some("b"));
        assert_eq!(f.boolean("c").unwrap(), Some(true));
        assert_eq!(f.string("d").unwrap(), None, "null is absent");
        let e = f.integer_in("e", 1, 5).unwrap_err();
        assert!(e.message.contains("between 1 and 5, got 7"), "{e}");
        let e = f.require("zz").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("zz"));
        let inner = Fields::nested("f", f.take("f").unwrap()).unwrap();
        let e = inner.finish().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("f.g"));
        assert!(f.finish().is_ok(), "every field was taken");
        let mut g = Fields::parse(br#"{"extra": 1}"#).unwrap();
        assert_eq!(g.string("model").unwrap(), None);
        let e = g.finish().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("extra"));
        assert_eq!(e.code, Some("unknown_parameter"));
        let e = Fields::nested("messages[0]", Value::from(3)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0]"));
    }

    #[test]
    fn integers_span_negative_and_unsigned_64_bit_values() {
        let mut f = Fields::parse(br#"{"s": -1, "u": 18446744073709551615}"#).unwrap();
        assert_eq!(f.integer("s").unwrap(), Some(-1));
        assert_eq!(f.integer("u").unwrap(), Some(i128::from(u64::MAX)));
    }
}
