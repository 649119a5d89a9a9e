//! A keep-alive HTTP/1.1 client for the load tool: one [`Conn`] per client thread keeps its
//! TCP connection open between requests, as a router's connection pool would, so latencies
//! measure kvdir and not TCP set-up. (The crate's [`crate::http::request`] opens a connection
//! per request and caps responses at 64 KiB, too small for a 128-stream streams report.)
//!
//! A request on a reused connection that the server closed meanwhile (keep-alive timeout)
//! fails before any response byte; it is retried once on a fresh connection. Responses are
//! read by `Content-Length` or chunked encoding, up to [`MAX_BODY_BYTES`].

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::http::connect;

/// Largest response body read.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// A response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// One keep-alive connection to `addr`, opened on first use and after failures.
#[derive(Debug)]
pub struct Conn {
    addr: String,
    token: Option<String>,
    timeout: Duration,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    /// A client of `addr` (`host:port`) sending `X-Internal-Token: token` when given; `timeout`
    /// bounds the connect and every read and write.
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
        let reused = self.stream.is_some();
        match self.try_exchange(method, path, body) {
            Err(e) if reused && e.kind() == io::ErrorKind::ConnectionAborted => {
                self.try_exchange(method, path, body)
            }
            other => other,
        }
    }

    /// One attempt; a closed connection before the first response byte is `ConnectionAborted`.
    fn try_exchange(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> io::Result<Reply> {
        let request = self.request(method, path, body);
        let result = self.connected().and_then(|stream| {
            if let Err(e) = stream.get_mut().write_all(&request) {
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, e));
            }
            read_reply(stream)
        });
        match result {
            Ok((reply, keep)) => {
                if !keep {
                    self.stream = None;
                }
                Ok(reply)
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }

    fn connected(&mut self) -> io::Result<&mut BufReader<TcpStream>> {
        if self.stream.is_none() {
            let stream = connect(&self.addr, self.timeout)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(self.timeout))?;
            stream.set_write_timeout(Some(self.timeout))?;
            self.stream = Some(BufReader::new(stream));
        }
        Ok(self.stream.as_mut().expect("connected above"))
    }

    fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if let Some(token) = &self.token {
            head.push_str(&format!("X-Internal-Token: {token}\r\n"));
        }
        let body = body.unwrap_or_default();
        if method == "POST" {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// What the head of a response says.
struct Head {
    status: u16,
    length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
}

/// Reads the status line and headers.
fn read_head(stream: &mut BufReader<TcpStream>) -> io::Result<Head> {
    let mut line = String::new();
    if stream.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "connection closed"));
    }
    let status = line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid(format!("not an HTTP status line: {:.80}", line.trim())))?;
    let keep_alive = line.starts_with("HTTP/1.1");
    let mut head = Head { status, length: None, chunked: false, keep_alive };
    loop {
        line.clear();
        if stream.read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(head);
        }
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_ascii_lowercase());
        match name.as_str() {
            "content-length" => head.length = value.parse::<usize>().ok(),
            "transfer-encoding" => head.chunked = value.contains("chunked"),
            "connection" => head.keep_alive = value != "close",
            _ => {}
        }
    }
}

/// Reads one response; the flag says whether the connection may be reused.
fn read_reply(stream: &mut BufReader<TcpStream>) -> io::Result<(Reply, bool)> {
    let head = read_head(stream)?;
    let mut keep = head.keep_alive;
    let body = match (head.chunked, head.length) {
        (true, _) => read_chunked(stream)?,
        (false, Some(n)) if n > MAX_BODY_BYTES => {
            return Err(invalid(format!("response body of {n} bytes is over {MAX_BODY_BYTES}")))
        }
        (false, Some(n)) => {
            let mut body = vec![0; n];
            stream.read_exact(&mut body)?;
            body
        }
        (false, None) => {
            keep = false;
            let mut body = Vec::new();
            stream.take(MAX_BODY_BYTES as u64).read_to_end(&mut body)?;
            body
        }
    };
    Ok((Reply { status: head.status, body }, keep))
}

fn read_chunked(stream: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        stream.read_line(&mut line)?;
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("bad chunk size {:.40}", line.trim())))?;
        if body.len() + size > MAX_BODY_BYTES {
            return Err(invalid(format!("chunked body over {MAX_BODY_BYTES} bytes")));
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..])?;
        line.clear();
        stream.read_line(&mut line)?;
        if size == 0 {
            return Ok(body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// A server that answers each connection's requests with the given raw responses in turn.
    fn serve(responses: Vec<&'static str>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            for response in responses {
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
                    line.clear();
                }
                reader.get_mut().write_all(response.as_bytes()).unwrap();
            }
        });
        addr
    }

    #[test]
    fn keeps_the_connection_and_reads_length_and_chunked_bodies() {
        let addr = serve(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            "HTTP/1.1 503 Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        ]);
        let mut conn = Conn::new(&addr, None, Duration::from_secs(5));
        let a = conn.get("/a").unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, b"ok".as_slice()));
        let b = conn.get("/b").unwrap();
        assert_eq!((b.status, b.body.as_slice()), (503, b"abcde".as_slice()));
    }

    #[test]
    fn a_refused_connection_is_an_error() {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let mut conn = Conn::new(&addr, None, Duration::from_secs(1));
        assert!(conn.post("/x", b"{}").is_err());
    }
}
