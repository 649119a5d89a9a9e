//! Flags of the `kvdir-bench` binary ([`BenchOptions`]), parsed by clap in xllm-service style
//! (`--flag=value` or `--flag value`, switches alone; declared in `flags/cli.rs`), with every
//! problem reported together.
//!
//! How kvdir learns about the engines ([`Mode`]) follows from three flags: `--etcd_addr`
//! registers the engines in etcd (kvdir discovers them); without it the engines' static
//! `streams` config is written (`--write_config`) or handed to a kvdir the tool starts itself
//! (`--spawn_kvdir`). Only loopback addresses are accepted unless `--allow_remote` is given:
//! the engines bind 127.0.0.1, so only a kvdir on this host can subscribe to them.

use std::path::PathBuf;
use std::time::Duration;

use super::BenchError;
use kvdir::config::args::{self, number};

pub(crate) mod cli;
pub(crate) mod kvdir_run;

/// Most streams one run drives: kvdir's `max_streams` ceiling.
pub const MAX_STREAMS: u64 = 65_536;

/// `kvdir-bench --help`, generated from the flags' declaration (`flags/cli.rs`).
pub fn help() -> String {
    cli::bench_command().render_help().to_string()
}

/// How kvdir learns about the engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Engines register in etcd; kvdir discovers them.
    Etcd {
        /// etcd client endpoint.
        addr: String,
        /// Key namespace.
        namespace: String,
    },
    /// Engines are listed in a static `streams` config.
    Static,
}

/// Parsed and validated flags.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// Simulated engines.
    pub engines: u32,
    /// DP ranks per engine.
    pub dp_size: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Topic frame of live messages.
    pub topic: String,
    /// Device blocks per rank.
    pub device_blocks: usize,
    /// Host blocks per rank.
    pub host_blocks: usize,
    /// Engine 0's HTTP port in etcd mode (0 = pick).
    pub http_port: u16,
    /// Heartbeat interval in etcd mode; `None` sends none.
    pub heartbeat: Option<Duration>,
    /// Bind-endpoint mode: kvdir binds this port (and the next `dp_size - 1`), engines
    /// connect; `None`: kvdir connects to the engines.
    pub events_bind: Option<u16>,
    /// Discovery's `(event_port_offset, replay_port_offset)` in etcd mode.
    pub port_offsets: (u16, u16),
    /// Rank threads of the simulator; `None`: the cores.
    pub rank_threads: Option<usize>,
    /// Nice value of the engines' threads during the load (0: the tool's own; `nice.rs`).
    pub engines_nice: i32,
    /// The idle window before the load (zero skips it).
    pub idle: Duration,
    /// Measured load.
    pub duration: Duration,
    /// Engine requests per second over all ranks; `None` = as fast as possible.
    pub rate: Option<f64>,
    /// Publishing threads.
    pub drivers: u32,
    /// Workload seed.
    pub seed: u64,
    /// Query client threads.
    pub query_clients: u32,
    /// Route client threads.
    pub route_clients: u32,
    /// Requests per second per client; `None` = back to back.
    pub client_rate: Option<f64>,
    /// Blocks per client prompt (workload prompts cut or extended); 0 = as made.
    pub query_blocks: usize,
    /// Length of the no-ingest baseline (zero skips it).
    pub baseline: Duration,
    /// Deadline of every wait on kvdir.
    pub sync_timeout: Duration,
    /// etcd or static streams.
    pub mode: Mode,
    /// Where to write the kvdir config.
    pub write_config: Option<PathBuf>,
    /// kvdir binary to start.
    pub spawn_kvdir: Option<PathBuf>,
    /// Extra flags for the spawned kvdir.
    pub kvdir_args: Vec<String>,
    /// A running kvdir's HTTP address.
    pub kvdir_addr: String,
    /// kvdir's process id, for RSS.
    pub kvdir_pid: Option<u32>,
    /// `X-Internal-Token`.
    pub internal_api_token: Option<String>,
    /// Print JSON.
    pub json: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            engines: 4,
            dp_size: 2,
            block_size: 128,
            topic: "xllm-kv".to_string(),
            device_blocks: 1024,
            host_blocks: 1024,
            http_port: 0,
            heartbeat: Some(Duration::from_millis(500)),
            events_bind: None,
            port_offsets: (10_000, 30_000),
            rank_threads: None,
            engines_nice: 0,
            idle: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            rate: None,
            drivers: 2,
            seed: 42,
            // A fleet's realistic query load: one client at 20 requests a second.
            query_clients: 1,
            route_clients: 0,
            client_rate: Some(20.0),
            query_blocks: 0,
            baseline: Duration::from_secs(3),
            sync_timeout: Duration::from_secs(60),
            mode: Mode::Static,
            write_config: None,
            spawn_kvdir: None,
            kvdir_args: Vec::new(),
            kvdir_addr: "127.0.0.1:8888".to_string(),
            kvdir_pid: None,
            internal_api_token: None,
            json: false,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchCommand {
    /// Print [`help`].
    Help,
    /// Run the load.
    Run(Box<BenchOptions>),
}

/// Flags seen but resolved only once all are known.
#[derive(Default)]
struct Pending {
    etcd_addr: Option<String>,
    etcd_namespace: Option<String>,
    route_clients: Option<u32>,
    kvdir_addr: Option<String>,
    allow_remote: bool,
}

/// Parses the arguments after the program name.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<BenchCommand, BenchError> {
    let Some((pairs, mut problems)) =
        cli::parse(&cli::bench_command(), args.into_iter().collect())?
    else {
        return Ok(BenchCommand::Help);
    };
    let (mut options, mut pending) = (BenchOptions::default(), Pending::default());
    for (name, value) in pairs {
        if let Err(problem) = options.set(&mut pending, &name, &value) {
            problems.push(problem);
        }
    }
    options.resolve(pending, &mut problems);
    if problems.is_empty() {
        Ok(BenchCommand::Run(Box::new(options)))
    } else {
        Err(BenchError::Flags(problems))
    }
}

/// Seconds, fractional allowed, in `min..=3600`.
fn seconds(name: &str, value: &str, min: f64) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && (min..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!("--{name} = {value:?} is not a number of seconds in {min}..=3600")),
    }
}

/// A rate of requests per second; 0 means "no pacing".
fn rate(name: &str, value: &str) -> Result<Option<f64>, String> {
    let r = args::rate(name, value, (0.0, f64::MAX), "request")?;
    Ok((r > 0.0).then_some(r))
}

pub(crate) fn switch(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("--{name} = {value:?} is not true or false")),
    }
}

impl BenchOptions {
    fn set(&mut self, pending: &mut Pending, name: &str, value: &str) -> Result<(), String> {
        match name {
            "engines" => self.engines = number(name, value)?,
            "dp_size" => self.dp_size = number(name, value)?,
            "block_size" => self.block_size = number(name, value)?,
            "topic" => self.topic = value.to_string(),
            "device_blocks" => self.device_blocks = number(name, value)?,
            "host_blocks" => self.host_blocks = number(name, value)?,
            "http_port" => self.http_port = number(name, value)?,
            "heartbeat_ms" => {
                let ms: u64 = number(name, value)?;
                self.heartbeat = (ms > 0).then(|| Duration::from_millis(ms));
            }
            "events_bind" => self.events_bind = Some(number(name, value)?),
            "rank_threads" => self.rank_threads = Some(number(name, value)?),
            "engines_nice" => self.engines_nice = number(name, value)?,
            "event_port_offset" => self.port_offsets.0 = number(name, value)?,
            "replay_port_offset" => self.port_offsets.1 = number(name, value)?,
            "idle_seconds" => self.idle = seconds(name, value, 0.0)?,
            "duration_seconds" => self.duration = seconds(name, value, 0.1)?,
            "baseline_seconds" => self.baseline = seconds(name, value, 0.0)?,
            "sync_timeout_seconds" => self.sync_timeout = seconds(name, value, 1.0)?,
            "rate" => self.rate = rate(name, value)?,
            "client_rate" => self.client_rate = rate(name, value)?,
            "query_blocks" => self.query_blocks = number(name, value)?,
            "drivers" => self.drivers = number(name, value)?,
            "seed" => self.seed = number(name, value)?,
            "query_clients" => self.query_clients = number(name, value)?,
            "route_clients" => pending.route_clients = Some(number(name, value)?),
            "etcd_addr" => pending.etcd_addr = Some(value.to_string()),
            "etcd_namespace" => pending.etcd_namespace = Some(value.to_string()),
            "kvdir_addr" => pending.kvdir_addr = Some(value.to_string()),
            "allow_remote" => pending.allow_remote = switch(name, value)?,
            "write_config" => self.write_config = Some(PathBuf::from(value)),
            "spawn_kvdir" => self.spawn_kvdir = Some(PathBuf::from(value)),
            "kvdir_arg" => self.kvdir_args.push(value.to_string()),
            "kvdir_pid" => self.kvdir_pid = Some(number(name, value)?),
            "internal_api_token" => self.internal_api_token = Some(value.to_string()),
            "json" => self.json = switch(name, value)?,
            _ => return Err(format!("unknown flag --{name}; run kvdir-bench --help")),
        }
        Ok(())
    }

    /// Applies the flags that depend on others and checks the combination.
    fn resolve(&mut self, pending: Pending, problems: &mut Vec<String>) {
        let spawn = self.spawn_kvdir.is_some();
        if let Some(addr) = &pending.kvdir_addr {
            if spawn {
                problems.push(format!(
                    "--kvdir_addr = {addr} and --spawn_kvdir both name the kvdir; drop one"
                ));
            }
            self.kvdir_addr = addr.clone();
        }
        if !pending.allow_remote {
            check_loopback("kvdir_addr", &self.kvdir_addr, problems);
            if let Some(addr) = &pending.etcd_addr {
                check_loopback("etcd_addr", addr, problems);
            }
        }
        let namespace_given = pending.etcd_namespace.is_some();
        self.mode = match pending.etcd_addr {
            Some(addr) => {
                let private = || format!("kvdir-bench-{}", std::process::id());
                let namespace = pending.etcd_namespace.unwrap_or_else(|| {
                    if spawn {
                        private()
                    } else {
                        String::new()
                    }
                });
                Mode::Etcd { addr, namespace }
            }
            None => Mode::Static,
        };
        let etcd = matches!(self.mode, Mode::Etcd { .. });
        self.route_clients = pending.route_clients.unwrap_or(u32::from(etcd));
        self.check(etcd, namespace_given, problems);
    }

    fn check(&self, etcd: bool, namespace: bool, problems: &mut Vec<String>) {
        let streams = u64::from(self.engines) * u64::from(self.dp_size);
        let counts = [
            (self.engines >= 1, "--engines = 0 is below the minimum 1".to_string()),
            (self.dp_size >= 1, "--dp_size = 0 is below the minimum 1".into()),
            (self.drivers >= 1, "--drivers = 0 is below the minimum 1".into()),
            (self.block_size >= 1, "--block_size = 0 is below the minimum 1".into()),
            (self.device_blocks >= 1, "--device_blocks = 0 is below the minimum 1".into()),
            (
                streams <= MAX_STREAMS,
                format!(
                    "--engines x --dp_size = {streams} streams; kvdir subscribes to at most \
                     {MAX_STREAMS} (max_streams), so lower one of them"
                ),
            ),
            (self.rank_threads != Some(0), "--rank_threads = 0 is below the minimum 1".into()),
            (
                (0..=19).contains(&self.engines_nice),
                format!("--engines_nice = {} is outside 0..=19", self.engines_nice),
            ),
            (
                self.events_bind.is_none_or(|p| {
                    p != 0 && u32::from(p) + self.dp_size.saturating_sub(1) <= u32::from(u16::MAX)
                }),
                format!(
                    "--events_bind = {} with --dp_size = {} needs ports up to {}; give a port \
                     in 1..={}",
                    self.events_bind.unwrap_or(0),
                    self.dp_size,
                    u32::from(self.events_bind.unwrap_or(0)) + self.dp_size.saturating_sub(1),
                    u32::from(u16::MAX) + 1 - self.dp_size.max(1)
                ),
            ),
            (
                self.query_clients + self.route_clients > 0,
                "--query_clients and --route_clients are both 0; give at least one client".into(),
            ),
        ];
        let modes = self.mode_problems(etcd, namespace);
        problems.extend(counts.into_iter().filter(|(ok, _)| !ok).map(|(_, p)| p).chain(modes));
    }

    /// Flags that need etcd mode, or a way to reach kvdir.
    fn mode_problems(&self, etcd: bool, namespace: bool) -> Vec<String> {
        let checks = [
            (
                etcd || self.write_config.is_some() || self.spawn_kvdir.is_some(),
                "nothing tells kvdir about the engines: pass --etcd_addr H:P, --spawn_kvdir PATH \
                 or --write_config PATH"
                    .to_string(),
            ),
            (
                etcd || self.route_clients == 0,
                format!(
                    "--route_clients = {} needs --etcd_addr: kvdir routes only to instances it \
                     discovered in etcd with a load report; pass --etcd_addr or --route_clients 0",
                    self.route_clients
                ),
            ),
            (
                etcd || !namespace,
                "--etcd_namespace needs --etcd_addr; drop it or add --etcd_addr".into(),
            ),
            (
                etcd || self.events_bind.is_none(),
                "--events_bind needs --etcd_addr: kvdir learns of bound engines from etcd \
                 (engines listed by address would need the HTTP /health and /metrics the \
                 simulated engines do not serve here); add --etcd_addr"
                    .into(),
            ),
            (
                etcd || self.http_port == 0,
                "--http_port is for --etcd_addr (discovery derives the ports from it); drop it"
                    .into(),
            ),
        ];
        checks.into_iter().filter(|(ok, _)| !ok).map(|(_, p)| p).collect()
    }
}

/// Adds a problem unless `addr` (`host:port`) names this host.
pub(crate) fn check_loopback(flag: &str, addr: &str, problems: &mut Vec<String>) {
    let addr = addr.trim_start_matches("http://");
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback =
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        problems.push(format!(
            "--{flag} = {addr} is not on this host; the tool connects only to loopback \
             addresses unless --allow_remote is given"
        ));
    }
}

#[cfg(test)]
mod tests;
