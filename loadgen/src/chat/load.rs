//! The chat workload and its clients.
//!
//! [`Workload`]: `--system_prompts` long system prompts (a numbered first line, then the demo
//! corpus repeated to about `--system_prompt_tokens` tokens of the demo tokenizer) and, for
//! request `k`, a system prompt picked by a fixed hash of `k` plus a user turn unique to `k`.
//!
//! [`run_clients`]: `--clients` threads, each with its own keep-alive `reqwest` client, take
//! the next request number from a shared counter until `--requests` are taken or the duration
//! passes, and send `POST /v1/chat/completions` to kvdir or, with `--direct`, to engine
//! `k mod N`. A request counts when the answer is 200 and its body (or, streaming, its `data:`
//! lines) is read to the end; its `usage` gives prompt and cached tokens (streaming asks for
//! it with `stream_options.include_usage`). Latency runs from sending to the last byte; TTFT
//! to the first `data:` line when streaming, else it equals the latency.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kvdir_text::TextModel;
use reqwest::blocking::Client;
use serde_json::{json, Value};

use super::super::BenchError;
use super::flags::ChatOptions;

/// Upper bound of one request, head to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The prompts of a run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The system prompts.
    pub system: Vec<String>,
    model: String,
    max_tokens: u32,
    stream: bool,
}

impl Workload {
    /// Builds the system prompts, sized with `model`'s tokenizer.
    pub fn new(o: &ChatOptions, model: &TextModel) -> Workload {
        let corpus = kvdir_text::demo::CORPUS;
        let tokens = model.encode(corpus, false).map_or(corpus.len() / 3, |t| t.len()).max(1);
        let chars = o.system_prompt_tokens * corpus.len() / tokens;
        let system = (0..o.system_prompts)
            .map(|s| {
                let mut text = format!("You are assistant {s} of the kvdir chat bench.\n");
                while text.len() < chars {
                    text.push_str(corpus);
                }
                let end = (0..=chars.max(1)).rev().find(|&i| text.is_char_boundary(i));
                text.truncate(end.unwrap_or(text.len()));
                text
            })
            .collect();
        let (model, max_tokens, stream) = (o.served_model_name.clone(), o.max_tokens, o.stream);
        Workload { system, model, max_tokens, stream }
    }

    /// The JSON body of request `k`.
    pub fn body(&self, k: u64) -> Vec<u8> {
        let system = &self.system[(mix(k) % self.system.len() as u64) as usize];
        self.body_with(system, k)
    }

    /// The JSON body of every sibling of group `g` (`--siblings`): a system prompt behind a
    /// first line unique to the group, so that no engine holds any of it beforehand.
    pub fn sibling_body(&self, g: u64) -> Vec<u8> {
        let system = &self.system[(mix(g) % self.system.len() as u64) as usize];
        self.body_with(&format!("Sibling group {g}.\n{system}"), g)
    }

    fn body_with(&self, system: &str, k: u64) -> Vec<u8> {
        let user = format!("Request {k}: what does the directory know about session {k}?");
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        });
        if self.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// SplitMix64 of `k`: request `k`'s system prompt, spread so that neither kvdir's RR nor
/// `--direct`'s round-robin lines up with the prompts by accident.
fn mix(k: u64) -> u64 {
    let mut z = k.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the clients saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatStats {
    /// Latencies of served requests, sorted.
    pub latencies: Vec<Duration>,
    /// Times to first token of served requests, sorted.
    pub ttft: Vec<Duration>,
    /// Failed requests by `HTTP <status>` or `transport: ...`.
    pub errors: BTreeMap<String, u64>,
    /// Prompt tokens of the served requests, from `usage`.
    pub prompt_tokens: u64,
    /// Cached prompt tokens, from `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// Served requests by `x-kvdir-instance` (or the engine, with `--direct`).
    pub instances: BTreeMap<String, u64>,
    /// From the first request to the last answer.
    pub wall: Duration,
    /// `--siblings`: groups whose every sibling was served.
    pub sibling_groups: u64,
    /// `--siblings`: over those groups, the siblings on their group's most used instance.
    pub siblings_together: u64,
    /// `--siblings`: the largest gap between a group's first and last send.
    pub sibling_spread: Duration,
}

impl ChatStats {
    pub(super) fn merge(&mut self, other: ChatStats) {
        self.latencies.extend(other.latencies);
        self.ttft.extend(other.ttft);
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        for (k, n) in other.instances {
            *self.instances.entry(k).or_default() += n;
        }
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.wall = self.wall.max(other.wall);
        self.sibling_groups += other.sibling_groups;
        self.siblings_together += other.siblings_together;
        self.sibling_spread = self.sibling_spread.max(other.sibling_spread);
    }
}

/// Where the requests go: kvdir's address, or the engines' in turn.
pub struct Targets {
    /// `host:port` list; request `k` goes to `addrs[k mod len]`.
    pub addrs: Vec<String>,
    /// The instance of a direct request (no `x-kvdir-instance` header).
    pub direct: bool,
}

/// Runs the clients until every request is taken or `o.duration` passes.
pub fn run_clients(
    o: &ChatOptions,
    work: &Workload,
    targets: &Targets,
) -> Result<ChatStats, BenchError> {
    if o.siblings > 1 {
        return super::siblings::run_groups(o, work, targets);
    }
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let pace = Pace { start, deadline: start + o.duration, rate: o.rate };
    let client = http_client()?;
    thread::scope(|scope| {
        let handles: Vec<_> = (0..o.clients)
            .map(|_| {
                let client = client.clone();
                let (next, limit) = (&next, o.requests);
                scope.spawn(move || client_loop(&client, work, targets, (next, limit), pace))
            })
            .collect();
        let mut stats = ChatStats::default();
        for handle in handles {
            stats.merge(handle.join().map_err(|_| BenchError::Panicked("a chat client"))?);
        }
        stats.latencies.sort();
        stats.ttft.sort();
        Ok(stats)
    })
}

/// The clients' HTTP client (keep-alive, no Nagle, no proxy).
pub(super) fn http_client() -> Result<Client, BenchError> {
    Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .map_err(|e| BenchError::Kvdir(format!("cannot build the HTTP client: {e}")))
}

/// When the clients send: closed loop (`rate` 0), or request `k` due at `start + k / rate`.
#[derive(Debug, Clone, Copy)]
struct Pace {
    start: Instant,
    deadline: Instant,
    rate: f64,
}

impl Pace {
    /// Waits until request `k` is due; when it was due (now, in a closed loop).
    fn due(&self, k: u64) -> Instant {
        if self.rate <= 0.0 {
            return Instant::now();
        }
        let due = self.start + Duration::from_secs_f64(k as f64 / self.rate);
        thread::sleep(due.saturating_duration_since(Instant::now()));
        due
    }
}

fn client_loop(
    client: &Client,
    work: &Workload,
    targets: &Targets,
    (next, limit): (&AtomicU64, u64),
    pace: Pace,
) -> ChatStats {
    let mut stats = ChatStats::default();
    let start = Instant::now();
    loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        if k >= limit || Instant::now() >= pace.deadline {
            break;
        }
        let addr = &targets.addrs[(k % targets.addrs.len() as u64) as usize];
        // Open loop: timed from when the request was due, so a late send counts (no
        // coordinated omission).
        let t0 = pace.due(k);
        match one(client, addr, work.body(k), work.stream) {
            Ok(a) => {
                stats.latencies.push(t0.elapsed());
                stats.ttft.push(a.first.map_or(t0.elapsed(), |f| f - t0));
                stats.prompt_tokens += a.prompt_tokens;
                stats.cached_tokens += a.cached_tokens;
                let instance = if targets.direct { addr.clone() } else { a.instance };
                *stats.instances.entry(instance).or_default() += 1;
            }
            Err(e) => *stats.errors.entry(e).or_default() += 1,
        }
    }
    stats.wall = start.elapsed();
    stats
}

/// One served answer.
pub(super) struct Answer {
    pub(super) first: Option<Instant>,
    pub(super) prompt_tokens: u64,
    pub(super) cached_tokens: u64,
    pub(super) instance: String,
}

/// Sends one request; the error is its key in [`ChatStats::errors`].
pub(super) fn one(
    client: &Client,
    addr: &str,
    body: Vec<u8>,
    stream: bool,
) -> Result<Answer, String> {
    let url = format!("http://{addr}/v1/chat/completions");
    let request = client.post(url).header("content-type", "application/json").body(body);
    let transport = |e: &dyn std::fmt::Display| format!("transport: {e}");
    let response = request.send().map_err(|e| transport(&e.without_url()))?;
    let status = response.status().as_u16();
    let header = response.headers().get("x-kvdir-instance").and_then(|v| v.to_str().ok());
    let instance = header.unwrap_or_default().to_string();
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let (first, usage) = match stream {
        true => read_stream(response).map_err(|e| transport(&e))?,
        false => {
            let mut text = Vec::new();
            BufReader::new(response).read_to_end(&mut text).map_err(|e| transport(&e))?;
            let body: Value = serde_json::from_slice(&text).unwrap_or_default();
            (None, body["usage"].clone())
        }
    };
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
    let cached_tokens = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    Ok(Answer { first, prompt_tokens, cached_tokens, instance })
}

/// Reads SSE lines to the end: when the first `data:` line came, and the last `usage` seen.
fn read_stream(response: impl Read) -> std::io::Result<(Option<Instant>, Value)> {
    let (mut first, mut usage) = (None, Value::Null);
    for line in BufReader::new(response).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data:") else { continue };
        first.get_or_insert_with(Instant::now);
        if data.contains("\"usage\"") {
            let chunk: Value = serde_json::from_str(data.trim()).unwrap_or_default();
            if chunk["usage"].is_object() {
                usage = chunk["usage"].clone();
            }
        }
    }
    Ok((first, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_reader_times_the_first_data_line_and_keeps_the_usage() {
        let sse = "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\
                   \"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n";
        let (first, usage) = read_stream(sse.as_bytes()).unwrap();
        assert!(first.is_some());
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(read_stream(&b": ping\n\n"[..]).unwrap().0, None);
    }

    #[test]
    fn every_system_prompt_is_used() {
        let mut seen = [0u32; 4];
        (0..64).for_each(|k| seen[(mix(k) % 4) as usize] += 1);
        assert!(seen.iter().all(|n| *n >= 8), "{seen:?}");
    }
}
