//! The load tool's keep-alive HTTP client: one [`Conn`] per client thread keeps its TCP
//! connection open between requests, as a router's connection pool would, so latencies measure
//! kvdir and not TCP set-up. (The simulator's [`kvdir_sim::http::request`] opens a connection per
//! request.)
//!
//! A [`Conn`] wraps its own `reqwest` blocking client, whose pool holds the connection; hyper
//! reads `Content-Length` and chunked bodies, and drops a pooled connection the server closed
//! (its keep-alive timeout) instead of sending on it. Bodies are read up to
//! [`MAX_BODY_BYTES`]; a longer one is an error.

use std::io;
use std::time::Duration;

use reqwest::blocking::Client;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use reqwest::Method;

pub use kvdir_sim::http::MAX_BODY_BYTES;
use kvdir_sim::http::{io_error, read_body};

/// A response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A keep-alive client of `addr`; its client (and connection) is made on first use.
#[derive(Debug)]
pub struct Conn {
    addr: String,
    token: Option<String>,
    timeout: Duration,
    client: Option<Client>,
}

impl Conn {
    /// A client of `addr` (`host:port`) sending `X-Internal-Token: token` when given; `timeout`
    /// bounds the connect and each whole exchange.
    pub fn new(addr: &str, token: Option<String>, timeout: Duration) -> Conn {
        Conn { addr: addr.to_string(), token, timeout, client: None }
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> io::Result<Reply> {
        self.exchange(Method::GET, path, None)
    }

    /// `POST path` with a JSON body.
    pub fn post(&mut self, path: &str, body: &[u8]) -> io::Result<Reply> {
        self.exchange(Method::POST, path, Some(body))
    }

    fn exchange(&mut self, method: Method, path: &str, body: Option<&[u8]>) -> io::Result<Reply> {
        let url = format!("http://{}{path}", self.addr);
        let mut request = self.client()?.request(method, url);
        if let Some(body) = body {
            request = request.header(CONTENT_TYPE, "application/json").body(body.to_vec());
        }
        let response = request.send().map_err(io_error)?;
        let status = response.status().as_u16();
        Ok(Reply { status, body: read_body(response)? })
    }

    fn client(&mut self) -> io::Result<&Client> {
        if self.client.is_none() {
            let mut headers = HeaderMap::new();
            if let Some(token) = &self.token {
                let mut value = HeaderValue::from_str(token).map_err(|_| {
                    let what = "the internal API token is not a valid header value";
                    io::Error::new(io::ErrorKind::InvalidInput, what)
                })?;
                value.set_sensitive(true);
                headers.insert("X-Internal-Token", value);
            }
            let client = Client::builder()
                .default_headers(headers)
                .connect_timeout(self.timeout)
                .timeout(self.timeout)
                .tcp_nodelay(true)
                .no_proxy()
                .build()
                .map_err(io_error)?;
            self.client = Some(client);
        }
        Ok(self.client.as_ref().expect("built above"))
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
