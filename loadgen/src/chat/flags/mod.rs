//! Flags of `kvdir-bench chat` ([`ChatOptions`]), parsed like the load tool's (every problem
//! reported together, each naming the value and the fix), and the [`BenchOptions`] handed to the
//! shared fleet, kvdir and probe modules.

use std::time::Duration;

use super::super::flags::kvdir_run::KvdirRun;
use super::super::flags::{cli, switch, BenchOptions, Mode};
use super::super::replay::flags::{policy_name, POLICIES};
use super::super::BenchError;
use kvdir::car::Policy;
use kvdir::config::args::{self, choice, number};

/// `kvdir-bench chat --help`, generated from the flags' declaration (`flags/cli.rs`).
pub fn chat_help() -> String {
    cli::chat_command().render_help().to_string()
}

/// Approximate tokens of a user turn and the template around it.
pub const USER_TURN_TOKENS: usize = 32;

/// Parsed and validated chat flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOptions {
    /// Simulated engines.
    pub engines: u32,
    /// DP ranks per engine.
    pub dp_size: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Device blocks per rank.
    pub device_blocks: usize,
    /// Client threads.
    pub clients: u32,
    /// Requests in all.
    pub requests: u64,
    /// Longest run of the clients.
    pub duration: Duration,
    /// Open-loop arrivals per second; 0: closed loop.
    pub rate: f64,
    /// Distinct system prompts.
    pub system_prompts: usize,
    /// Approximate system prompt size, tokens.
    pub system_prompt_tokens: usize,
    /// Stream the answers.
    pub stream: bool,
    /// Copies of each prompt sent at once (1: every request is its own prompt).
    pub siblings: u32,
    /// Bypass kvdir.
    pub direct: bool,
    /// Engines' prefill cost per uncached token, µs.
    pub prefill_us_per_token: u64,
    /// Engines' decode cost per output token, µs.
    pub decode_us_per_token: u64,
    /// One prefill at a time per engine rank.
    pub serial_prefill: bool,
    /// Output tokens per request.
    pub max_tokens: u32,
    /// kvdir's policy.
    pub policy: Policy,
    /// Model name.
    pub served_model_name: String,
    /// The kvdir to start and the etcd (the flags shared with `replay`).
    pub kvdir: KvdirRun,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            engines: 4,
            dp_size: 1,
            block_size: 16,
            device_blocks: 65_536,
            clients: 4,
            requests: 200,
            duration: Duration::from_secs(60),
            rate: 0.0,
            system_prompts: 4,
            system_prompt_tokens: 1000 - USER_TURN_TOKENS,
            stream: false,
            siblings: 1,
            direct: false,
            prefill_us_per_token: 20,
            decode_us_per_token: 1000,
            serial_prefill: false,
            max_tokens: 16,
            policy: Policy::Car,
            served_model_name: "kvdir-demo".to_string(),
            kvdir: KvdirRun::new("chat"),
        }
    }
}

/// What `kvdir-bench chat ...` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatCommand {
    /// Print [`chat_help`].
    Help,
    /// Run.
    Run(Box<ChatOptions>),
}

/// Parses the arguments after `chat`.
pub fn parse_chat_args<I>(args: I) -> Result<ChatCommand, BenchError>
where
    I: IntoIterator<Item = String>,
{
    let Some((pairs, mut problems)) = cli::parse(&cli::chat_command(), args.into_iter().collect())?
    else {
        return Ok(ChatCommand::Help);
    };
    let mut o = ChatOptions::default();
    let mut sizes = Vec::new();
    for (name, value) in pairs {
        let set = match name.as_str() {
            "prompt_tokens" | "system_prompt_tokens" => {
                tokens(&name, &value).map(|n| sizes.push((name.clone(), n)))
            }
            _ => o.kvdir.set(&name, &value).unwrap_or_else(|| o.set(&name, &value)),
        };
        if let Err(problem) = set {
            problems.push(problem);
        }
    }
    match sizes.as_slice() {
        [] => {}
        [(name, n)] if name == "prompt_tokens" => {
            o.system_prompt_tokens = n.saturating_sub(USER_TURN_TOKENS).max(1)
        }
        [(_, n)] => o.system_prompt_tokens = *n,
        _ => problems.push(
            "--prompt_tokens and --system_prompt_tokens both size the prompt; give one".into(),
        ),
    }
    o.check(&mut problems);
    match problems.is_empty() {
        true => Ok(ChatCommand::Run(Box::new(o))),
        false => Err(BenchError::Flags(problems)),
    }
}

/// A prompt size in 1..=1_000_000 tokens.
fn tokens(name: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!("--{name} = {value:?} is not a token count in 1..=1000000")),
    }
}

impl ChatOptions {
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "engines" => self.engines = number(name, value)?,
            "dp_size" => self.dp_size = number(name, value)?,
            "block_size" => self.block_size = number(name, value)?,
            "device_blocks" => self.device_blocks = number(name, value)?,
            "clients" => self.clients = number(name, value)?,
            "requests" => self.requests = number(name, value)?,
            "duration_seconds" => match value.parse::<f64>() {
                Ok(s) if s.is_finite() && (0.1..=3600.0).contains(&s) => {
                    self.duration = Duration::from_secs_f64(s)
                }
                _ => return Err(format!("--{name} = {value:?} is not seconds in 0.1..=3600")),
            },
            "rate" => self.rate = args::rate(name, value, (0.0, 100_000.0), "request")?,
            "system_prompts" => self.system_prompts = number(name, value)?,
            "stream" => self.stream = switch(name, value)?,
            "siblings" => match value.parse::<u32>() {
                Ok(k) if (1..=64).contains(&k) => self.siblings = k,
                _ => return Err(format!("--{name} = {value:?} is not a count in 1..=64")),
            },
            "direct" => self.direct = switch(name, value)?,
            "prefill_us_per_token" => self.prefill_us_per_token = number(name, value)?,
            "decode_us_per_token" => self.decode_us_per_token = number(name, value)?,
            "serial_prefill" => self.serial_prefill = switch(name, value)?,
            "max_tokens" => self.max_tokens = number(name, value)?,
            "policy" => self.policy = choice(name, value, &POLICIES)?,
            "served_model_name" => self.served_model_name = value.to_string(),
            _ => return Err(format!("unknown flag --{name}; run kvdir-bench chat --help")),
        }
        Ok(())
    }

    fn check(&self, problems: &mut Vec<String>) {
        self.kvdir.check(problems);
        let streams = u64::from(self.engines) * u64::from(self.dp_size);
        let at_least_one = |value: u64, flag: &str| {
            (value >= 1, format!("--{flag} = {value} is below the minimum 1"))
        };
        let checks = [
            (
                self.direct || self.kvdir.spawn_kvdir.is_some(),
                "--spawn_kvdir PATH is required (or --direct to bypass kvdir)".to_string(),
            ),
            at_least_one(self.engines.into(), "engines"),
            at_least_one(self.dp_size.into(), "dp_size"),
            at_least_one(self.block_size.into(), "block_size"),
            at_least_one(self.device_blocks as u64, "device_blocks"),
            at_least_one(self.clients.into(), "clients"),
            at_least_one(self.requests, "requests"),
            at_least_one(self.system_prompts as u64, "system_prompts"),
            (
                streams <= 128,
                format!("--engines x --dp_size = {streams}; kvdir follows at most 128"),
            ),
            (
                !self.served_model_name.trim().is_empty(),
                "--served_model_name is empty; name the model".into(),
            ),
        ];
        problems.extend(checks.into_iter().filter(|(ok, _)| !ok).map(|(_, p)| p));
    }

    /// The load tool's options: etcd mode in the private namespace, no Host tier, the spawned
    /// kvdir with the front door over `model_dir`, the policy and the passthrough flags.
    pub fn bench_options(&self, model_dir: &std::path::Path) -> BenchOptions {
        let mut kvdir_args = vec![
            format!("--tokenizer_path={}", model_dir.display()),
            format!("--served_model_name={}", self.served_model_name),
            format!("--load_balance_policy={}", policy_name(self.policy)),
        ];
        let k = &self.kvdir;
        kvdir_args.extend(k.kvdir_args.iter().cloned());
        BenchOptions {
            engines: self.engines,
            dp_size: self.dp_size,
            block_size: self.block_size,
            device_blocks: self.device_blocks,
            host_blocks: 0,
            mode: Mode::Etcd { addr: k.etcd_addr.clone(), namespace: k.namespace.clone() },
            spawn_kvdir: k.spawn_kvdir.clone().filter(|_| !self.direct),
            kvdir_args,
            internal_api_token: k.internal_api_token.clone(),
            sync_timeout: k.sync_timeout,
            route_clients: 1,
            json: k.json,
            ..BenchOptions::default()
        }
    }
}

#[cfg(test)]
mod tests;
