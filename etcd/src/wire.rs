//! The JSON shapes of etcd's v3 gateway, and how they decode.
//!
//! The gateway is grpc-gateway over etcd's protobuf API, so:
//! - bytes fields (`key`, `value`, `range_end`) are base64 strings;
//! - 64-bit integers (`revision`, `ID`, `TTL`, `lease`) are decimal strings;
//! - fields equal to their protobuf default (0, false, empty, the first enum value such as
//!   `PUT`) are omitted, so every field here has a default.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Deserializer};

/// Encodes bytes for a request body.
pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// The end of the range holding every key that starts with `prefix` (etcd's "prefix" rule):
/// the prefix with its last byte below 0xff incremented and the rest dropped; `[0]` (every
/// key) when there is no such byte.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An `int64` sent as a decimal string (or, leniently, as a number).
pub(crate) fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(d)? {
        Int::Number(n) => Ok(n),
        Int::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

/// A base64 bytes field.
pub(crate) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
}

/// The header every answer carries.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "int64")]
    pub(crate) revision: i64,
}

/// One stored key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct KeyValue {
    /// The key's bytes.
    #[serde(default, deserialize_with = "bytes")]
    pub key: Vec<u8>,
    /// The value's bytes (empty in a DELETE event).
    #[serde(default, deserialize_with = "bytes")]
    pub value: Vec<u8>,
    /// The lease the key is attached to; 0 for none.
    #[serde(default, deserialize_with = "int64")]
    pub lease: i64,
    /// The revision of the key's last change.
    #[serde(default, deserialize_with = "int64")]
    pub mod_revision: i64,
}

impl KeyValue {
    /// The key as text (invalid UTF-8 replaced).
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RangeAnswer {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) kvs: Vec<KeyValue>,
    #[serde(default)]
    pub(crate) more: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct HeaderAnswer {
    #[serde(default)]
    pub(crate) header: Header,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DeleteAnswer {
    #[serde(default, deserialize_with = "int64")]
    pub(crate) deleted: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct GrantAnswer {
    #[serde(default, rename = "ID", deserialize_with = "int64")]
    pub(crate) id: i64,
    #[serde(default, rename = "TTL", deserialize_with = "int64")]
    pub(crate) ttl: i64,
    #[serde(default)]
    pub(crate) error: String,
}

/// `/v3/lease/keepalive` answers `{"result": {...}}` (one message of a stream).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct KeepAliveAnswer {
    #[serde(default)]
    pub(crate) result: GrantAnswer,
}

/// What the gateway sends for a failed call, and inside a stream.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorAnswer {
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) error: serde_json::Value,
}

impl ErrorAnswer {
    /// The most specific text the gateway gave.
    pub(crate) fn text(&self) -> String {
        if !self.message.is_empty() {
            return self.message.clone();
        }
        match &self.error {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o
                .get("message")
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| self.error.to_string(), str::to_string),
            other => other.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_ff() {
        assert_eq!(prefix_end(b"XLLM:"), b"XLLM;".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn gateway_json_decodes_with_omitted_defaults() {
        let text = r#"{"header":{"revision":"7"},"kvs":[{"key":"YQ==","mod_revision":"3",
            "value":"dg==","lease":"12"},{"key":"Yg=="}],"count":"2"}"#;
        let answer: RangeAnswer = serde_json::from_str(text).unwrap();
        assert_eq!(answer.header.revision, 7);
        assert_eq!(answer.kvs[0].key, b"a");
        assert_eq!(answer.kvs[0].value, b"v");
        assert_eq!(answer.kvs[0].lease, 12);
        assert_eq!(answer.kvs[1], KeyValue { key: b"b".to_vec(), ..KeyValue::default() });
    }

    #[test]
    fn bad_integers_and_base64_are_errors() {
        assert!(serde_json::from_str::<Header>(r#"{"revision":"x"}"#).is_err());
        assert!(serde_json::from_str::<KeyValue>(r#"{"key":"!!"}"#).is_err());
    }
}
