//! One HTTP request per connection for tests, over the simulator's client
//! ([`kvdir_sim::http::request`], reqwest's blocking client): a transport error panics with the
//! method, path and address, so a test reads only status, head and body.

use std::time::Duration;

use serde_json::Value;

/// The longest a test request may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Status line and headers.
    pub head: String,
    /// Body as text.
    pub body: String,
}

impl Response {
    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Sends one request to `http://{addr}{path}`; `body` (JSON text) is sent when given.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response {
    let r = kvdir_sim::http::request(addr, method, path, headers, body, TIMEOUT)
        .unwrap_or_else(|e| panic!("{method} {path} to {addr}: {e}"));
    Response { status: r.status, head: r.head, body: r.body }
}
