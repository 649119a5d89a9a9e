//! A small etcd v3 client over etcd's JSON gateway: plain HTTP/1.1 POSTs to `/v3/...` on the
//! client port, which every etcd since 3.4 serves. No gRPC and no generated code, so building
//! it needs no `protoc` and no system library.
//!
//! It has what kvdir and its simulated engines need and nothing more: ranges (paged, at one
//! revision), put and delete, leases (grant, keepalive, revoke) and watches of several key
//! ranges on one connection. Every unary call is bounded by the client's request timeout; a
//! watch has none, and relies on TCP keepalive (a few seconds) to notice a vanished etcd.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

mod watch;
mod wire;

pub use watch::{Event, Watch, WatchResponse, MAX_WATCH_MESSAGE_BYTES};
pub use wire::{prefix_end, KeyValue};

use wire::{
    b64, DeleteAnswer, ErrorAnswer, GrantAnswer, HeaderAnswer, KeepAliveAnswer, RangeAnswer,
};

/// Keys per page of a range.
const PAGE: u64 = 1000;

/// What can go wrong talking to etcd. Every message names the endpoint and the operation.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The endpoint is not `host:port` or `http://host:port`.
    #[error("etcd endpoint {endpoint:?} is not host:port or http://host:port")]
    BadEndpoint {
        /// The value given.
        endpoint: String,
    },
    /// No answer: connection refused, reset or timed out.
    #[error("etcd {endpoint}: {op}: {detail} (is etcd running and reachable there?)")]
    Transport {
        /// The etcd endpoint.
        endpoint: String,
        /// The operation.
        op: &'static str,
        /// What the HTTP client said.
        detail: String,
    },
    /// etcd answered with an error.
    #[error("etcd {endpoint}: {op}: HTTP {status}: {message}")]
    Server {
        /// The etcd endpoint.
        endpoint: String,
        /// The operation.
        op: &'static str,
        /// The HTTP status (200 for an error inside a watch stream).
        status: u16,
        /// etcd's message.
        message: String,
    },
    /// etcd's answer could not be read.
    #[error("etcd {endpoint}: {op}: unexpected answer: {detail}")]
    BadAnswer {
        /// The etcd endpoint.
        endpoint: String,
        /// The operation.
        op: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// A watch message was larger than [`MAX_WATCH_MESSAGE_BYTES`].
    #[error("etcd {endpoint}: a watch message exceeded {limit} bytes")]
    TooLarge {
        /// The etcd endpoint.
        endpoint: String,
        /// The limit.
        limit: usize,
    },
}

impl EtcdError {
    pub(crate) fn transport(endpoint: &str, op: &'static str, e: &reqwest::Error) -> EtcdError {
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            detail = format!("{detail}: {cause}");
            source = cause.source();
        }
        EtcdError::Transport { endpoint: endpoint.into(), op, detail }
    }
}

/// The keys of a range, all read at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Range {
    /// The revision the keys were read at; watch from `revision + 1` to miss nothing.
    pub revision: i64,
    /// The keys in key order.
    pub kvs: Vec<KeyValue>,
}

/// An etcd client for one endpoint. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    endpoint: String,
    timeout: Duration,
}

impl Client {
    /// A client for `endpoint` (`host:port` or `http://host:port`) whose unary calls take at
    /// most `timeout`. Connects lazily: a down etcd is reported by the first call.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Client, EtcdError> {
        let bad = || EtcdError::BadEndpoint { endpoint: endpoint.to_string() };
        let host_port = endpoint.trim().trim_start_matches("http://").trim_end_matches('/');
        if host_port.is_empty() || host_port.contains('/') || !host_port.contains(':') {
            return Err(bad());
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .tcp_keepalive(Duration::from_secs(2))
            .tcp_keepalive_interval(Duration::from_secs(1))
            .tcp_keepalive_retries(3)
            .build()
            .map_err(|_| bad())?;
        Ok(Client {
            http,
            base: format!("http://{host_port}"),
            endpoint: host_port.into(),
            timeout,
        })
    }

    /// The endpoint as `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every key starting with `prefix`, at `revision` (0: the latest), read in pages. The
    /// answer's `revision` is the one the keys were read at (`revision` when it was not 0).
    pub async fn range_prefix(&self, prefix: &[u8], revision: i64) -> Result<Range, EtcdError> {
        let end = prefix_end(prefix);
        let mut start = prefix.to_vec();
        let mut range = Range { revision, kvs: Vec::new() };
        loop {
            let body = json!({"key": b64(&start), "range_end": b64(&end),
                              "revision": range.revision.to_string(), "limit": PAGE.to_string()});
            let page: RangeAnswer = self.call("range", "/v3/kv/range", &body).await?;
            // The header carries etcd's current revision, not the one read at: pin the
            // first page's, so every page (and every prefix of a listing) is one snapshot.
            if range.revision == 0 {
                range.revision = page.header.revision;
            }
            let Some(last) = page.kvs.last() else { return Ok(range) };
            start = last.key.clone();
            start.push(0);
            range.kvs.extend(page.kvs);
            if !page.more {
                return Ok(range);
            }
        }
    }

    /// One key, or `None`.
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let body = json!({"key": b64(key)});
        let answer: RangeAnswer = self.call("get", "/v3/kv/range", &body).await?;
        Ok(answer.kvs.into_iter().next())
    }

    /// Puts `key` (attached to `lease` unless it is 0); returns the new revision.
    pub async fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64, EtcdError> {
        let mut body = json!({"key": b64(key), "value": b64(value)});
        if lease != 0 {
            body["lease"] = Value::String(lease.to_string());
        }
        let answer: HeaderAnswer = self.call("put", "/v3/kv/put", &body).await?;
        Ok(answer.header.revision)
    }

    /// Deletes `key`; returns how many keys went (0 or 1).
    pub async fn delete(&self, key: &[u8]) -> Result<i64, EtcdError> {
        let body = json!({"key": b64(key)});
        let answer: DeleteAnswer = self.call("delete", "/v3/kv/deleterange", &body).await?;
        Ok(answer.deleted)
    }

    /// Deletes every key starting with `prefix`; returns how many went.
    pub async fn delete_prefix(&self, prefix: &[u8]) -> Result<i64, EtcdError> {
        let body = json!({"key": b64(prefix), "range_end": b64(&prefix_end(prefix))});
        let answer: DeleteAnswer = self.call("delete", "/v3/kv/deleterange", &body).await?;
        Ok(answer.deleted)
    }

    /// Compacts the history up to `revision` (tests use it to make watches fail).
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let body = json!({"revision": revision.to_string(), "physical": true});
        self.call::<HeaderAnswer>("compact", "/v3/kv/compaction", &body).await.map(|_| ())
    }

    /// A new lease of `ttl_s` seconds; returns its id.
    pub async fn lease_grant(&self, ttl_s: i64) -> Result<i64, EtcdError> {
        let body = json!({"TTL": ttl_s.to_string()});
        let answer: GrantAnswer = self.call("lease grant", "/v3/lease/grant", &body).await?;
        if !answer.error.is_empty() || answer.id == 0 {
            let message = format!("no lease granted: {:?}", answer.error);
            return Err(self.server_error("lease grant", 200, message));
        }
        Ok(answer.id)
    }

    /// Refreshes lease `id`; returns its TTL in seconds, 0 when the lease no longer exists.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, EtcdError> {
        let body = json!({"ID": id.to_string()});
        let answer: KeepAliveAnswer =
            self.call("lease keepalive", "/v3/lease/keepalive", &body).await?;
        Ok(answer.result.ttl)
    }

    /// Revokes lease `id` (its keys go with it); `Ok(false)` when it did not exist.
    pub async fn lease_revoke(&self, id: i64) -> Result<bool, EtcdError> {
        let body = json!({"ID": id.to_string()});
        match self.call::<HeaderAnswer>("lease revoke", "/v3/lease/revoke", &body).await {
            Ok(_) => Ok(true),
            Err(EtcdError::Server { message, .. }) if message.contains("lease not found") => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Watches the keys in `[start, end)` of each range from `start_revision`, one watcher
    /// per range on one connection; watch ids follow the order of `ranges`, from 0. etcd orders
    /// events within one watcher only: a catching-up watcher's older events can arrive after
    /// another's newer ones, so watch one range where order across keys matters.
    pub async fn watch_ranges<K: AsRef<[u8]>, E: AsRef<[u8]>>(
        &self,
        ranges: &[(K, E)],
        start_revision: i64,
        progress_notify: bool,
    ) -> Result<Watch, EtcdError> {
        let mut body = String::new();
        for (start, end) in ranges {
            let create = json!({"create_request": {
                "key": b64(start.as_ref()), "range_end": b64(end.as_ref()),
                "start_revision": start_revision.to_string(), "progress_notify": progress_notify}});
            body.push_str(&create.to_string());
            body.push('\n');
        }
        let url = format!("{}/v3/watch", self.base);
        let sent = self.http.post(url).body(body).send().await;
        let response = sent.map_err(|e| EtcdError::transport(&self.endpoint, "watch", &e))?;
        if !response.status().is_success() {
            return Err(self.failed("watch", response).await);
        }
        Ok(Watch { endpoint: self.endpoint.clone(), response, buffer: Vec::new() })
    }

    /// One unary call: POST `body` to `path`, decode the answer.
    async fn call<T: DeserializeOwned>(
        &self,
        op: &'static str,
        path: &str,
        body: &Value,
    ) -> Result<T, EtcdError> {
        let url = format!("{}{path}", self.base);
        let request = self.http.post(url).timeout(self.timeout).body(body.to_string());
        let response =
            request.send().await.map_err(|e| EtcdError::transport(&self.endpoint, op, &e))?;
        if !response.status().is_success() {
            return Err(self.failed(op, response).await);
        }
        let bytes =
            response.bytes().await.map_err(|e| EtcdError::transport(&self.endpoint, op, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| EtcdError::BadAnswer {
            endpoint: self.endpoint.clone(),
            op,
            detail: format!("{e} in {}", String::from_utf8_lossy(&bytes[..bytes.len().min(200)])),
        })
    }

    /// The error for a non-2xx answer, with etcd's message when it sent one.
    async fn failed(&self, op: &'static str, response: reqwest::Response) -> EtcdError {
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let message = match serde_json::from_str::<ErrorAnswer>(&text) {
            Ok(answer) => answer.text(),
            Err(_) => text.chars().take(200).collect(),
        };
        self.server_error(op, status, message)
    }

    fn server_error(&self, op: &'static str, status: u16, message: String) -> EtcdError {
        EtcdError::Server { endpoint: self.endpoint.clone(), op, status, message }
    }
}
