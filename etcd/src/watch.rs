//! A watch over the gateway: one `POST /v3/watch` whose body holds one `create_request` per
//! key range, answered by a never-ending chunked body of JSON messages (`{"result": ...}`, or
//! `{"error": ...}` when the stream fails). [`Watch::next`] reads one message at a time.

use serde::Deserialize;

use crate::wire::{int64, ErrorAnswer, Header, KeyValue};
use crate::EtcdError;

/// The largest single watch message accepted; a bigger one ends the watch with an error
/// (the caller lists again, which reads the same data page by page).
pub const MAX_WATCH_MESSAGE_BYTES: usize = 64 << 20;

/// One change of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The key was created or changed.
    Put(KeyValue),
    /// The key was deleted (or its lease expired); only `key` and `mod_revision` are set.
    Delete(KeyValue),
}

/// One message of a watch stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchResponse {
    /// etcd's revision when the message was sent.
    pub revision: i64,
    /// The watch this message belongs to (the order of the `create_request`s, from 0).
    pub watch_id: i64,
    /// The confirmation of a `create_request`.
    pub created: bool,
    /// The watch was cancelled: it delivers nothing more.
    pub canceled: bool,
    /// Why, when etcd said.
    pub cancel_reason: String,
    /// Set when the start revision was compacted away: the watch is cancelled.
    pub compact_revision: i64,
    /// The changes, in revision order.
    pub events: Vec<Event>,
}

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    result: Option<RawResponse>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Default, Deserialize)]
struct RawResponse {
    #[serde(default)]
    header: Header,
    #[serde(default, deserialize_with = "int64")]
    watch_id: i64,
    #[serde(default)]
    created: bool,
    #[serde(default)]
    canceled: bool,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default, deserialize_with = "int64")]
    compact_revision: i64,
    #[serde(default)]
    events: Vec<RawEvent>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    kv: KeyValue,
}

impl From<RawResponse> for WatchResponse {
    fn from(raw: RawResponse) -> WatchResponse {
        let events = raw
            .events
            .into_iter()
            .map(|e| if e.kind == "DELETE" { Event::Delete(e.kv) } else { Event::Put(e.kv) })
            .collect();
        WatchResponse {
            revision: raw.header.revision,
            watch_id: raw.watch_id,
            created: raw.created,
            canceled: raw.canceled,
            cancel_reason: raw.cancel_reason,
            compact_revision: raw.compact_revision,
            events,
        }
    }
}

/// An open watch stream. Dropping it closes the connection, which ends the watch in etcd.
#[derive(Debug)]
pub struct Watch {
    pub(crate) endpoint: String,
    pub(crate) response: reqwest::Response,
    pub(crate) buffer: Vec<u8>,
}

impl Watch {
    /// The next message; `Ok(None)` when etcd closed the stream.
    pub async fn next(&mut self) -> Result<Option<WatchResponse>, EtcdError> {
        loop {
            if let Some(message) = take_message(&mut self.buffer, &self.endpoint)? {
                return Ok(Some(message));
            }
            if self.buffer.len() > MAX_WATCH_MESSAGE_BYTES {
                return Err(EtcdError::TooLarge {
                    endpoint: self.endpoint.clone(),
                    limit: MAX_WATCH_MESSAGE_BYTES,
                });
            }
            let chunk = self
                .response
                .chunk()
                .await
                .map_err(|e| EtcdError::transport(&self.endpoint, "watch", &e))?;
            match chunk {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => return Ok(None),
            }
        }
    }
}

/// Takes the first complete JSON message out of `buffer`, if there is one.
fn take_message(buffer: &mut Vec<u8>, endpoint: &str) -> Result<Option<WatchResponse>, EtcdError> {
    let mut stream = serde_json::Deserializer::from_slice(buffer).into_iter::<Line>();
    let line = match stream.next() {
        None => {
            buffer.clear(); // Only whitespace.
            return Ok(None);
        }
        Some(Err(e)) if e.is_eof() => return Ok(None),
        Some(Err(e)) => {
            return Err(EtcdError::BadAnswer {
                endpoint: endpoint.into(),
                op: "watch",
                detail: e.to_string(),
            })
        }
        Some(Ok(line)) => line,
    };
    let used = stream.byte_offset();
    buffer.drain(..used);
    match (line.result, line.error) {
        (Some(result), _) => Ok(Some(result.into())),
        (None, Some(error)) => {
            let answer = ErrorAnswer { error, ..ErrorAnswer::default() };
            Err(EtcdError::Server {
                endpoint: endpoint.into(),
                op: "watch",
                status: 200,
                message: answer.text(),
            })
        }
        (None, None) => Err(EtcdError::BadAnswer {
            endpoint: endpoint.into(),
            op: "watch",
            detail: "a message with neither result nor error".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_across_chunks_are_reassembled() {
        let text = concat!(
            r#"{"result":{"header":{"revision":"2"},"created":true}}"#,
            "\n",
            r#"{"result":{"header":{"revision":"4"},"watch_id":"1","events":[{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"4"}},{"kv":{"key":"Yg==","value":"dg=="}}]}}"#,
            "\n"
        );
        let bytes = text.as_bytes();
        let mut buffer = bytes[..30].to_vec();
        assert_eq!(take_message(&mut buffer, "e").unwrap(), None);
        buffer.extend_from_slice(&bytes[30..]);
        let first = take_message(&mut buffer, "e").unwrap().unwrap();
        assert!(first.created);
        assert_eq!(first.revision, 2);
        let second = take_message(&mut buffer, "e").unwrap().unwrap();
        assert_eq!(second.watch_id, 1);
        let a = KeyValue { key: b"a".to_vec(), mod_revision: 4, ..KeyValue::default() };
        let b = KeyValue { key: b"b".to_vec(), value: b"v".to_vec(), ..KeyValue::default() };
        assert_eq!(second.events, vec![Event::Delete(a), Event::Put(b)]);
        assert_eq!(take_message(&mut buffer, "e").unwrap(), None);
        assert!(buffer.is_empty());
    }

    #[test]
    fn cancellation_and_errors_are_reported() {
        let mut buffer =
            br#"{"result":{"canceled":true,"compact_revision":"3"}}{"error":{"message":"boom"}}"#
                .to_vec();
        let cancelled = take_message(&mut buffer, "e").unwrap().unwrap();
        assert!(cancelled.canceled);
        assert_eq!(cancelled.compact_revision, 3);
        let error = take_message(&mut buffer, "e").unwrap_err();
        assert!(error.to_string().contains("boom"), "{error}");
        let mut garbage = b"not json".to_vec();
        assert!(take_message(&mut garbage, "e").is_err());
    }
}
