//! Command-line flags in xllm-service style, parsed by clap (`cli.rs`): `--flag=value` and
//! `--flag value` both work, and every flag also reads `KVDIR_<FLAG>` from the environment
//! (the command line wins). Unknown flags, missing values and bad values are collected and
//! reported together, in the order of the command line. Flags of xllm-service that do not
//! apply to kvdir (`--block_size`) are accepted with a warning in [`Flags::warnings`], so an
//! existing command line still starts.

use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;

use super::{args, ConfigError};
use crate::car::{Policy, RouteParams};
use crate::overload::OverloadParams;

mod cli;

/// The `--help` text, generated from the flags' declaration (`cli.rs`).
pub fn usage() -> String {
    cli::command().render_help().to_string()
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run the service (or only check its configuration).
    Run(Box<Flags>),
    /// Print usage.
    Help,
    /// Print the version.
    Version,
}

/// Validated flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    /// The directory config file; `None` disables the directory.
    pub kv_events_config_file: Option<PathBuf>,
    /// The endpoint engines connect to, overriding `kv_events_bind.endpoint`.
    pub kv_events_bind: Option<String>,
    /// HTTP port.
    pub http_server_port: u16,
    /// HTTP bind address.
    pub server_host: String,
    /// HTTP connections open at most.
    pub http_max_connections: usize,
    /// How long an idle keep-alive HTTP connection stays open.
    pub http_keep_alive: Duration,
    /// Required `X-Internal-Token`, if any.
    pub internal_api_token: Option<String>,
    /// Largest HTTP body.
    pub max_request_bytes: usize,
    /// Largest `token_ids` list.
    pub max_query_tokens: usize,
    /// Validate and exit.
    pub check_config: bool,
    /// etcd endpoint for discovery.
    pub etcd_addr: String,
    /// Registry namespace (`/ns/` key prefix); empty for none.
    pub etcd_namespace: String,
    /// Routing policy and its parameters.
    pub route: RouteParams,
    /// Run the zero-setup demo.
    pub demo: bool,
    /// Stop the demo after this many seconds.
    pub demo_seconds: Option<u64>,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Flags accepted but ignored, one message each, for the service to log at start.
    pub warnings: Vec<String>,
    /// The front door's settings.
    pub front: FrontDoorFlags,
}

/// The OpenAI-compatible front door's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontDoorFlags {
    /// `tokenizer.json` or its directory; `None` leaves the front door answering 503.
    pub tokenizer_path: Option<PathBuf>,
    /// A chat template file overriding the tokenizer config's.
    pub chat_template: Option<PathBuf>,
    /// The model name clients use; defaults to the tokenizer directory's name.
    pub served_model_name: Option<String>,
    /// LoRA adapters the engines serve, by the names requests use as `model`.
    pub lora_adapters: Vec<String>,
    /// Required `Authorization: Bearer` key, if any.
    pub api_key: Option<String>,
    /// Connect timeout towards an engine.
    pub upstream_connect_timeout_ms: u64,
    /// Response-head timeout and longest silence between body chunks.
    pub upstream_timeout_ms: u64,
    /// The policy the front door routes with (`--frontend_policy`; else
    /// `--load_balance_policy` if given; else TTFT).
    pub policy: Policy,
    /// Overload admission (`--overload_*`).
    pub overload: OverloadParams,
}

impl Default for FrontDoorFlags {
    fn default() -> Self {
        FrontDoorFlags {
            tokenizer_path: None,
            chat_template: None,
            served_model_name: None,
            lora_adapters: Vec::new(),
            api_key: None,
            upstream_connect_timeout_ms: 3000,
            upstream_timeout_ms: 300_000,
            policy: Policy::Ttft,
            overload: OverloadParams::default(),
        }
    }
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        match v {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("--log_format={v:?} is not supported; use text or json")),
        }
    }
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            kv_events_config_file: None,
            kv_events_bind: None,
            http_server_port: 8888,
            server_host: "127.0.0.1".into(),
            http_max_connections: 4096,
            http_keep_alive: Duration::from_millis(5000),
            internal_api_token: None,
            max_request_bytes: 4 << 20,
            max_query_tokens: 1 << 20,
            check_config: false,
            etcd_addr: "127.0.0.1:2379".into(),
            etcd_namespace: String::new(),
            route: RouteParams::default(),
            demo: false,
            demo_seconds: None,
            log_format: LogFormat::Text,
            warnings: Vec::new(),
            front: FrontDoorFlags::default(),
        }
    }
}

fn number<T: std::str::FromStr>(name: &str, v: &str, min: u64, max: u64) -> Result<T, String> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => {
            v.parse::<T>().map_err(|_| format!("--{name}={v} is not a valid value"))
        }
        _ => Err(format!("--{name}={v:?} is not an integer in {min}..={max}")),
    }
}

/// A float in `0..=max`.
fn fraction(name: &str, v: &str, max: f64) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if (0.0..=max).contains(&x) => Ok(x),
        _ if max == 1.0 => Err(format!("--{name}={v:?} is outside the allowed range 0..=1")),
        _ => Err(format!("--{name}={v:?} is not a non-negative number of milliseconds")),
    }
}

/// A finite weight of at least 0.
fn weight(name: &str, v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("--{name}={v:?} is not a finite number of at least 0")),
    }
}

/// An optional path: empty means none.
fn path(v: &str) -> Option<PathBuf> {
    (!v.is_empty()).then(|| PathBuf::from(v))
}

/// Applies one `--name value` to `flags`.
fn set(flags: &mut Flags, name: &str, v: &str) -> Result<(), String> {
    match name {
        "kv_events_config_file" => {
            flags.kv_events_config_file = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        "kv_events_bind" if v.is_empty() => flags.kv_events_bind = None,
        "kv_events_bind" => {
            super::check_bind_endpoint(v, 1).map_err(|e| format!("--kv_events_bind={v:?}: {e}"))?;
            flags.kv_events_bind = Some(v.to_string());
        }
        "http_server_port" => flags.http_server_port = number(name, v, 0, 65_535)?,
        "server_host" if v.is_empty() => return Err("--server_host must not be empty".into()),
        "server_host" => flags.server_host = v.to_string(),
        "http_max_connections" => flags.http_max_connections = number(name, v, 1, 1 << 20)?,
        "http_keep_alive_ms" => {
            flags.http_keep_alive = Duration::from_millis(number(name, v, 1, 3_600_000)?);
        }
        "internal_api_token" => flags.internal_api_token = (!v.is_empty()).then(|| v.to_string()),
        "max_request_bytes" => flags.max_request_bytes = number(name, v, 64, 1 << 32)?,
        "max_query_tokens" => flags.max_query_tokens = number(name, v, 1, 1 << 28)?,
        "etcd_addr" => flags.etcd_addr = v.to_string(),
        "etcd_namespace" => flags.etcd_namespace = v.to_string(),
        "load_balance_policy" => flags.route.policy = v.parse::<Policy>()?,
        "frontend_policy" => {
            flags.front.policy = v
                .parse::<Policy>()
                .map_err(|e| e.replace("--load_balance_policy", "--frontend_policy"))?;
        }
        "log_format" => flags.log_format = v.parse()?,
        "demo_seconds" => flags.demo_seconds = Some(number(name, v, 1, 86_400)?),
        "car_prefill_lambda" => flags.route.lambda = fraction(name, v, 1.0)?,
        "car_host_hit_weight" => flags.route.host_weight = fraction(name, v, 1.0)?,
        "car_predict_ttl_ms" => flags.route.predict_ttl_ms = number(name, v, 0, 600_000)?,
        "car_predict_weight" => flags.route.predict_weight = fraction(name, v, 1.0)?,
        "ttft_prefill_tokens_per_s" => {
            flags.route.ttft.tokens_per_s = args::rate(name, v, (1.0, f64::MAX), "token")?;
        }
        "ttft_overhead_ms" => flags.route.ttft.overhead_ms = fraction(name, v, f64::MAX)?,
        "ttft_decode_ms" => flags.route.ttft.decode_ms = fraction(name, v, f64::MAX)?,
        "ttft_later_weight" => flags.route.ttft.later_weight = weight(name, v)?,
        "ttft_queue_weight" => flags.route.ttft.queue_weight = weight(name, v)?,
        "target_ttft" => flags.route.target_ttft_ms = fraction(name, v, f64::MAX)?,
        "target_tpot" => flags.route.target_tpot_ms = fraction(name, v, f64::MAX)?,
        "tokenizer_path" => flags.front.tokenizer_path = path(v),
        "chat_template" => flags.front.chat_template = path(v),
        "served_model_name" => flags.front.served_model_name = (!v.is_empty()).then(|| v.into()),
        "lora_adapters" => {
            flags.front.lora_adapters =
                v.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
        }
        "api_key" => flags.front.api_key = (!v.is_empty()).then(|| v.to_string()),
        "upstream_connect_timeout_ms" => {
            flags.front.upstream_connect_timeout_ms = number(name, v, 1, 600_000)?;
        }
        "upstream_timeout_ms" => flags.front.upstream_timeout_ms = number(name, v, 1, 86_400_000)?,
        "overload_ttft_ms" => flags.front.overload.ttft_bound_ms = number(name, v, 0, 3_600_000)?,
        "overload_queue" => flags.front.overload.queue = number(name, v, 0, 1 << 20)?,
        "overload_max_wait_ms" => {
            flags.front.overload.max_wait_ms = number(name, v, 1, 3_600_000)?;
        }
        "block_size" => flags.warnings.push(format!(
            "--block_size={v} does not configure the directory and is ignored (kept for \
             xllm-service command lines); set block_size in the kv_events_config_file: \
             discovery.block_size or streams[].block_size"
        )),
        _ => return Err(format!("unknown flag --{name}; run kvdir --help for the list")),
    }
    Ok(())
}

/// Parses the arguments after the program name, and the `KVDIR_*` environment variables.
/// No flag at all (on the command line or in the environment) means the demo.
pub fn parse_flags<S: AsRef<str>>(args: &[S]) -> Result<Command, ConfigError> {
    let sorted = |mut problems: Vec<(usize, String)>| {
        problems.sort_by_key(|(at, _)| *at);
        ConfigError::new(problems.into_iter().map(|(_, p)| p).collect())
    };
    let command = cli::command();
    let mut parsed = match args::parse(&command, args.iter().map(AsRef::as_ref).collect()) {
        Ok(parsed) => parsed,
        Err(args::Early::Help) => return Ok(Command::Help),
        Err(args::Early::Version) => return Ok(Command::Version),
        Err(args::Early::Fatal(problems)) => return Err(sorted(problems)),
    };
    let mut flags = Flags::default();
    for arg in command.get_arguments() {
        apply(&mut flags, &mut parsed, arg);
    }
    // No flags, or a demo length, mean the demo.
    let any = command.get_arguments().any(|a| parsed.given(a.get_id().as_str()));
    if !any || flags.demo_seconds.is_some() {
        flags.demo = true;
    }
    // The front door follows --load_balance_policy unless it has a policy of its own.
    if parsed.given("load_balance_policy") && !parsed.given("frontend_policy") {
        flags.front.policy = flags.route.policy;
    }
    match parsed.problems.is_empty() {
        true => Ok(Command::Run(Box::new(flags))),
        false => Err(sorted(parsed.problems)),
    }
}

/// Sets `arg`'s values, if it has any, in `flags`; a bad one is a problem of `parsed`, at its
/// place on the command line, or naming its environment variable.
fn apply(flags: &mut Flags, parsed: &mut args::Parsed<'_>, arg: &clap::Arg) {
    let id = arg.get_id().as_str();
    let m = &parsed.matches;
    let (Some(source), Some(values)) = (m.value_source(id), m.get_raw(id)) else { return };
    match id {
        "check_config" => return flags.check_config = m.get_flag(id),
        "demo" => return flags.demo = m.get_flag(id),
        _ => {}
    }
    let given_at = parsed.occurrences(id);
    // The last occurrence wins (only --block_size keeps them all).
    let skip = given_at.len().saturating_sub(values.len());
    for (k, v) in values.enumerate() {
        let result = set(flags, id, &v.to_string_lossy());
        let Err(problem) = result else { continue };
        parsed.problems.push(match (source, given_at.get(skip + k)) {
            (ValueSource::CommandLine, Some(&at)) => (at, problem),
            _ => {
                let env = arg.get_env().map(|e| e.to_string_lossy()).unwrap_or_default();
                (usize::MAX, format!("{problem} (set by {env})"))
            }
        });
    }
}

#[cfg(test)]
mod tests;
