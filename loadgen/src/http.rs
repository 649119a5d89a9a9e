//! The load tool's keep-alive HTTP/1.1 client: one [`Conn`] per client thread keeps its TCP
//! connection open between requests, as a router's connection pool would, so latencies measure
//! kvdir and not TCP set-up. (The simulator's [`kvdir_sim::http::request`] opens a connection per
//! request.)
//!
//! The exchange runs on the calling thread over a plain `TcpStream`: the request in one write,
//! then the status line, the headers and a `Content-Length` or chunked body, read up to
//! [`MAX_BODY_BYTES`] (a longer one is an error). A blocking `reqwest` client, used before,
//! hands every request and body read to its runtime's thread and back: two thread wake-ups a
//! request, which in the load tool (near a core busy with its simulated engines) added
//! milliseconds to what the clients measured of kvdir. A kept connection the server closed
//! meanwhile (its keep-alive timeout) fails before any byte of an answer; the request is then
//! sent once more on a new connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use kvdir_sim::http::MAX_BODY_BYTES;

/// Longest response head (status line and headers).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A response: status code, body and kvdir's `Server-Timing` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// The `Server-Timing` header's value, if any (kvdir's stages, [`crate::stages`]).
    pub server_timing: Option<String>,
}

/// A keep-alive client of `addr`; its connection is made on first use.
#[derive(Debug)]
pub struct Conn {
    addr: String,
    token: Option<String>,
    timeout: Duration,
    stream: Option<BufReader<TcpStream>>,
}

/// How an exchange on a kept connection failed.
enum Failure {
    /// Before any byte of an answer: the server may have closed the connection while idle.
    Stale(io::Error),
    /// Anything else.
    Other(io::Error),
}

impl Conn {
    /// A client of `addr` (`host:port`) sending `X-Internal-Token: token` when given; `timeout`
    /// bounds the connect and each whole exchange.
    pub fn new(addr: &str, token: Option<String>, timeout: Duration) -> Conn {
        Conn { addr: addr.to_string(), token, timeout, stream: None }
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> io::Result<Reply> {
        self.exchange("GET", path, None)
    }

    /// `POST path` with a JSON body.
    pub fn post(&mut self, path: &str, body: &[u8]) -> io::Result<Reply> {
        self.exchange("POST", path, Some(body))
    }

    fn exchange(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> io::Result<Reply> {
        let deadline = Instant::now() + self.timeout;
        let request = self.request(method, path, body);
        if let Some(mut stream) = self.stream.take() {
            match send(&mut stream, &request, deadline) {
                Ok((reply, keep)) => {
                    self.stream = keep.then_some(stream);
                    return Ok(reply);
                }
                Err(Failure::Other(e)) => return Err(e),
                Err(Failure::Stale(_)) => {}
            }
        }
        let mut stream = self.connect(deadline)?;
        match send(&mut stream, &request, deadline) {
            Ok((reply, keep)) => {
                self.stream = keep.then_some(stream);
                Ok(reply)
            }
            Err(Failure::Stale(e) | Failure::Other(e)) => Err(e),
        }
    }

    /// The request's bytes, written at once.
    fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        // When the request leaves, for kvdir's `wait` stage (the same clock on one machine).
        if let Ok(now) = SystemTime::now().duration_since(UNIX_EPOCH) {
            head.push_str(&format!("X-Request-Start: t={}\r\n", now.as_micros()));
        }
        if let Some(token) = &self.token {
            head.push_str(&format!("X-Internal-Token: {token}\r\n"));
        }
        if let Some(body) = body {
            head.push_str("Content-Type: application/json\r\n");
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        bytes
    }

    fn connect(&self, deadline: Instant) -> io::Result<BufReader<TcpStream>> {
        let addr = self.addr.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no address for {}", self.addr))
        })?;
        let stream = TcpStream::connect_timeout(&addr, remaining(deadline)?)?;
        stream.set_nodelay(true)?;
        Ok(BufReader::with_capacity(64 * 1024, stream))
    }
}

/// The time left before `deadline`; an error once it has passed.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    match left.is_zero() {
        true => Err(io::Error::new(io::ErrorKind::TimedOut, "the exchange timed out")),
        false => Ok(left),
    }
}

/// Bounds the next reads and writes of `stream` by `deadline`.
fn arm(stream: &BufReader<TcpStream>, deadline: Instant) -> io::Result<()> {
    let left = remaining(deadline)?;
    stream.get_ref().set_read_timeout(Some(left))?;
    stream.get_ref().set_write_timeout(Some(left))
}

/// A socket timeout reads as `WouldBlock` on Linux: reported as `TimedOut`.
fn timed_out(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(io::ErrorKind::TimedOut, e),
        _ => e,
    }
}

/// Sends `request` and reads the answer: the reply, and whether the connection may be kept.
fn send(
    stream: &mut BufReader<TcpStream>,
    request: &[u8],
    deadline: Instant,
) -> Result<(Reply, bool), Failure> {
    let stale = |e: io::Error| Failure::Stale(timed_out(e));
    arm(stream, deadline).map_err(Failure::Other)?;
    stream.get_mut().write_all(request).map_err(stale)?;
    let mut line = String::new();
    match stream.read_line(&mut line) {
        Ok(0) => return Err(stale(io::ErrorKind::UnexpectedEof.into())),
        Ok(_) => {}
        Err(e) => return Err(stale(e)),
    }
    read_reply(stream, &line, deadline).map_err(|e| Failure::Other(timed_out(e)))
}

/// The rest of an answer whose status line is `status_line`.
fn read_reply(
    stream: &mut BufReader<TcpStream>,
    status_line: &str,
    deadline: Instant,
) -> io::Result<(Reply, bool)> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| invalid(format!("not an HTTP status line: {status_line:?}")))?;
    let (mut length, mut chunked, mut keep, mut head) = (None, false, true, status_line.len());
    let mut server_timing = None;
    loop {
        let mut line = String::new();
        arm(stream, deadline)?;
        if stream.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head += line.len();
        if head > MAX_HEAD_BYTES {
            return Err(invalid(format!("response head over {MAX_HEAD_BYTES} bytes")));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else { continue };
        if name.trim().eq_ignore_ascii_case("server-timing") {
            server_timing = Some(value.trim().to_string());
            continue;
        }
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_ascii_lowercase());
        match name.as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.contains("chunked"),
            "connection" => keep &= value != "close",
            _ => {}
        }
    }
    let body = match (status, chunked, length) {
        (204 | 304, _, _) => Vec::new(),
        (_, true, _) => read_chunked(stream, deadline)?,
        (_, false, Some(n)) => read_exact(stream, n, deadline)?,
        (_, false, None) => {
            keep = false;
            read_to_end(stream, deadline)?
        }
    };
    Ok((Reply { status, body, server_timing }, keep))
}

fn too_long() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("response body over {MAX_BODY_BYTES} bytes"))
}

fn read_exact(
    stream: &mut BufReader<TcpStream>,
    n: usize,
    deadline: Instant,
) -> io::Result<Vec<u8>> {
    if n > MAX_BODY_BYTES {
        return Err(too_long());
    }
    let mut body = vec![0; n];
    arm(stream, deadline)?;
    stream.read_exact(&mut body)?;
    Ok(body)
}

fn read_to_end(stream: &mut BufReader<TcpStream>, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    arm(stream, deadline)?;
    stream.take(MAX_BODY_BYTES as u64 + 1).read_to_end(&mut body)?;
    match body.len() > MAX_BODY_BYTES {
        true => Err(too_long()),
        false => Ok(body),
    }
}

fn read_chunked(stream: &mut BufReader<TcpStream>, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        arm(stream, deadline)?;
        stream.read_line(&mut line)?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}"))
        })?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                line.clear();
                if stream.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY_BYTES {
            return Err(too_long());
        }
        let start = body.len();
        body.resize(start + size + 2, 0);
        stream.read_exact(&mut body[start..])?;
        body.truncate(start + size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::thread::{self, JoinHandle};

    /// A server that accepts one connection, answers its requests with the given raw responses
    /// in turn, and returns the request heads it read.
    fn serve(responses: Vec<String>) -> (String, JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut heads = Vec::new();
            for response in responses {
                let mut head = String::new();
                while reader.read_line(&mut head).unwrap() > 0 && !head.ends_with("\r\n\r\n") {}
                heads.push(head);
                reader.get_mut().write_all(response.as_bytes()).unwrap();
            }
            heads
        });
        (addr, server)
    }

    #[test]
    fn keeps_the_connection_and_reads_length_and_chunked_bodies() {
        let (addr, server) = serve(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string(),
            "HTTP/1.1 503 Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                .to_string(),
        ]);
        let mut conn = Conn::new(&addr, Some("s3cret".into()), Duration::from_secs(5));
        let a = conn.get("/a").unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, b"ok".as_slice()));
        let b = conn.get("/b").unwrap();
        assert_eq!((b.status, b.body.as_slice()), (503, b"abcde".as_slice()));
        let heads = server.join().expect("both requests came on the one connection");
        assert!(heads.iter().all(|h| h.to_ascii_lowercase().contains("x-internal-token: s3cret")));
    }

    #[test]
    fn a_kept_connection_the_server_closed_is_replaced() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = thread::spawn(move || {
            for body in ["one", "two"] {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut head = String::new();
                while reader.read_line(&mut head).unwrap() > 0 && !head.ends_with("\r\n\r\n") {}
                let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{body}");
                reader.get_mut().write_all(reply.as_bytes()).unwrap();
                // Dropped: the connection closes while the client keeps it.
            }
        });
        let mut conn = Conn::new(&addr, None, Duration::from_secs(5));
        assert_eq!(conn.get("/a").unwrap().body, b"one");
        assert_eq!(conn.get("/b").unwrap().body, b"two");
        server.join().unwrap();
    }

    #[test]
    fn a_refused_connection_is_an_error() {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let mut conn = Conn::new(&addr, None, Duration::from_secs(1));
        let err = conn.post("/x", b"{}").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    }

    #[test]
    fn a_body_over_the_cap_is_an_error() {
        let (addr, _server) = serve(vec![format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        )]);
        let mut conn = Conn::new(&addr, None, Duration::from_secs(5));
        let err = conn.get("/big").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
