//! The zero-setup demo (`kvdir` with no flags, or `--demo`): three in-process simulated engines
//! (four DP streams, Device and Host tiers) and kvdir subscribed to them, driven by a
//! shared-prefix workload that kvdir itself routes with CAR. Nothing beyond Rust is needed: no
//! etcd and no config file. It prints the URLs to open (the status page first, then a working
//! `curl` for the OpenAI front door) and a one-line summary every 5 s. With
//! `--internal_api_token` its own route requests carry the token.
//!
//! The engines are OpenAI-compatible servers over their caches (named `127.0.0.1:<port>`, as
//! registered instances are), and the front door serves the demo model that `kvdir-text`
//! trains at start into a temporary directory, unless `--tokenizer_path` names another.
//!
//! The demo stands in for discovery: it knows each engine's identity, so its streams earn CAR
//! credit, and it pushes the engines' queue lengths to the router as heartbeats would. Queues
//! follow a simple model: a routed request adds one, and each engine drains a fixed number per
//! tick.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use kvdir::car::Routed;
use kvdir::config::{Flags, Limits, StreamSpec};
use kvdir::registry::{Identity, InstanceState, InstanceType, LoadMetrics};
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::{EngineConfig, OpenAiConfig, SimEngine};
use kvdir_text::TextModel;

use crate::held_logs::HeldLogs;
use crate::router::{InstanceInfo, SetCandidates};
use crate::service::{Service, StartPlan};

const BLOCK: u32 = 16;
const TICK: Duration = Duration::from_millis(100);
const SUMMARY_EVERY: Duration = Duration::from_secs(5);
/// Requests an engine finishes per tick in the queue model.
const DRAIN_PER_TICK: f64 = 0.3;

/// (label, DP size, Host capacity in blocks).
const ENGINES: [(&str, u32, usize); 3] = [("demo-a", 2, 512), ("demo-b", 1, 0), ("demo-c", 1, 256)];
/// The demo model's name on the front door.
const MODEL: &str = "kvdir-demo";

struct Demo {
    engines: Vec<SimEngine>,
    identities: Vec<Identity>,
    waiting: Vec<f64>,
    /// Load reports pushed so far.
    load_reports: u64,
    picks: Vec<u64>,
    requests: u64,
    input_tokens: u64,
    hit_tokens: u64,
    /// `--internal_api_token`, sent with the demo's own route requests.
    token: Option<String>,
}

/// Without `--tokenizer_path`, writes the demo model to a temporary directory and points the
/// flag at it. The caller drops the directory once the service has loaded the model (the front
/// door keeps it in memory), so no run leaves files behind.
fn write_demo_model(flags: &mut Flags) -> Result<Option<tempfile::TempDir>, String> {
    if flags.front.tokenizer_path.is_some() {
        return Ok(None);
    }
    let tmp = tempfile::Builder::new().prefix("kvdir-demo-").tempdir();
    let tmp = tmp.map_err(|e| {
        format!(
            "the demo model needs a temporary directory ({e}); set TMPDIR to a writable \
             directory, or pass --tokenizer_path"
        )
    })?;
    let dir = tmp.path().join(MODEL);
    kvdir_text::demo::write_model(&dir).map_err(|e| e.to_string())?;
    flags.front.tokenizer_path = Some(dir);
    Ok(Some(tmp))
}

/// Runs the demo until `flags.demo_seconds` pass or a signal's name comes on `stop` (SIGTERM,
/// SIGINT), then stops the service as the binary does: no new requests, those in flight
/// finish. The start-up logs are `held` until the banner is printed, so the banner is the
/// first thing a user sees.
pub fn run(mut flags: Flags, held: &HeldLogs, stop: Receiver<&'static str>) -> Result<(), String> {
    let model_dir = write_demo_model(&mut flags)?;
    let model = TextModel::load(
        flags.front.tokenizer_path.as_deref().unwrap_or(std::path::Path::new(".")),
        flags.front.chat_template.as_deref(),
    )
    .map_err(|e| format!("--tokenizer_path: {e}"))?;
    let served = flags.front.served_model_name.clone().unwrap_or_else(|| MODEL.to_string());
    flags.front.served_model_name = Some(served.clone());
    let mut demo = Demo::start(OpenAiConfig::new(std::sync::Arc::new(model), &served))?;
    demo.token = flags.internal_api_token.clone();
    let svc = Service::start_plan(flags.clone(), demo.plan()).map_err(|e| e.to_string())?;
    drop(model_dir);
    let addr = svc.http_addr();
    print_urls(&addr.to_string(), demo.token.is_some(), &served);
    held.release();
    let mut workload = Workload::new(WorkloadConfig {
        seed: 7,
        system_prompts: 4,
        system_prompt_tokens: 16 * BLOCK as usize,
        sessions: 24,
        turn_tokens: 16..=128,
        max_turns: 6,
        vocab_size: 32_000,
    });
    let end = flags.demo_seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let mut next_summary = Instant::now() + SUMMARY_EVERY;
    while end.is_none_or(|e| Instant::now() < e) {
        demo.push_loads(&svc);
        let request = workload.next_request();
        demo.route_one(&addr.to_string(), request.session, &request.tokens);
        if Instant::now() >= next_summary {
            say(&demo.summary());
            next_summary += SUMMARY_EVERY;
        }
        match stop.recv_timeout(TICK) {
            Ok(_) => break,
            Err(RecvTimeoutError::Timeout) => {}
            // No signal can come any more: the demo runs its time out.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(TICK),
        }
    }
    svc.stop();
    tracing::info!("stopped");
    Ok(())
}

/// The URLs to open, the status page first; the first line is the address (tests read it).
fn print_urls(addr: &str, with_token: bool, model: &str) {
    say(&format!("kvdir demo listening on http://{addr}"));
    let (fragment, h) =
        if with_token { ("#token=...", "-H 'X-Internal-Token: ...' ") } else { ("", "") };
    say(&format!("  status:    http://{addr}/{fragment}   (live page: open it in a browser)"));
    let chat = format!(
        r#"-H 'Content-Type: application/json' -d '{{"model":"{model}","messages":[{{"role":"user","content":"Hello!"}}]}}'"#
    );
    say(&format!("  chat:      curl -sS -i http://{addr}/v1/chat/completions {chat}"));
    let q = r#"-d '{"token_ids":[]}'"#;
    say(&format!("  query:     curl -sS {h}http://{addr}/v1/internal/kv-cache/query {q}"));
    say(&format!("  streams:   curl -sS {h}http://{addr}/v1/internal/streams"));
    let r = r#"-d '{"token_ids":[1,2,3]}'"#;
    say(&format!("  route:     curl -sS {h}http://{addr}/v1/internal/route {r}"));
    say(&format!("  decisions: curl -sS {h}http://{addr}/v1/internal/route/recent"));
    say(&format!("  metrics:   curl -sS http://{addr}/metrics"));
}

/// Prints a line; a closed stdout (a reader that went away) must not stop the demo.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

impl Demo {
    fn start(openai: OpenAiConfig) -> Result<Demo, String> {
        let mut engines = Vec::new();
        for (name, dp_size, host) in ENGINES {
            let config = EngineConfig {
                name: name.into(),
                dp_size,
                block_size: BLOCK,
                device_capacity_blocks: 384,
                host_capacity_blocks: host,
                openai: Some(openai.clone()),
                ..EngineConfig::default()
            };
            engines.push(start_on_free_port(config)?);
        }
        let identities = ENGINES
            .iter()
            .map(|(n, _, _)| Identity {
                incarnation_id: Some(format!("{n}-{}", std::process::id())),
                register_ts_ms: None,
            })
            .collect();
        let n = engines.len();
        Ok(Demo {
            engines,
            identities,
            waiting: vec![0.0; n],
            load_reports: 0,
            picks: vec![0; n],
            requests: 0,
            input_tokens: 0,
            hit_tokens: 0,
            token: None,
        })
    }

    fn plan(&self) -> StartPlan {
        let mut streams = Vec::new();
        for (e, id) in self.engines.iter().zip(&self.identities) {
            for (rank, ep) in e.endpoints().into_iter().enumerate() {
                let spec = StreamSpec {
                    instance_name: e.instance_name(),
                    dp_rank: rank as u32,
                    block_size: BLOCK,
                    endpoint: ep.event,
                    replay_endpoint: ep.replay,
                    topic: e.config().topic.clone(),
                    hash_seed: 1024,
                    model: String::new(),
                    salt: String::new(),
                    replay: kvdir::config::ReplayKind::Snapshot,
                };
                streams.push((spec, Some(id.clone())));
            }
        }
        StartPlan {
            streams,
            discovery: None,
            engines: Vec::new(),
            engine_poll_interval: std::time::Duration::from_secs(1),
            kubernetes: None,
            registry: false,
            limits: Limits::default(),
            bind: None,
        }
    }

    /// Drains the queue model and tells the router the current loads.
    fn push_loads(&mut self, svc: &Service) {
        let mut infos = Vec::new();
        self.load_reports += 1;
        for (i, e) in self.engines.iter().enumerate() {
            self.waiting[i] = (self.waiting[i] - DRAIN_PER_TICK).max(0.0);
            let (device, _) = e.counts(0).unwrap_or((0, 0));
            let usage = (device as f64 / 384.0).min(1.0);
            let candidate = kvdir::car::Candidate {
                name: e.instance_name(),
                kind: InstanceType::Default,
                mix_acting_prefill: true,
                state: InstanceState::Active,
                load: Some(LoadMetrics {
                    waiting_requests_num: self.waiting[i].round() as u64,
                    gpu_cache_usage_perc: usage,
                    prefill_tokens_per_s: None,
                }),
                dp_size: e.config().dp_size,
                ttft_profile: Vec::new(),
                tpot_profile: Vec::new(),
                hits: Vec::new(),
                queued: Default::default(),
                dp_routing: Default::default(),
                rank_loads: Vec::new(),
            };
            let identity = self.identities[i].clone();
            infos.push(InstanceInfo {
                candidate,
                identity,
                load_reports: self.load_reports,
                url: None,
            });
        }
        svc.router().do_send(SetCandidates(infos));
    }

    /// Asks kvdir where to send the request, then runs it on that engine (sticky DP rank).
    fn route_one(&mut self, addr: &str, session: usize, tokens: &[i32]) {
        let body = serde_json::json!({ "token_ids": tokens }).to_string();
        let timeout = Duration::from_secs(5);
        let headers: Vec<(&str, &str)> =
            self.token.iter().map(|t| ("X-Internal-Token", t.as_str())).collect();
        let path = "/v1/internal/route";
        let Ok(resp) = kvdir_sim::http::request(addr, "POST", path, &headers, Some(&body), timeout)
        else {
            return;
        };
        let Ok(routed) = serde_json::from_str::<Routed>(&resp.body) else { return };
        let Some(i) = self.engines.iter().position(|e| e.instance_name() == routed.prefill) else {
            return;
        };
        let chosen = routed.candidates.iter().find(|c| c.chosen);
        let ratio = chosen.and_then(|c| c.kv_hit_ratio).unwrap_or(0.0);
        self.hit_tokens += (ratio * tokens.len() as f64) as u64;
        self.input_tokens += tokens.len() as u64;
        self.requests += 1;
        self.picks[i] += 1;
        self.waiting[i] += 1.0;
        let engine = &self.engines[i];
        let _ = engine.process(session as u32 % engine.config().dp_size, tokens);
    }

    fn summary(&self) -> String {
        let picks: Vec<String> = self
            .engines
            .iter()
            .zip(&self.picks)
            .map(|(e, p)| format!("{}={p}", e.instance_name()))
            .collect();
        let rate = if self.input_tokens == 0 {
            0.0
        } else {
            100.0 * self.hit_tokens as f64 / self.input_tokens as f64
        };
        format!(
            "[demo] {} requests, {:.1}% of prompt tokens credited to cache, routed {}",
            self.requests,
            rate,
            picks.join(" ")
        )
    }
}

/// Starts `config` on a free loopback HTTP port whose derived ZeroMQ ports (+10000, +30000 per
/// rank) are free too; a port taken meanwhile is retried.
fn start_on_free_port(config: EngineConfig) -> Result<SimEngine, String> {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let start = 20_000 + (std::process::id() % 500) as u16 * 10;
    let mut last = String::from("no free port");
    for port in (start..25_000).step_by(7) {
        let ranks = 0..config.dp_size as u16;
        if !free(port) || !ranks.clone().all(|r| free(port + 10_000 + r) && free(port + 30_000 + r))
        {
            continue;
        }
        match SimEngine::start(EngineConfig { http_port: port, ..config.clone() }) {
            Ok(engine) => return Ok(engine),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("cannot start a demo engine: {last}"))
}
