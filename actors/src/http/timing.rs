//! Where a query's or a route's time goes inside kvdir: each answer of
//! `POST /v1/internal/kv-cache/query` and `POST /v1/internal/route` carries a `Server-Timing`
//! header (W3C Server Timing) with the duration of each stage of its handler, in milliseconds:
//!
//! - `wait`: from the client's `X-Request-Start` (`t=<microseconds since the Unix epoch>`, the
//!   convention of nginx and Heroku; absent without the header) to the handler's start: the
//!   request's trip through the kernel and its wait for an HTTP worker;
//! - `body`: reading the body; `parse`: its token ids and scope;
//! - `read`: the directory read (for a query, the answer's JSON too);
//! - `lock`: waiting for the router's lock; `decide`: the decision under it;
//! - `json`: the route answer's JSON;
//! - `handler`: the whole handler, from its start to its answer.
//!
//! What a client measures beyond `wait` and `handler` is writing the answer and reading it.
//! A stage costs two clock reads; `kvdir-bench` collects the header per request, and `/metrics`
//! keeps every answered request's stages in histograms (`kvdir_request_stage_duration_seconds`,
//! [`STAGES`]).

use std::fmt::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::HttpRequest;

/// The request header a client may send: when it sent the request.
pub const REQUEST_START: &str = "X-Request-Start";
/// The answer's header.
pub const SERVER_TIMING: &str = "Server-Timing";

/// Every stage a handler may time, `wait` first: the `stage` label of
/// `kvdir_request_stage_duration_seconds`.
pub const STAGES: [&str; 7] = ["wait", "body", "parse", "read", "lock", "decide", "json"];

/// The stages of one handler, in the order they ran.
#[derive(Debug)]
pub struct Stages {
    started: Instant,
    last: Instant,
    /// The client's send time to the handler's start, when the client gave it.
    wait: Option<Duration>,
    done: Vec<(&'static str, Duration)>,
}

impl Stages {
    /// Starts timing the handler of `req`, now.
    pub fn start(req: &HttpRequest) -> Self {
        let now = Instant::now();
        let wait = req.headers().get(REQUEST_START).and_then(|v| waited(v.as_bytes()));
        Stages { started: now, last: now, wait, done: Vec::with_capacity(8) }
    }

    /// When the handler started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Ends stage `name` now (it began when the previous one ended).
    pub fn end(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done.push((name, now - self.last));
        self.last = now;
    }

    /// Ends stage `name` that took `took` of the time since the previous one ended, and the
    /// stage `rest` that took the remainder (a stage measured inside a call, as the lock's wait).
    pub fn split(&mut self, (name, took): (&'static str, Duration), rest: &'static str) {
        let now = Instant::now();
        let whole = now - self.last;
        self.done.push((name, took.min(whole)));
        self.done.push((rest, whole.saturating_sub(took)));
        self.last = now;
    }

    /// Each stage that ran, `wait` first when the client gave its send time, with its position
    /// in [`STAGES`].
    pub fn each(&self) -> impl Iterator<Item = (usize, Duration)> + '_ {
        let wait = self.wait.map(|w| ("wait", w));
        wait.into_iter().chain(self.done.iter().copied()).filter_map(|(name, d)| {
            let at = STAGES.iter().position(|&s| s == name);
            debug_assert!(at.is_some(), "stage {name} is not in STAGES");
            Some((at?, d))
        })
    }

    /// The `Server-Timing` header's value: each stage, then the whole handler.
    pub fn header(&self) -> String {
        let mut out = String::with_capacity(160);
        let mut put = |name: &str, d: Duration| {
            let sep = if out.is_empty() { "" } else { ", " };
            let _ = write!(out, "{sep}{name};dur={:.3}", d.as_secs_f64() * 1e3);
        };
        if let Some(w) = self.wait {
            put("wait", w);
        }
        for &(name, d) in &self.done {
            put(name, d);
        }
        put("handler", self.started.elapsed());
        out
    }
}

/// The time since `t=<microseconds since the Unix epoch>` (or the bare number), if it parses;
/// zero for a time ahead of this clock.
fn waited(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let micros: u64 = text.strip_prefix("t=").unwrap_or(text).parse().ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    Some(now.saturating_sub(Duration::from_micros(micros)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn the_header_lists_each_stage_then_the_handler() {
        let req = TestRequest::default().to_http_request();
        let mut s = Stages::start(&req);
        s.end("body");
        s.split(("lock", Duration::from_secs(3600)), "decide");
        let h = s.header();
        let names: Vec<&str> = h.split(", ").map(|p| p.split(';').next().unwrap()).collect();
        assert_eq!(names, ["body", "lock", "decide", "handler"], "{h}");
        let durs: Vec<f64> =
            h.split(", ").map(|p| p.split("dur=").nth(1).unwrap().parse().unwrap()).collect();
        // A stage measured inside a call cannot take longer than the time it was part of.
        assert!(durs[1] < 1000.0 && durs[2] == 0.0, "{h}");
    }

    #[test]
    fn each_stage_is_given_with_its_place_in_the_metrics_list() {
        let sent = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() - Duration::from_secs(1);
        let value = format!("t={}", sent.as_micros());
        let req = TestRequest::default().insert_header((REQUEST_START, value)).to_http_request();
        let mut s = Stages::start(&req);
        s.end("parse");
        s.split(("lock", Duration::ZERO), "decide");
        let names: Vec<&str> = s.each().map(|(i, _)| STAGES[i]).collect();
        assert_eq!(names, ["wait", "parse", "lock", "decide"]);
        let wait = s.each().next().unwrap().1;
        assert!(wait >= Duration::from_secs(1), "{wait:?}");
        let plain = Stages::start(&TestRequest::default().to_http_request());
        assert_eq!(plain.each().count(), 0, "no wait without the client's send time");
    }

    #[test]
    fn wait_is_measured_from_the_clients_send_time() {
        let sent = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() - Duration::from_secs(2);
        let value = format!("t={}", sent.as_micros());
        let req = TestRequest::default().insert_header((REQUEST_START, value)).to_http_request();
        let h = Stages::start(&req).header();
        let wait: f64 =
            h.strip_prefix("wait;dur=").unwrap().split(',').next().unwrap().parse().unwrap();
        assert!((2000.0..3000.0).contains(&wait), "{h}");
        assert_eq!(waited(b"t=not a number"), None);
        assert_eq!(waited(b"99999999999999999"), Some(Duration::ZERO), "a time ahead is 0");
    }
}
