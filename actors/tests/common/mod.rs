//! Shared by the binary tests: spawning the `kvdir` binary (reading the address it prints) and
//! a one-request-per-connection HTTP client for 127.0.0.1.

// Each test crate compiles this module and uses only part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

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
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("X-Internal-Token: {t}\r\n"));
    }
    let body = body.unwrap_or("");
    req.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Reply { status, head: head.to_string(), body: body.to_string() }
}

/// `POST` of a JSON body without a token; the response body.
pub fn post_to(addr: &str, path: &str, body: &str) -> String {
    request(addr, "POST", path, None, Some(body)).body
}
