//! The zero-setup demo (`kvdir` with no flags, or `--demo`): three in-process simulated engines
//! (four DP streams, Device and Host tiers) and kvdir subscribed to them, driven by a
//! shared-prefix workload that kvdir itself routes with CAR. Nothing beyond Rust is needed: no
//! etcd and no config file. It prints the URLs to open (the status page first) and a one-line
//! summary every 5 s. With `--internal_api_token` its own route requests carry the token.
//!
//! The demo stands in for discovery: it knows each engine's identity, so its streams earn CAR
//! credit, and it pushes the engines' queue lengths to the router as heartbeats would. Queues
//! follow a simple model: a routed request adds one, and each engine drains a fixed number per
//! tick.

use std::time::{Duration, Instant};

use kvdir::car::Routed;
use kvdir::config::{Flags, Limits, StreamSpec};
use kvdir::registry::{Identity, InstanceState, InstanceType, LoadMetrics};
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::{EngineConfig, SimEngine};

use crate::router_actor::{InstanceInfo, SetCandidates};
use crate::service::{Directory, Service};

const BLOCK: u32 = 16;
const TICK: Duration = Duration::from_millis(100);
const SUMMARY_EVERY: Duration = Duration::from_secs(5);
/// Requests an engine finishes per tick in the queue model.
const DRAIN_PER_TICK: f64 = 0.3;

/// (name, DP size, Host capacity in blocks).
const ENGINES: [(&str, u32, usize); 3] = [("demo-a", 2, 512), ("demo-b", 1, 0), ("demo-c", 1, 256)];

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

/// Runs the demo until `flags.demo_seconds` pass (or forever).
pub fn run(flags: Flags) -> Result<(), String> {
    let mut demo = Demo::start()?;
    demo.token = flags.internal_api_token.clone();
    let svc =
        Service::start_directory(flags.clone(), demo.directory()).map_err(|e| e.to_string())?;
    let addr = svc.http_addr();
    print_urls(&addr.to_string(), demo.token.is_some());
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
        std::thread::sleep(TICK);
    }
    svc.stop();
    Ok(())
}

/// The URLs to open, the status page first; the first line is the address (tests read it).
fn print_urls(addr: &str, with_token: bool) {
    say(&format!("kvdir demo listening on http://{addr}"));
    let (fragment, h) =
        if with_token { ("#token=...", "-H 'X-Internal-Token: ...' ") } else { ("", "") };
    say(&format!("  status:    http://{addr}/{fragment}   (live page: open it in a browser)"));
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
    fn start() -> Result<Demo, String> {
        let mut engines = Vec::new();
        for (name, dp_size, host) in ENGINES {
            let config = EngineConfig {
                name: name.into(),
                dp_size,
                block_size: BLOCK,
                device_capacity_blocks: 384,
                host_capacity_blocks: host,
                ..EngineConfig::default()
            };
            engines.push(SimEngine::start(config).map_err(|e| e.to_string())?);
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

    fn directory(&self) -> Directory {
        let mut streams = Vec::new();
        for (e, id) in self.engines.iter().zip(&self.identities) {
            for (rank, ep) in e.endpoints().into_iter().enumerate() {
                let spec = StreamSpec {
                    instance_name: e.config().name.clone(),
                    dp_rank: rank as u32,
                    block_size: BLOCK,
                    endpoint: ep.event,
                    replay_endpoint: ep.replay,
                    topic: e.config().topic.clone(),
                    hash_seed: 1024,
                    model: String::new(),
                    salt: String::new(),
                };
                streams.push((spec, Some(id.clone())));
            }
        }
        Directory { streams, discovery: None, registry: false, limits: Limits::default() }
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
                name: e.config().name.clone(),
                kind: InstanceType::Default,
                mix_acting_prefill: true,
                state: InstanceState::Active,
                load: Some(LoadMetrics {
                    waiting_requests_num: self.waiting[i].round() as u64,
                    gpu_cache_usage_perc: usage,
                }),
                dp_size: e.config().dp_size,
                ttft_profile: Vec::new(),
                tpot_profile: Vec::new(),
                hits: Vec::new(),
            };
            let identity = self.identities[i].clone();
            infos.push(InstanceInfo { candidate, identity, load_reports: self.load_reports });
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
        let Some(i) = self.engines.iter().position(|e| e.config().name == routed.prefill) else {
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
            .map(|(e, p)| format!("{}={p}", e.config().name))
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
