//! Shared by the binary tests: spawning the `kvdir` binary (reading the address it prints) and
//! a one-request-per-connection HTTP client for 127.0.0.1 (over `kvdir_sim::http::request`).

// Each test crate compiles this module and uses only part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `kvdir` binary of this build.
pub fn kvdir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvdir"))
}

/// A spawned `kvdir` that is killed (and reaped) when dropped, so a failing test leaves no
/// process behind.
pub struct Running {
    /// The process.
    pub child: Child,
    /// `host:port` it listens on.
    pub addr: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary, reads the address from its first line (after `prefix`), and keeps
/// draining its output so it never writes into a closed pipe.
pub fn spawn(args: &[&str], prefix: &str) -> Running {
    let mut child =
        kvdir().args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let addr = match line.trim().strip_prefix(prefix) {
        Some(addr) => addr.to_string(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("expected {prefix:?} on the first line, got {line:?}");
        }
    };
    Running { child, addr }
}

/// A response: status, the head (status line and headers) and the body.
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Status line and headers.
    pub head: String,
    /// Body.
    pub body: String,
}

/// One HTTP/1.1 exchange; `token` goes in `X-Internal-Token`.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let headers: Vec<(&str, &str)> = token.map(|t| ("X-Internal-Token", t)).into_iter().collect();
    let r = kvdir_sim::http::request(addr, method, path, &headers, body, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{method} {path} to {addr}: {e}"));
    Reply { status: r.status, head: r.head, body: r.body }
}

/// `POST` of a JSON body without a token; the response body.
pub fn post_to(addr: &str, path: &str, body: &str) -> String {
    request(addr, "POST", path, None, Some(body)).body
}
