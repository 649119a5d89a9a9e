//! HTTP client of the simulator: a one-shot client ([`request`], over `reqwest`'s blocking
//! client) used for heartbeats, for waiting on etcd's `/health`, by the demo, benches and tests.
//! (The engine's own HTTP server is [`crate::openai`]'s.)
//!
//! Every client exchange is one request per connection (`Connection: close`, no idle pool),
//! bounded by one overall timeout, and reads at most [`MAX_BODY_BYTES`], so a silent or chatty
//! peer cannot hold a thread.

use std::error::Error as _;
use std::io::{self, Read};
use std::sync::OnceLock;
use std::thread;
use std::time::Duration;

use reqwest::blocking::Client;
use reqwest::header::{CONNECTION, CONTENT_TYPE};

/// Largest response body a client reads. Large enough for the streams report of a big
/// fleet (128 streams are several hundred KiB); it only stops a runaway peer.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

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

/// Sends one request to `http://{addr}{path}` (`addr` is `host:port`) and reads the whole
/// response. `body` (JSON) is sent with `Content-Type: application/json`; `headers` are extra
/// `(name, value)` pairs. `timeout` bounds the whole exchange, connect to last body byte.
///
/// Callable from any thread, including one inside a tokio runtime (an async test that starts an
/// etcd, say): reqwest's blocking client panics there, so such a call runs on a scoped thread.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<Response> {
    let exchange = || exchange(&format!("http://{addr}{path}"), method, headers, body, timeout);
    if tokio::runtime::Handle::try_current().is_err() {
        return exchange();
    }
    thread::scope(|s| match s.spawn(exchange).join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

fn exchange(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<Response> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{method:?} is not an HTTP method"))
    })?;
    let mut builder =
        shared_client()?.request(method, url).timeout(timeout).header(CONNECTION, "close");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if let Some(body) = body {
        builder = builder.header(CONTENT_TYPE, "application/json").body(body.to_string());
    }
    let response = builder.send().map_err(io_error)?;
    let mut head = format!("{:?} {}", response.version(), response.status());
    for (name, value) in response.headers() {
        head.push_str(&format!("\r\n{name}: {}", String::from_utf8_lossy(value.as_bytes())));
    }
    let status = response.status().as_u16();
    let body = read_body(response)?;
    Ok(Response { status, head, body: String::from_utf8_lossy(&body).into_owned() })
}

/// The client behind [`request`], built on first use and never dropped (dropping a blocking
/// client inside a runtime would panic too). No idle pool and no proxy from the environment:
/// every request is its own connection straight to `addr`.
fn shared_client() -> io::Result<&'static Client> {
    static CLIENT: OnceLock<Result<Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let built = Client::builder().pool_max_idle_per_host(0).no_proxy().build();
            built.map_err(|e| io_error(e).to_string())
        })
        .as_ref()
        .map_err(|e| io::Error::other(format!("building the HTTP client: {e}")))
}

/// Reads a response body of at most [`MAX_BODY_BYTES`]; a longer one is an error, not a
/// truncated body.
pub fn read_body(response: reqwest::blocking::Response) -> io::Result<Vec<u8>> {
    let too_long = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("response body over {MAX_BODY_BYTES} bytes"),
        )
    };
    if response.content_length().is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_long());
    }
    let mut body = Vec::new();
    response.take(MAX_BODY_BYTES as u64 + 1).read_to_end(&mut body)?;
    if body.len() > MAX_BODY_BYTES {
        return Err(too_long());
    }
    Ok(body)
}

/// A reqwest error as an `io::Error` whose kind is the underlying one (`TimedOut`,
/// `ConnectionRefused`, ...) and whose text carries the whole cause chain, since reqwest's own
/// text ("error sending request for url ...") leaves out why.
pub fn io_error(e: reqwest::Error) -> io::Error {
    let mut kind = if e.is_timeout() { Some(io::ErrorKind::TimedOut) } else { None };
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            kind.get_or_insert(io.kind());
        }
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    io::Error::new(kind.unwrap_or(io::ErrorKind::Other), text)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::thread::JoinHandle;

    use super::*;

    /// Reads up to the blank line that ends a request head (the body, if any, is ignored).
    fn read_head(stream: &mut TcpStream) -> io::Result<String> {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&head).into_owned())
    }

    /// A server that answers one connection with `response` and returns the request it read.
    fn answer_once(response: String) -> (String, JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let head = read_head(&mut stream).unwrap();
            stream.write_all(response.as_bytes()).unwrap();
            head
        });
        (addr, server)
    }

    #[test]
    fn head_chunked_body_and_headers_are_read_and_sent() {
        let (addr, server) = answer_once(
            "HTTP/1.1 409 Conflict\r\nA: b\r\nTransfer-Encoding: chunked\r\n\r\n\
             3\r\n{\"x\r\n4\r\n\":1}\r\n0\r\n\r\n"
                .to_string(),
        );
        let t = Duration::from_secs(2);
        let r = request(&addr, "POST", "/p", &[("X-Internal-Token", "s")], Some("{}"), t).unwrap();
        assert_eq!((r.status, r.body.as_str()), (409, "{\"x\":1}"));
        assert!(r.head.starts_with("HTTP/1.1 409 Conflict\r\n"), "{}", r.head);
        assert!(r.head.contains("\r\na: b"), "{}", r.head);
        let sent = server.join().unwrap().to_ascii_lowercase();
        assert!(sent.starts_with("post /p http/1.1\r\n"), "{sent}");
        for header in ["x-internal-token: s", "content-type: application/json", "connection: close"]
        {
            assert!(sent.contains(header), "{header} in {sent}");
        }
    }

    #[test]
    fn a_body_over_the_cap_and_a_silent_peer_are_errors() {
        let big = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", MAX_BODY_BYTES + 1);
        let (addr, _server) = answer_once(big);
        let t = Duration::from_secs(2);
        let err = request(&addr, "GET", "/", &[], None, t).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");

        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let t = Duration::from_millis(200);
        let err = request(&addr, "GET", "/", &[], None, t).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    }

    #[tokio::test]
    async fn a_request_from_inside_a_runtime_does_not_panic() {
        let (addr, _server) = answer_once("HTTP/1.1 204 No Content\r\n\r\n".to_string());
        let r = request(&addr, "GET", "/", &[], None, Duration::from_secs(2)).unwrap();
        assert_eq!(r.status, 204);
    }
}
