//! Flags of `kvdir-bench replay` ([`ReplayOptions`]), parsed like the load tool's (every
//! problem reported together), and the [`BenchOptions`] each policy run hands to the shared
//! fleet, kvdir and probe modules.

use std::path::PathBuf;
use std::time::Duration;

use super::super::flags::kvdir_run::KvdirRun;
use super::super::flags::{cli, BenchOptions, Mode};
use super::super::BenchError;
use super::clock::Cost;
use super::trace::TRACE_BLOCK;
use kvdir::car::Policy;
use kvdir::config::args::{choice, number};

/// `kvdir-bench replay --help`, generated from the flags' declaration (`flags/cli.rs`).
pub fn replay_help() -> String {
    cli::replay_command().render_help().to_string()
}

/// Parsed and validated replay flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// The trace file.
    pub trace: PathBuf,
    /// Replay only this many requests.
    pub requests: Option<usize>,
    /// Simulated engines.
    pub engines: u32,
    /// DP ranks per engine.
    pub dp_size: u32,
    /// Device blocks per engine, over all its ranks.
    pub cache_blocks: usize,
    /// Simulated time per wall time; `None` = no pacing.
    pub speed: Option<f64>,
    /// The ranks' cost model.
    pub cost: Cost,
    /// The policy of the first run.
    pub policy: Policy,
    /// Whether to replay with RR afterwards.
    pub compare_rr: bool,
    /// `--policies`: the runs, replacing `policy` and `compare_rr` when not empty.
    pub runs: Vec<RunSpec>,
    /// kvdir flags for CAR.
    pub car_args: Vec<String>,
    /// `--events none`: kvdir gets no KV events and credits the engines approximately.
    pub approximate: bool,
    /// kvdir replicas per run.
    pub routers: usize,
    /// Consecutive requests routed at once.
    pub concurrent: usize,
    /// Engine 0's HTTP port (0 = pick a free block).
    pub http_port: u16,
    /// The kvdir to start and the etcd (the flags shared with `chat`; the namespace is each
    /// run's prefix).
    pub kvdir: KvdirRun,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            trace: PathBuf::new(),
            requests: None,
            engines: 8,
            dp_size: 1,
            cache_blocks: 2048,
            speed: Some(30.0),
            cost: Cost { overhead: Duration::from_millis(5), per_token: Duration::from_micros(50) },
            policy: Policy::Car,
            compare_rr: true,
            runs: Vec::new(),
            car_args: Vec::new(),
            approximate: false,
            routers: 1,
            concurrent: 1,
            http_port: 0,
            kvdir: KvdirRun::new("replay"),
        }
    }
}

/// Most kvdir replicas one run starts.
pub const MAX_ROUTERS: usize = 8;

/// Most requests routed at once (`--concurrent`).
pub const MAX_CONCURRENT: usize = 64;

/// What `kvdir-bench replay ...` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayCommand {
    /// Print [`replay_help`].
    Help,
    /// Replay.
    Run(Box<ReplayOptions>),
}

/// The policies by name, for `--policy`.
pub(crate) const POLICIES: [(&str, Policy); 4] = [
    ("CAR", Policy::Car),
    ("RR", Policy::Rr),
    ("SLO_AWARE", Policy::SloAware),
    ("TTFT", Policy::Ttft),
];

/// One run of the replay: a policy and, for CAR, its lambda (else kvdir's or
/// `--car_prefill_lambda`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSpec {
    /// The policy.
    pub policy: Policy,
    /// `--car_prefill_lambda` of this run.
    pub lambda: Option<f64>,
}

impl RunSpec {
    /// `CAR`, `CAR 0.8`, `TTFT`.
    pub fn label(&self) -> String {
        match self.lambda {
            Some(l) => format!("{} {l}", policy_name(self.policy)),
            None => policy_name(self.policy).to_string(),
        }
    }

    /// Parses `POLICY` or `CAR@LAMBDA`.
    fn parse(item: &str) -> Result<RunSpec, String> {
        let (name, lambda) = match item.split_once('@') {
            Some((name, l)) => (name, Some(l)),
            None => (item, None),
        };
        let policy = choice("policies", name, &POLICIES)?;
        let lambda = match (policy, lambda) {
            (_, None) => None,
            (Policy::Car, Some(l)) => match l.parse::<f64>() {
                Ok(x) if (0.0..=1.0).contains(&x) => Some(x),
                _ => return Err(format!("--policies: lambda {l:?} of {item} is not in 0..=1")),
            },
            (_, Some(_)) => {
                return Err(format!("--policies: {item}: only CAR takes a lambda (CAR@0.8)"))
            }
        };
        Ok(RunSpec { policy, lambda })
    }
}

/// `--events`: whether kvdir credits the engines approximately.
const EVENTS: [(&str, bool); 2] = [("exact", false), ("none", true)];

/// The policy's name on kvdir's command line and in reports: `CAR`, `RR`, `SLO_AWARE`.
pub fn policy_name(policy: Policy) -> &'static str {
    POLICIES.iter().find(|(_, p)| *p == policy).map_or("?", |(name, _)| name)
}

/// Parses the arguments after `replay`.
pub fn parse_replay_args<I>(args: I) -> Result<ReplayCommand, BenchError>
where
    I: IntoIterator<Item = String>,
{
    let Some((pairs, mut problems)) =
        cli::parse(&cli::replay_command(), args.into_iter().collect())?
    else {
        return Ok(ReplayCommand::Help);
    };
    let mut o = ReplayOptions::default();
    for (name, value) in pairs {
        let set = o.kvdir.set(&name, &value).unwrap_or_else(|| o.set(&name, &value));
        if let Err(problem) = set {
            problems.push(problem);
        }
    }
    o.check(&mut problems);
    match problems.is_empty() {
        true => Ok(ReplayCommand::Run(Box::new(o))),
        false => Err(BenchError::Flags(problems)),
    }
}

fn bad(name: &str) -> String {
    format!("--{name} is not true or false")
}

fn fraction(name: &str, value: &str) -> Result<String, String> {
    match value.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(format!("--{name}={value}")),
        _ => Err(format!("--{name} = {value:?} is not a number in 0..=1")),
    }
}

impl ReplayOptions {
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "trace" => self.trace = PathBuf::from(value),
            "requests" => self.requests = Some(number::<usize>(name, value)?).filter(|k| *k > 0),
            "engines" => self.engines = number(name, value)?,
            "dp_size" => self.dp_size = number(name, value)?,
            "cache_blocks" => self.cache_blocks = number(name, value)?,
            "speed" => match number::<f64>(name, value)? {
                0.0 => self.speed = None,
                s if s.is_finite() && s > 0.0 => self.speed = Some(s),
                _ => return Err(format!("--speed = {value} is not a positive factor (0 = none)")),
            },
            "prefill_us_per_token" => {
                self.cost.per_token = Duration::from_micros(number(name, value)?)
            }
            "overhead_ms" => self.cost.overhead = Duration::from_millis(number(name, value)?),
            "policy" => self.policy = choice(name, value, &POLICIES)?,
            "compare_rr" => self.compare_rr = value.parse().map_err(|_| bad(name))?,
            "policies" => {
                self.runs =
                    value.split(',').map(|i| RunSpec::parse(i.trim())).collect::<Result<_, _>>()?
            }
            "car_prefill_lambda" | "car_host_hit_weight" => {
                self.car_args.push(fraction(name, value)?)
            }
            "events" => self.approximate = choice(name, value, &EVENTS)?,
            "routers" => self.routers = number(name, value)?,
            "concurrent" => self.concurrent = number(name, value)?,
            "http_port" => self.http_port = number(name, value)?,
            _ => return Err(format!("unknown flag --{name}; run kvdir-bench replay --help")),
        }
        Ok(())
    }

    fn check(&self, problems: &mut Vec<String>) {
        self.kvdir.check(problems);
        let streams = u64::from(self.engines) * u64::from(self.dp_size);
        let checks = [
            (!self.trace.as_os_str().is_empty(), "--trace FILE is required".to_string()),
            (self.kvdir.spawn_kvdir.is_some(), "--spawn_kvdir PATH is required".into()),
            (self.engines >= 1, "--engines = 0 is below the minimum 1".into()),
            (self.dp_size >= 1, "--dp_size = 0 is below the minimum 1".into()),
            (
                (1..=MAX_ROUTERS).contains(&self.routers),
                format!("--routers = {} is not in 1..={MAX_ROUTERS}", self.routers),
            ),
            (
                (1..=MAX_CONCURRENT).contains(&self.concurrent),
                format!("--concurrent = {} is not in 1..={MAX_CONCURRENT}", self.concurrent),
            ),
            (
                self.concurrent == 1 || self.concurrent % self.routers.max(1) == 0,
                format!(
                    "--concurrent = {} is not a multiple of --routers = {}: give 1 or a multiple",
                    self.concurrent, self.routers
                ),
            ),
            (
                streams <= 128,
                format!("--engines x --dp_size = {streams} streams; kvdir follows at most 128"),
            ),
            (
                self.cache_blocks >= self.dp_size.max(1) as usize,
                format!(
                    "--cache_blocks = {} gives a rank no block; give at least --dp_size = {}",
                    self.cache_blocks, self.dp_size
                ),
            ),
        ];
        problems.extend(checks.into_iter().filter(|(ok, _)| !ok).map(|(_, p)| p));
    }

    /// The runs to replay, in order: `--policies`, else `--policy` and, unless it is RR or
    /// `--compare_rr false`, RR.
    pub fn policies(&self) -> Vec<RunSpec> {
        if !self.runs.is_empty() {
            return self.runs.clone();
        }
        let run = |policy| RunSpec { policy, lambda: None };
        match self.compare_rr && self.policy != Policy::Rr {
            true => vec![run(self.policy), run(Policy::Rr)],
            false => vec![run(self.policy)],
        }
    }

    /// The simulated cost model as the TTFT policy's rate and overhead, which stand in for what
    /// the front door learns from streamed answers (the replay has none); a `--kvdir_arg` that
    /// sets either flag replaces it.
    fn cost_args(&self) -> Vec<String> {
        let per_token_s = self.cost.per_token.as_secs_f64().max(1e-9);
        let args = [
            ("--ttft_prefill_tokens_per_s", format!("{}", (1.0 / per_token_s).max(1.0))),
            ("--ttft_overhead_ms", format!("{}", self.cost.overhead.as_secs_f64() * 1000.0)),
        ];
        let given = |flag: &str| self.kvdir.kvdir_args.iter().any(|a| a.starts_with(flag));
        args.into_iter().filter(|(f, _)| !given(f)).map(|(f, v)| format!("{f}={v}")).collect()
    }

    /// The load tool's options for run number `index`, `run`: etcd mode, a private namespace
    /// per run, 512-token blocks, no Host tier, the spawned kvdir with the policy and CAR knobs.
    pub fn bench_options(&self, index: usize, run: RunSpec) -> BenchOptions {
        let name = policy_name(run.policy);
        let mut kvdir_args = vec![format!("--load_balance_policy={name}")];
        kvdir_args.extend(self.car_args.iter().cloned());
        kvdir_args.extend(run.lambda.map(|l| format!("--car_prefill_lambda={l}")));
        kvdir_args.extend(self.cost_args());
        kvdir_args.extend(self.kvdir.kvdir_args.iter().cloned());
        let slug: String = run.label().to_ascii_lowercase().replace(' ', "");
        BenchOptions {
            engines: self.engines,
            dp_size: self.dp_size,
            http_port: self.http_port,
            block_size: TRACE_BLOCK as u32,
            device_blocks: self.cache_blocks / self.dp_size.max(1) as usize,
            host_blocks: 0,
            mode: Mode::Etcd {
                addr: self.kvdir.etcd_addr.clone(),
                namespace: format!("{}-{index}-{slug}", self.kvdir.namespace),
            },
            spawn_kvdir: self.kvdir.spawn_kvdir.clone(),
            kvdir_args,
            internal_api_token: self.kvdir.internal_api_token.clone(),
            sync_timeout: self.kvdir.sync_timeout,
            route_clients: 1,
            json: self.kvdir.json,
            ..BenchOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ReplayCommand, BenchError> {
        parse_replay_args(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn defaults_and_the_bench_options_of_a_run() {
        let args = ["--trace=t.jsonl", "--etcd_addr=127.0.0.1:2379", "--spawn_kvdir=/bin/kvdir"];
        let Ok(ReplayCommand::Run(o)) = parse(&args) else { panic!("valid") };
        assert_eq!((o.engines, o.dp_size, o.cache_blocks, o.policy), (8, 1, 2048, Policy::Car));
        assert_eq!(o.routers, 1);
        let run = |policy| RunSpec { policy, lambda: None };
        assert_eq!(o.policies(), [run(Policy::Car), run(Policy::Rr)]);
        let b = o.bench_options(1, run(Policy::Rr));
        assert_eq!((b.block_size, b.device_blocks, b.host_blocks), (512, 2048, 0));
        assert_eq!(b.kvdir_args[0], "--load_balance_policy=RR");
        let Mode::Etcd { namespace, .. } = b.mode else { panic!("etcd mode") };
        assert!(namespace.ends_with("-1-rr"), "{namespace}");
        let given = ["--kvdir_arg=--ttft_overhead_ms=1", "--prefill_us_per_token=2000"];
        let Ok(ReplayCommand::Run(o)) = parse(&[&args[..], &given].concat()) else { panic!() };
        let b = o.bench_options(0, run(Policy::Ttft));
        let rate_and_given = ["--ttft_prefill_tokens_per_s=500", "--ttft_overhead_ms=1"];
        assert_eq!(b.kvdir_args[1..], rate_and_given, "the given flag replaces the simulated one");
    }

    #[test]
    fn a_list_of_runs_sets_each_runs_policy_and_lambda() {
        let args = ["--trace=t", "--etcd_addr=127.0.0.1:1", "--spawn_kvdir=k", "--policies"];
        let Ok(ReplayCommand::Run(o)) = parse(&[&args[..], &["CAR@0.8, TTFT,RR"]].concat()) else {
            panic!("valid")
        };
        let runs = o.policies();
        let labels: Vec<String> = runs.iter().map(RunSpec::label).collect();
        assert_eq!(labels, ["CAR 0.8", "TTFT", "RR"]);
        let b = o.bench_options(0, runs[0]);
        let cost = ["--ttft_prefill_tokens_per_s=20000", "--ttft_overhead_ms=5"];
        assert_eq!(
            b.kvdir_args,
            [&["--load_balance_policy=CAR", "--car_prefill_lambda=0.8"][..], &cost].concat(),
            "the simulated 50 µs a token and 5 ms a request"
        );
        let Mode::Etcd { namespace, .. } = b.mode else { panic!("etcd mode") };
        assert!(namespace.ends_with("-0-car0.8"), "{namespace}");
        for (list, problem) in [
            ("CAR@2", "lambda \"2\" of CAR@2 is not in 0..=1"),
            ("TTFT@0.5", "TTFT@0.5: only CAR takes a lambda"),
            ("FAST", "is not one of CAR, RR, SLO_AWARE, TTFT"),
        ] {
            let err = parse(&[&args[..], &[list]].concat()).unwrap_err().to_string();
            assert!(err.contains(problem), "{problem} missing from {err}");
        }
    }

    #[test]
    fn concurrent_arrivals_must_spread_evenly_over_the_replicas() {
        let args = ["--trace=t", "--etcd_addr=127.0.0.1:1", "--spawn_kvdir=k", "--routers=2"];
        let Ok(ReplayCommand::Run(o)) = parse(&[&args[..], &["--concurrent=4"]].concat()) else {
            panic!("4 over 2 replicas is valid")
        };
        assert_eq!((o.routers, o.concurrent), (2, 4));
        let err = parse(&[&args[..], &["--concurrent=3"]].concat()).unwrap_err().to_string();
        assert!(err.contains("--concurrent = 3 is not a multiple of --routers = 2"), "{err}");
        let err = parse(&[&args[..], &["--concurrent=0"]].concat()).unwrap_err().to_string();
        assert!(err.contains("--concurrent = 0 is not in 1..=64"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_together() {
        let err = parse(&[
            "--engines=0",
            "--routers=0",
            "--policy=FAST",
            "--car_prefill_lambda=2",
            "--etcd_addr=10.0.0.1:2379",
        ])
        .unwrap_err()
        .to_string();
        for needle in [
            "--trace FILE is required",
            "--spawn_kvdir PATH is required",
            "--engines = 0",
            "--routers = 0 is not in 1..=8",
            "--policy = \"FAST\" is not one of CAR, RR, SLO_AWARE, TTFT",
            "--car_prefill_lambda = \"2\" is not a number in 0..=1",
            "--etcd_addr = 10.0.0.1:2379 is not on this host",
        ] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
    }
}
