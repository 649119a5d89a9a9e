//! Flags of the `kvdir-sim` binary, the engine configs they describe, and the static-stream
//! JSON a kvdir config file needs to subscribe to those engines.
//!
//! Flags take `--flag=value` or `--flag value` (clap, declared in `help.rs`); all problems are
//! reported together. With
//! `--engines N`, engine `k` (0-based) is named `<name>-<k>` and its rank `r` binds
//! `event_port + k * dp_size + r` and `replay_port + k * dp_size + r`; a port of 0 makes every
//! rank pick an ephemeral port.
//!
//! With `--http_port P`, engine `k` gets the business HTTP port `P + k * 100` (so the ranges
//! never overlap: at most 100 engines and 100 DP ranks), is named `127.0.0.1:<its port>`, and
//! its ZeroMQ ports follow the discovery rule (`+10000 + r` events, `+30000 + r` snapshots);
//! `--event_port` and `--replay_port` are then ignored. With `--etcd_addr` (which needs
//! `--http_port`) every engine registers in etcd like an xLLM engine.
//!
//! `--dialect vllm` makes every engine a simulated vLLM ([`crate::Dialect`]): history replay
//! of the last `--buffer_steps` batches, `/metrics`, and no registration (vLLM does not
//! register): without `--etcd_addr` nothing is written to etcd; with it the engines are
//! registered as by hand, with backend type `vllm`. Its static streams carry
//! `"replay": "history"`.
//!
//! `--events_connect tcp://H:P` makes every rank's PUB connect to `H:(P + r)` instead of
//! binding (a kvdir `kv_events_bind` endpoint); `{name}` in `--topic` becomes each engine's
//! name, so engines sharing the endpoint publish with topics of their own.

use kvdir::config::args::{self, choice, number, Early};
use kvdir::wire::record::{BatchForm, EventForm};
use serde_json::{json, Value};

use crate::{Dialect, EngineConfig, HashMode, RegistrationOptions, SimEngine, SimError};

mod help;
mod text;

pub use help::help;
pub use text::TextOptions;

/// With `--http_port`, engine `k` uses `http_port + k * HTTP_PORT_STRIDE`.
pub const HTTP_PORT_STRIDE: u16 = 100;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum CliCommand {
    /// Print [`help`].
    Help,
    /// Run engines.
    Run(Box<CliOptions>),
    /// Write the demo text model (`kvdir_text::demo`) into this directory and exit.
    WriteDemoModel(String),
}

/// Parsed flags.
#[derive(Debug, Clone, PartialEq)]
pub struct CliOptions {
    /// Instance name prefix.
    pub name: String,
    /// Number of engines.
    pub engines: u32,
    /// DP ranks per engine.
    pub dp_size: u32,
    /// Base PUB port (0 = ephemeral).
    pub event_port: u16,
    /// Base ROUTER port (0 = ephemeral).
    pub replay_port: u16,
    /// Tokens per block.
    pub block_size: u32,
    /// Topic frame.
    pub topic: String,
    /// Device capacity per rank.
    pub device_blocks: usize,
    /// Host capacity per rank (0 = no Host tier).
    pub host_blocks: usize,
    /// Hash shape on the wire.
    pub hash_mode: HashMode,
    /// Batch layout.
    pub batch_form: BatchForm,
    /// Event layout.
    pub event_form: EventForm,
    /// Requests per second over all ranks.
    pub rate: f64,
    /// Workload seed.
    pub seed: u64,
    /// Run time; `None` runs until interrupted.
    pub duration_s: Option<u64>,
    /// Where to write a query body for the first system prompt.
    pub query_file: Option<String>,
    /// Business HTTP port of engine 0 (0 = none); see the module docs.
    pub http_port: u16,
    /// etcd to register in; `None` registers nothing.
    pub etcd_addr: Option<String>,
    /// etcd key namespace.
    pub etcd_namespace: String,
    /// Registered instance type, 0..=3.
    pub instance_type: u8,
    /// kvdir HTTP address for heartbeats.
    pub heartbeat_to: Option<String>,
    /// `X-Internal-Token` of heartbeats.
    pub internal_api_token: Option<String>,
    /// The OpenAI engine's flags.
    pub text: TextOptions,
    /// The engine imitated: xLLM or vLLM.
    pub dialect: Dialect,
    /// vLLM dialect: batches kept per rank for replay.
    pub buffer_steps: usize,
    /// Connect every rank's PUB to this endpoint (plus the rank) instead of binding.
    pub events_connect: Option<String>,
}

impl Default for CliOptions {
    fn default() -> Self {
        CliOptions {
            name: "sim".to_string(),
            engines: 1,
            dp_size: 1,
            event_port: 18000,
            replay_port: 38000,
            block_size: 128,
            topic: "xllm-kv".to_string(),
            device_blocks: 1024,
            host_blocks: 0,
            hash_mode: HashMode::U64,
            batch_form: BatchForm::Array,
            event_form: EventForm::Map,
            rate: 1.0,
            seed: 42,
            duration_s: None,
            query_file: None,
            http_port: 0,
            etcd_addr: None,
            etcd_namespace: String::new(),
            instance_type: 0,
            heartbeat_to: None,
            internal_api_token: None,
            text: TextOptions::default(),
            dialect: Dialect::Xllm,
            buffer_steps: crate::DEFAULT_BUFFER_STEPS,
            events_connect: None,
        }
    }
}

/// Parses the arguments after the program name.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<CliCommand, SimError> {
    let args: Vec<String> = args.into_iter().collect();
    let parsed = match args::parse(&help::command(), args.iter().map(String::as_str).collect()) {
        Ok(parsed) => parsed,
        Err(Early::Help | Early::Version) => return Ok(CliCommand::Help),
        Err(Early::Fatal(problems)) => {
            return Err(SimError::Flags(problems.into_iter().map(|(_, p)| p).collect()))
        }
    };
    let mut options = CliOptions::default();
    let mut problems: Vec<String> = parsed.problems.iter().map(|(_, p)| p.clone()).collect();
    let pairs = parsed.pairs();
    if let [(name, dir)] = pairs.as_slice() {
        if name == "write_demo_model" && problems.is_empty() {
            return Ok(CliCommand::WriteDemoModel(dir.clone()));
        }
    }
    for (name, value) in pairs {
        if let Err(problem) = options.set(&name, &value) {
            problems.push(problem);
        }
    }
    if problems.is_empty() {
        Ok(CliCommand::Run(Box::new(options)))
    } else {
        Err(SimError::Flags(problems))
    }
}

impl CliOptions {
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        if self.text.set(name, value)? {
            return Ok(());
        }
        match name {
            "name" => self.name = value.to_string(),
            "engines" => self.engines = number(name, value)?,
            "dp_size" => self.dp_size = number(name, value)?,
            "event_port" => self.event_port = number(name, value)?,
            "replay_port" => self.replay_port = number(name, value)?,
            "block_size" => self.block_size = number(name, value)?,
            "topic" => self.topic = value.to_string(),
            "device_blocks" => self.device_blocks = number(name, value)?,
            "host_blocks" => self.host_blocks = number(name, value)?,
            "seed" => self.seed = number(name, value)?,
            "duration_s" => self.duration_s = Some(number(name, value)?),
            "query_file" => self.query_file = Some(value.to_string()),
            "rate" => self.rate = args::rate(name, value, (0.0, f64::MAX), "request")?,
            "http_port" => self.http_port = number(name, value)?,
            "etcd_addr" => self.etcd_addr = Some(value.to_string()),
            "etcd_namespace" => self.etcd_namespace = value.to_string(),
            "heartbeat_to" => self.heartbeat_to = Some(value.to_string()),
            "internal_api_token" => self.internal_api_token = Some(value.to_string()),
            "instance_type" => match number::<u8>(name, value)? {
                t @ 0..=3 => self.instance_type = t,
                _ => return Err(format!("--instance_type = {value} is not 0, 1, 2 or 3")),
            },
            "buffer_steps" => self.buffer_steps = number(name, value)?,
            "events_connect" => self.events_connect = Some(value.to_string()),
            "dialect" => {
                let dialects = [("xllm", Dialect::Xllm), ("vllm", Dialect::Vllm)];
                self.dialect = choice(name, value, &dialects)?
            }
            "hash_mode" => {
                self.hash_mode =
                    choice(name, value, &[("u64", HashMode::U64), ("bin32", HashMode::Bin32)])?
            }
            "batch_form" => {
                let forms = [
                    ("array", BatchForm::Array),
                    ("short_array", BatchForm::ShortArray),
                    ("map", BatchForm::Map),
                ];
                self.batch_form = choice(name, value, &forms)?
            }
            "event_form" => {
                let forms = [("map", EventForm::Map), ("positional", EventForm::Positional)];
                self.event_form = choice(name, value, &forms)?
            }
            _ => return Err(format!("unknown flag --{name}")),
        }
        Ok(())
    }

    /// One validated config per engine, following the port rules in the module docs.
    pub fn engine_configs(&self) -> Result<Vec<EngineConfig>, SimError> {
        let mut problems = self.registration_problems();
        problems.extend(self.text.problems(self.http_port));
        let mut openai = None;
        if problems.is_empty() {
            match self.text.openai_config() {
                Ok(config) => openai = config,
                Err(problem) => problems.push(problem),
            }
        }
        if self.engines == 0 {
            problems.push("--engines = 0 is below the minimum 1".to_string());
        }
        if self.http_port != 0 {
            problems.extend(self.http_port_problems());
        } else {
            problems.extend(self.zmq_port_problems());
        }
        let mut configs = Vec::new();
        for k in 0..self.engines {
            let config = match self.ports_of(k) {
                Ok((http, event, replay)) => EngineConfig {
                    openai: openai.clone(),
                    ..self.engine_config(k, http, event, replay)
                },
                Err(problem) => {
                    problems.push(problem);
                    break;
                }
            };
            if let Err(SimError::Config(p)) = config.validate() {
                problems.extend(p.into_iter().map(|p| format!("engine {k}: {p}")));
                break;
            }
            configs.push(config);
        }
        if problems.is_empty() {
            Ok(configs)
        } else {
            Err(SimError::Flags(problems))
        }
    }

    fn registration_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.etcd_addr.is_some() && self.http_port == 0 {
            problems.push(
                "--etcd_addr needs --http_port: engines register as 127.0.0.1:<http port>"
                    .to_string(),
            );
        }
        if self.heartbeat_to.is_some() && self.etcd_addr.is_none() {
            problems.push(
                "--heartbeat_to needs --etcd_addr (heartbeats carry the incarnation \
                           registered in etcd)"
                    .to_string(),
            );
        }
        problems
    }

    fn http_port_problems(&self) -> Vec<String> {
        let stride = u32::from(HTTP_PORT_STRIDE);
        let mut problems = Vec::new();
        if self.dp_size > stride {
            problems.push(format!(
                "--dp_size = {} with --http_port needs at most {stride} ranks per engine \
                 (engines are {stride} ports apart)",
                self.dp_size
            ));
        }
        if self.engines > stride {
            problems.push(format!(
                "--engines = {} with --http_port allows at most {stride} engines \
                 (their HTTP ports would reach the event ports)",
                self.engines
            ));
        }
        problems
    }

    fn zmq_port_problems(&self) -> Option<String> {
        let total = self.engines.saturating_mul(self.dp_size);
        let (e, r) = (u32::from(self.event_port), u32::from(self.replay_port));
        (e != 0 && r != 0 && e < r.saturating_add(total) && r < e.saturating_add(total)).then(
            || {
                format!(
                    "event ports {e}.. and replay ports {r}.. overlap for {total} ranks in all; \
                 move one range"
                )
            },
        )
    }

    /// `(http_port, event_port, replay_port)` of engine `k`.
    fn ports_of(&self, k: u32) -> Result<(u16, u16, u16), String> {
        if self.http_port != 0 {
            let offset = k.saturating_mul(u32::from(HTTP_PORT_STRIDE));
            return Ok((engine_port("http_port", self.http_port, offset)?, 0, 0));
        }
        let offset = k.saturating_mul(self.dp_size);
        let event = engine_port("event_port", self.event_port, offset);
        let replay = engine_port("replay_port", self.replay_port, offset);
        match (event, replay) {
            (Ok(e), Ok(r)) => Ok((0, e, r)),
            (e, r) => Err(e.err().into_iter().chain(r.err()).collect::<Vec<_>>().join("; ")),
        }
    }

    fn engine_config(
        &self,
        k: u32,
        http_port: u16,
        event_port: u16,
        replay_port: u16,
    ) -> EngineConfig {
        let name = format!("{}-{k}", self.name);
        EngineConfig {
            topic: self.topic.replace("{name}", &name),
            name,
            // A connecting PUB binds no port.
            event_port: if self.events_connect.is_some() { 0 } else { event_port },
            replay_port,
            dp_size: self.dp_size,
            block_size: self.block_size,
            device_capacity_blocks: self.device_blocks,
            host_capacity_blocks: self.host_blocks,
            hash_mode: self.hash_mode,
            batch_form: self.batch_form,
            event_form: self.event_form,
            http_port,
            dialect: self.dialect,
            buffer_steps: self.buffer_steps,
            events_connect: self.events_connect.clone(),
            ..EngineConfig::default()
        }
    }

    /// How each engine registers, when `--etcd_addr` is given. Engines write LOADMETRICS.
    pub fn registration_options(&self) -> Option<RegistrationOptions> {
        let etcd = self.etcd_addr.clone()?;
        Some(RegistrationOptions {
            etcd,
            namespace: self.etcd_namespace.clone(),
            kind: self.instance_type,
            backend_type: Some(self.dialect.as_str().to_string()),
            heartbeat_to: self.heartbeat_to.clone(),
            internal_token: self.internal_api_token.clone(),
            write_loadmetrics: true,
            ..RegistrationOptions::default()
        })
    }
}

fn engine_port(flag: &str, base: u16, offset: u32) -> Result<u16, String> {
    if base == 0 {
        return Ok(0);
    }
    let port = u32::from(base).saturating_add(offset);
    u16::try_from(port)
        .map_err(|_| format!("--{flag} = {base} needs port {port} for a later engine, above 65535"))
}

/// The `{"streams": [...]}` section of a kvdir config file for every rank of `engines`, each
/// named by [`SimEngine::instance_name`] (`127.0.0.1:<http port>` with an HTTP port); a
/// vLLM-dialect engine's streams add `"replay": "history"`.
pub fn static_streams_config<'a>(engines: impl IntoIterator<Item = &'a SimEngine>) -> Value {
    let mut streams = Vec::new();
    for engine in engines {
        let (c, name) = (engine.config(), engine.instance_name());
        for (rank, ep) in engine.endpoints().into_iter().enumerate() {
            let mut stream = json!({
                "instance_name": name,
                "dp_rank": rank,
                "block_size": c.block_size,
                "endpoint": ep.event,
                "replay_endpoint": ep.replay,
                "topic": c.topic,
            });
            if c.dialect != Dialect::Xllm {
                stream["replay"] = json!(c.dialect.replay().as_str());
            }
            streams.push(stream);
        }
    }
    json!({ "streams": streams })
}

#[cfg(test)]
mod tests;
