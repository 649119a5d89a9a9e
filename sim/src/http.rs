//! Just enough HTTP/1.1 over std sockets: the engine's business-port server (`HealthServer`,
//! `GET /health` only, bound on 127.0.0.1) and a one-shot client ([`request`]) used for
//! heartbeats, for waiting on etcd's `/health`, and by tests.
//!
//! Every exchange is one request per connection (`Connection: close`), with read and write
//! timeouts and a size cap, so a silent or chatty peer cannot hold a thread.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tracing::debug;

use crate::SimError;

/// How often the accept loop looks at its stop flag while no client connects.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Read/write timeout of one server-side exchange.
const SERVER_IO_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest request head or response the code reads.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The `GET /health` server of a running engine; stops (and frees the port) on drop.
pub(crate) struct HealthServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HealthServer {
    /// Binds 127.0.0.1:`port` and serves on a thread named after the engine.
    pub(crate) fn start(port: u16, engine: &str) -> Result<HealthServer, SimError> {
        let http_err = |source| SimError::Http { port, source };
        let listener = TcpListener::bind(("127.0.0.1", port)).map_err(http_err)?;
        listener.set_nonblocking(true).map_err(http_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name(format!("sim-{engine}-http"))
            .spawn(move || serve(&listener, &flag))
            .map_err(http_err)?;
        Ok(HealthServer { stop, thread: Some(thread) })
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panicked server thread has nothing left to clean up.
            let _ = thread.join();
        }
    }
}

/// Accepts until `stop` is set; the listener closes when the thread returns.
fn serve(listener: &TcpListener, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = answer(stream) {
                    debug!(error = %e, "health request failed");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(e) => {
                debug!(error = %e, "accept failed");
                thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

fn answer(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(SERVER_IO_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVER_IO_TIMEOUT))?;
    let head = read_head(&mut stream)?;
    let request_line = head.lines().next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let (status, body) = if method == "GET" && path == "/health" {
        ("200 OK", r#"{"status":"ok"}"#)
    } else {
        ("404 Not Found", r#"{"error":"not found"}"#)
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes())?;
    stream.flush()
}

/// Reads up to the blank line that ends a request head (the body, if any, is ignored).
fn read_head(stream: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_MESSAGE_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request head too large"));
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// An HTTP response: status code, head and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, such as 200.
    pub status: u16,
    /// The status line and headers (lossy UTF-8).
    pub head: String,
    /// The body as text (lossy UTF-8).
    pub body: String,
}

/// Sends one request to `addr` (`host:port`) and reads the whole response. `body` (JSON) is
/// sent with a `Content-Length`; `headers` are extra `(name, value)` pairs. `timeout` bounds the
/// connect and every read and write.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<Response> {
    let mut stream = connect(addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut message = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        message.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        message.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        message.push_str("\r\n");
    }
    stream.write_all(message.as_bytes())?;
    stream.flush()?;
    let mut raw = Vec::new();
    stream.take(MAX_MESSAGE_BYTES as u64).read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// Connects to the first address `addr` resolves to that answers within `timeout`.
pub(crate) fn connect(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let mut last =
        io::Error::new(io::ErrorKind::InvalidInput, format!("{addr} resolves to nothing"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn parse_response(raw: &[u8]) -> io::Result<Response> {
    let text = String::from_utf8_lossy(raw);
    let bad =
        || io::Error::new(io::ErrorKind::InvalidData, format!("not an HTTP response: {text:.80}"));
    let status_line = text.lines().next().ok_or_else(bad)?;
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(bad)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok(Response { status, head: head.to_string(), body: body.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_served_until_drop_and_other_paths_are_404() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server = HealthServer::start(port, "t").unwrap();
        let addr = format!("127.0.0.1:{port}");
        let t = Duration::from_secs(2);
        let ok = request(&addr, "GET", "/health", &[], None, t).unwrap();
        assert_eq!((ok.status, ok.body.as_str()), (200, r#"{"status":"ok"}"#));
        assert_eq!(request(&addr, "GET", "/other", &[], None, t).unwrap().status, 404);
        assert_eq!(request(&addr, "POST", "/health", &[], Some("{}"), t).unwrap().status, 404);
        drop(server);
        assert!(request(&addr, "GET", "/health", &[], None, t).is_err());
        let again = HealthServer::start(port, "t").expect("the port is free again after drop");
        drop(again);
    }

    #[test]
    fn responses_parse_and_garbage_does_not() {
        let r = parse_response(b"HTTP/1.1 409 Conflict\r\nA: b\r\n\r\n{\"x\":1}").unwrap();
        assert_eq!((r.status, r.body.as_str()), (409, "{\"x\":1}"));
        assert_eq!(r.head, "HTTP/1.1 409 Conflict\r\nA: b");
        assert!(parse_response(b"SSH-2.0").is_err());
    }
}
