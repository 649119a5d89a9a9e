//! The simulated engines of a run ([`Fleet`]) and how kvdir learns about them: the kvdir config
//! file (static `streams`, or `discovery` with etcd) and, with etcd, one [`Registration`] per
//! engine (leased key, LOADMETRICS, heartbeats).
//!
//! Static mode binds every rank on ephemeral 127.0.0.1 ports and names engine `k`
//! `bench-<k>`. Etcd mode needs the discovery port rule (protocol.md section 5): engine `k`
//! gets the HTTP port `base + k * dp_size` and binds events on `+10000 + r`, snapshots on
//! `+30000 + r` (`--event_port_offset`, `--replay_port_offset`, written into the discovery
//! config); `base` is `--http_port`, or the first block of free ports found by probing. With
//! 4,096 streams the default offsets put the snapshot ports in the kernel's ephemeral range,
//! where a free block of 4,096 is rare: give lower offsets and `--http_port`.
//! The engines' HTTP ports are only names unless they serve OpenAI (`kvdir-bench chat`):
//! 1,024 idle HTTP servers would be 1,024 threads.
//!
//! With `--events_bind P` (etcd mode only) kvdir binds `P..P+dp_size-1` (`kv_events_bind`)
//! and rank `r` of every engine connects its PUB to `P + r`, publishing with its engine's
//! topic, [`TOPIC_ETCD`] with the instance's `host:port`.

use std::net::TcpListener;
use std::time::Duration;

use serde_json::{json, Value};

use super::flags::{BenchOptions, Mode};
use super::{fds, BenchError};
use kvdir_sim::{
    cli, EngineConfig, OpenAiConfig, Published, Registration, RegistrationOptions, SimEngine,
    SimError,
};

/// Probed HTTP bases: `FIRST_BASE + i * BASE_STEP` for `i` in `0..BASES`.
const FIRST_BASE: u32 = 20_000;
const BASE_STEP: u32 = 200;
const BASES: u32 = 50;
/// Bases probed again when a probed one was taken before the engines bound it.
const BIND_RETRIES: usize = 5;
/// The `kv_events_bind` topic pattern of discovered engines (`--events_bind`, etcd mode).
pub const TOPIC_ETCD: &str = "kv@{host}:{port}@{model}";
/// Lease TTL of the registrations: kept alive every third of it, so 1,024 engines cost about
/// 300 keepalive rounds a second rather than 1,000.
const LEASE_TTL_S: i64 = 10;
/// kvdir's `max_streams` default, written when the fleet is smaller.
const DEFAULT_MAX_STREAMS: usize = 128;

/// One stream of the fleet as kvdir names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamName {
    /// The instance name.
    pub instance: String,
    /// The DP rank.
    pub rank: u32,
}

impl std::fmt::Display for StreamName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.instance, self.rank)
    }
}

/// The running engines and their registrations.
pub struct Fleet {
    /// Engines in order.
    pub engines: Vec<SimEngine>,
    registrations: Vec<Registration>,
    /// The tool's open-file limit after [`fds::check`] raised it (`None`: unlimited).
    pub fd_limit: Option<u64>,
}

impl Fleet {
    /// Starts `--engines` engines by the port rule of the mode.
    pub fn start(o: &BenchOptions) -> Result<Fleet, BenchError> {
        Fleet::start_serving(o, None)
    }

    /// Starts the engines, OpenAI-compatible servers with `openai` when given.
    pub fn start_serving(
        o: &BenchOptions,
        openai: Option<&OpenAiConfig>,
    ) -> Result<Fleet, BenchError> {
        let fd_limit = fds::check(o)?;
        if let Some(threads) = o.rank_threads {
            if !kvdir_sim::set_rank_threads(threads) {
                tracing::warn!(
                    threads,
                    running = kvdir_sim::rank_threads(),
                    "rank threads already running"
                );
            }
        }
        let mut tried = Vec::new();
        loop {
            let base = match o.mode {
                Mode::Static => None,
                Mode::Etcd { .. } => Some(http_base(o, &tried, openai.is_some())?),
            };
            match start_engines(o, openai, base) {
                // A probed base can be taken between the probe and the binds: its event and
                // snapshot ports lie in the kernel's ephemeral range, from which every outgoing
                // connection on the machine draws a local port. Probe another.
                Err(SimError::Bind { endpoint, .. })
                    if base.is_some() && o.http_port == 0 && tried.len() < BIND_RETRIES =>
                {
                    tracing::debug!(%endpoint, "a probed port was taken before the bind; probing");
                    tried.extend(base);
                }
                started => {
                    let (engines, registrations) = (started?, Vec::new());
                    return Ok(Fleet { engines, registrations, fd_limit });
                }
            }
        }
    }

    /// Every stream in engine and rank order.
    pub fn streams(&self) -> Vec<StreamName> {
        let streams = self.engines.iter().flat_map(|e| {
            let instance = e.instance_name();
            (0..e.config().dp_size).map(move |rank| StreamName { instance: instance.clone(), rank })
        });
        streams.collect()
    }

    /// `(engine index, rank)` of every stream, in [`Fleet::streams`] order.
    pub fn ranks(&self) -> Vec<(usize, u32)> {
        let ranks = self.engines.iter().enumerate();
        ranks.flat_map(|(e, eng)| (0..eng.config().dp_size).map(move |r| (e, r))).collect()
    }

    /// The last sequence each stream published (`None`: nothing yet), in stream order.
    pub fn last_sequences(&self) -> Result<Vec<Option<u64>>, SimError> {
        let next = |(e, r): (usize, u32)| self.engines[e].next_sequence(r);
        self.ranks().into_iter().map(|s| Ok(next(s)?.checked_sub(1))).collect()
    }

    /// What all ranks have published.
    pub fn published(&self) -> Result<Published, SimError> {
        let mut sum = Published::default();
        for (e, r) in self.ranks() {
            let p = self.engines[e].published(r)?;
            sum.batches += p.batches;
            sum.events += p.events;
            sum.blocks += p.blocks;
        }
        Ok(sum)
    }

    /// The kvdir config file for these engines: `discovery` in etcd mode (with
    /// `kv_events_bind` for `--events_bind`), else `streams`; `max_streams` fits the fleet.
    pub fn kvdir_config(&self, o: &BenchOptions) -> Value {
        let mut config = match &o.mode {
            Mode::Etcd { .. } => json!({ "discovery": {
                "enabled": true,
                "block_size": o.block_size,
                "topic": o.topic,
                "refresh_interval_ms": 200,
                "event_port_offset": o.port_offsets.0,
                "replay_port_offset": o.port_offsets.1,
            }}),
            // The flags allow --events_bind only with etcd.
            Mode::Static => cli::static_streams_config(&self.engines),
        };
        config["max_streams"] = json!(self.streams().len().max(DEFAULT_MAX_STREAMS));
        if let Some(port) = o.events_bind {
            if let Some(discovery) = config.get_mut("discovery").and_then(Value::as_object_mut) {
                // Each instance's topic comes from kv_events_bind.topic.
                discovery.remove("topic");
                discovery.insert("events".to_string(), json!("bind"));
            }
            config["kv_events_bind"] = json!({
                "endpoint": format!("tcp://127.0.0.1:{port}"),
                "ranks": o.dp_size,
                "topic": TOPIC_ETCD,
            });
        }
        config
    }

    /// In etcd mode, registers every engine (LOADMETRICS, heartbeats to `kvdir_addr`).
    pub fn register(&mut self, o: &BenchOptions, kvdir_addr: &str) -> Result<(), BenchError> {
        let Mode::Etcd { addr, namespace } = &o.mode else { return Ok(()) };
        let opts = RegistrationOptions {
            etcd: addr.clone(),
            namespace: namespace.clone(),
            backend_type: Some("xllm".to_string()),
            heartbeat_to: o.heartbeat.map(|_| kvdir_addr.to_string()),
            // Unused without heartbeats, but still validated.
            heartbeat_interval: o.heartbeat.unwrap_or(Duration::from_millis(500)),
            internal_token: o.internal_api_token.clone(),
            write_loadmetrics: true,
            ttl_s: LEASE_TTL_S,
            ..RegistrationOptions::default()
        };
        for engine in &self.engines {
            self.registrations.push(Registration::start(engine, opts.clone())?);
        }
        Ok(())
    }

    /// Reports each registered engine's load: no queue, its Device usage over all ranks.
    pub fn report_load(&self) -> Result<(), SimError> {
        for (engine, registration) in self.engines.iter().zip(&self.registrations) {
            let c = engine.config();
            let mut used = 0u64;
            for rank in 0..c.dp_size {
                used += engine.counts(rank)?.0;
            }
            let capacity = c.device_capacity_blocks as f64 * f64::from(c.dp_size);
            registration.set_load(0, (used as f64 / capacity).clamp(0.0, 1.0));
        }
        Ok(())
    }

    /// Reports engine `engine`'s load (`waiting` requests, Device `usage` in 0..=1), when it is
    /// registered; the replay's simulated queues set it before every routing decision.
    pub fn set_load(&self, engine: usize, waiting: u64, usage: f64) {
        if let Some(registration) = self.registrations.get(engine) {
            registration.set_load(waiting, usage.clamp(0.0, 1.0));
        }
    }

    /// `(answered, answered with a status other than 200)` heartbeats; `None` without any.
    pub fn heartbeats(&self) -> Option<(u64, u64)> {
        if self.registrations.is_empty() {
            return None;
        }
        let answered = self.registrations.iter().map(Registration::heartbeats_answered).sum();
        let bad = self.registrations.iter().filter_map(Registration::last_heartbeat_status);
        Some((answered, bad.filter(|s| *s != 200).count() as u64))
    }
}

/// Engine `k`'s config; with `--events_bind`, its PUBs connect to kvdir with the engine's
/// topic, and its HTTP port is served only for `openai`.
fn engine_config(
    o: &BenchOptions,
    k: u32,
    http_port: u16,
    openai: Option<&OpenAiConfig>,
) -> EngineConfig {
    let name = format!("bench-{k}");
    let topic = match o.events_bind {
        None => o.topic.clone(),
        Some(_) => {
            let model = openai.map_or("", |m| m.served_model_name.as_str());
            TOPIC_ETCD
                .replace("{host}", "127.0.0.1")
                .replace("{port}", &http_port.to_string())
                .replace("{model}", model)
        }
    };
    EngineConfig {
        name,
        dp_size: o.dp_size,
        block_size: o.block_size,
        topic,
        device_capacity_blocks: o.device_blocks,
        host_capacity_blocks: o.host_blocks,
        http_port,
        openai: openai.cloned(),
        serve_http: openai.is_some(),
        events_connect: o.events_bind.map(|p| format!("tcp://127.0.0.1:{p}")),
        event_port_offset: o.port_offsets.0,
        replay_port_offset: o.port_offsets.1,
        ..EngineConfig::default()
    }
}

/// The engines, on the ports of `base` in etcd mode (ephemeral ports in static mode).
fn start_engines(
    o: &BenchOptions,
    openai: Option<&OpenAiConfig>,
    base: Option<u32>,
) -> Result<Vec<SimEngine>, SimError> {
    let mut engines = Vec::with_capacity(o.engines as usize);
    for k in 0..o.engines {
        let http_port = base.map_or(0, |b| (b + k * o.dp_size) as u16);
        engines.push(SimEngine::start(engine_config(o, k, http_port, openai))?);
    }
    Ok(engines)
}

/// The HTTP port of engine 0 in etcd mode: `--http_port`, or a base whose ports are all free,
/// other than the bases `tried` already.
fn http_base(o: &BenchOptions, tried: &[u32], serving: bool) -> Result<u32, BenchError> {
    let streams = o.engines * o.dp_size;
    let (event_offset, replay_offset) = (u32::from(o.port_offsets.0), u32::from(o.port_offsets.1));
    if o.http_port != 0 {
        let last = u32::from(o.http_port) + replay_offset + streams - 1;
        if last > u32::from(u16::MAX) {
            return Err(BenchError::Flags(vec![format!(
                "--http_port = {} needs snapshot ports up to {last}, above 65535; \
                 pick a port below {}",
                o.http_port,
                u32::from(u16::MAX) + 1 - replay_offset - streams
            )]));
        }
        return Ok(u32::from(o.http_port));
    }
    let start = std::process::id() % BASES;
    let bases = (0..BASES).map(|i| FIRST_BASE + ((start + i) % BASES) * BASE_STEP);
    if let Some(base) = free_base(o, bases, tried, serving) {
        return Ok(base);
    }
    Err(BenchError::Flags(vec![format!(
        "no free block of ports found for {streams} streams from {FIRST_BASE}; pass \
         --http_port P with free ports P+{event_offset}.. and P+{replay_offset}.. (move them with \
         --event_port_offset and --replay_port_offset, below the ephemeral range from 32768)"
    )]))
}

/// The first of `bases`, other than those `tried`, whose ports are all free. Only bound ports
/// need to be: HTTP when served, events unless engines connect.
fn free_base(
    o: &BenchOptions,
    bases: impl Iterator<Item = u32>,
    tried: &[u32],
    serving: bool,
) -> Option<u32> {
    let streams = o.engines * o.dp_size;
    let (event_offset, replay_offset) = (u32::from(o.port_offsets.0), u32::from(o.port_offsets.1));
    let (bound_http, bound_events) = (serving, o.events_bind.is_none());
    let mut bases = bases.filter(|b| !tried.contains(b));
    bases.find(|&base| {
        let http = (0..o.engines).filter(|_| bound_http).map(|k| base + k * o.dp_size);
        let events = (0..streams).filter(|_| bound_events).map(|i| base + event_offset + i);
        let replay = (0..streams).map(|i| base + replay_offset + i);
        let last = base + replay_offset.max(event_offset) + streams - 1;
        last <= u32::from(u16::MAX) && http.chain(events).chain(replay).all(port_is_free)
    })
}

fn port_is_free(port: u32) -> bool {
    u16::try_from(port).is_ok_and(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::super::{parse_args, BenchCommand};
    use super::*;

    #[test]
    fn a_base_tried_already_is_not_probed_again() {
        // Blocks of 12 ports (HTTP +0 +2, events +4.., snapshots +8..) at ports the OS just
        // found free, not at fixed ones another run may hold.
        let args = ["--etcd_addr=127.0.0.1:1", "--engines=2", "--dp_size=2"];
        let offsets = ["--event_port_offset=4", "--replay_port_offset=8"];
        let args = args.into_iter().chain(offsets).map(String::from);
        let Ok(BenchCommand::Run(o)) = parse_args(args) else { panic!() };
        let os_port = || {
            let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
            u32::from(l.local_addr().unwrap().port())
        };
        let bases: Vec<u32> = (0..32).map(|_| os_port()).collect();
        let free = |tried: &[u32]| free_base(&o, bases.iter().copied(), tried, true);
        let first = free(&[]).expect("a free block of ports");
        let second = free(&[first]).expect("another free block");
        assert_ne!(first, second);
        let third = free(&[first, second]).expect("a third free block");
        assert!(![first, second].contains(&third));
    }

    /// Every config the tool can write is one kvdir accepts (kvdir's own parser).
    #[test]
    fn kvdir_accepts_every_generated_config() {
        let modes: [&[&str]; 3] =
            [&[], &["--etcd_addr=127.0.0.1:1"], &["--etcd_addr=127.0.0.1:1", "--events_bind=7600"]];
        for extra in modes {
            let mut args = vec!["--spawn_kvdir=k", "--engines=2", "--dp_size=2"];
            args.extend_from_slice(extra);
            let Ok(BenchCommand::Run(o)) = parse_args(args.iter().map(|a| a.to_string())) else {
                panic!("{args:?} should parse")
            };
            let fleet = Fleet::start(&o).expect("engines on free ports");
            let text = fleet.kvdir_config(&o).to_string();
            if let Err(e) = kvdir::config::parse_config_file(&text) {
                panic!("kvdir rejects the config for {extra:?}: {e}\n{text}");
            }
        }
    }
}
