//! The `kvdir-bench` command lines, declared for clap: the load tool's own ([`BenchCli`]),
//! `kvdir-bench chat`'s and `kvdir-bench replay`'s, which share the flags of the kvdir they
//! start and the etcd they use (`kvdir_run.rs`). `--help` is generated from these. Values are
//! kept as text and checked by each mode's setter, with every problem reported at once
//! ([`kvdir::config::args`]); a switch is `--json` or `--json=true|false`.

use clap::CommandFactory;
use kvdir::config::args::{self, Early};

use crate::BenchError;

/// A command line's flags in command-line order, or `None` for `--help`.
pub(crate) type Pairs = Option<(Vec<(String, String)>, Vec<String>)>;

/// Parses `args` with `command`: the `(flag, value)` pairs to apply in order and the problems
/// found so far, or `None` when `--help` was asked for.
pub(crate) fn parse(command: &clap::Command, args: Vec<String>) -> Result<Pairs, BenchError> {
    match args::parse(command, args.iter().map(String::as_str).collect()) {
        Ok(parsed) => {
            let problems = parsed.problems.iter().map(|(_, p)| p.clone()).collect();
            Ok(Some((parsed.pairs(), problems)))
        }
        Err(Early::Help | Early::Version) => Ok(None),
        Err(Early::Fatal(problems)) => {
            Err(BenchError::Flags(problems.into_iter().map(|(_, p)| p).collect()))
        }
    }
}

/// The load tool's command.
pub fn bench_command() -> clap::Command {
    args::command(BenchCli::command())
}

/// `kvdir-bench chat`'s command.
pub fn chat_command() -> clap::Command {
    args::command(ChatCli::command())
}

/// `kvdir-bench replay`'s command.
pub fn replay_command() -> clap::Command {
    args::command(ReplayCli::command())
}

/// The load tool's flags. Declaration only (here and below): each value is read by name.
#[allow(dead_code)]
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvdir-bench",
    about = "kvdir-bench: drive a running kvdir with simulated engines and HTTP clients, print a \
             report",
    override_usage = "kvdir-bench [--flag=value | --flag value]...\n       \
                      kvdir-bench replay --trace FILE ...   replay a request trace \
                      (kvdir-bench replay --help)\n       \
                      kvdir-bench chat --etcd_addr H:P ...  chat load through the OpenAI front \
                      door (kvdir-bench chat --help)",
    rename_all = "snake_case"
)]
struct BenchCli {
    /// register every engine in this etcd (leased key, LOADMETRICS, heartbeats); a kvdir started
    /// with --etcd_addr and a discovery config finds them
    #[arg(long, help_heading = "How kvdir learns about the engines (one of)", value_name = "H:P")]
    etcd_addr: Option<String>,
    /// write the kvdir config for the engines there (static streams, or discovery with
    /// --etcd_addr), then wait for kvdir
    #[arg(long, help_heading = "How kvdir learns about the engines (one of)", value_name = "PATH")]
    write_config: Option<String>,
    /// start this kvdir binary on 127.0.0.1 port 0 with the generated config (and --etcd_addr),
    /// stop it at the end
    #[arg(long, help_heading = "How kvdir learns about the engines (one of)", value_name = "PATH")]
    spawn_kvdir: Option<String>,
    /// HTTP address of a running kvdir (not with --spawn_kvdir) [default: 127.0.0.1:8888]
    #[arg(long, help_heading = "Target", value_name = "H:P")]
    kvdir_addr: Option<String>,
    /// etcd key namespace kvdir uses [default: none; a private one with --spawn_kvdir]
    #[arg(long, help_heading = "Target", value_name = "NS")]
    etcd_namespace: Option<String>,
    /// X-Internal-Token for kvdir's internal endpoints
    #[arg(long, help_heading = "Target", value_name = "T")]
    internal_api_token: Option<String>,
    /// read kvdir's RSS from /proc/PID/status
    #[arg(long, help_heading = "Target", value_name = "PID")]
    kvdir_pid: Option<String>,
    /// extra flag for the spawned kvdir (repeatable; use the = form)
    #[arg(long, help_heading = "Target", value_name = "FLAG", action = clap::ArgAction::Append)]
    kvdir_arg: Vec<String>,
    /// accept non-loopback --kvdir_addr and --etcd_addr
    #[arg(long, help_heading = "Target", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    allow_remote: Option<String>,
    /// simulated engines [default: 4]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    engines: Option<String>,
    /// DP ranks per engine (streams = engines x dp_size <= 65536) [default: 2]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    dp_size: Option<String>,
    /// tokens per block; must equal kvdir's block_size [default: 128]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    block_size: Option<String>,
    /// topic of live messages; must equal kvdir's topic [default: xllm-kv]
    #[arg(long, help_heading = "Engines", value_name = "T")]
    topic: Option<String>,
    /// Device blocks per rank [default: 1024]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    device_blocks: Option<String>,
    /// Host blocks per rank (0 = no Host tier) [default: 1024]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    host_blocks: Option<String>,
    /// HTTP port of engine 0 with --etcd_addr; engine k uses P + k*dp_size, events P+10000+..,
    /// snapshots P+30000+.. (0 = pick free ports) [default: 0]
    #[arg(long, help_heading = "Engines", value_name = "P")]
    http_port: Option<String>,
    /// with --etcd_addr: events of engine k rank r on P + k*dp_size + N + r (discovery's
    /// event_port_offset) [default: 10000]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    event_port_offset: Option<String>,
    /// the same for snapshot ports (replay_port_offset) [default: 30000]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    replay_port_offset: Option<String>,
    /// heartbeat interval with --etcd_addr (0 = none) [default: 500]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    heartbeat_ms: Option<String>,
    /// kvdir binds ports P..P+dp_size-1 and every engine's rank r connects its PUB to P+r with its
    /// own topic (kv_events_bind); needs --etcd_addr [default: off: kvdir connects to every rank's
    /// PUB]
    #[arg(long, help_heading = "Engines", value_name = "P")]
    events_bind: Option<String>,
    /// threads serving every simulated rank [default: the cores]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    rank_threads: Option<String>,
    /// nice value (0-19) of the engines' threads during the load; the clients keep the tool's
    /// [default: 0]
    #[arg(long, help_heading = "Engines", value_name = "N")]
    engines_nice: Option<String>,
    /// length of the measured load [default: 10]
    #[arg(long, help_heading = "Load", value_name = "S")]
    duration_seconds: Option<String>,
    /// engine requests (live batches) per second, all ranks (0 = max) [default: 0]
    #[arg(long, help_heading = "Load", value_name = "R")]
    rate: Option<String>,
    /// threads publishing the workload [default: 2]
    #[arg(long, help_heading = "Load", value_name = "N")]
    drivers: Option<String>,
    /// workload seed [default: 42]
    #[arg(long, help_heading = "Load", value_name = "S")]
    seed: Option<String>,
    /// threads sending POST /v1/internal/kv-cache/query [default: 1]
    #[arg(long, help_heading = "Load", value_name = "N")]
    query_clients: Option<String>,
    /// threads sending POST /v1/internal/route (needs --etcd_addr) [default: 1 with --etcd_addr,
    /// else 0]
    #[arg(long, help_heading = "Load", value_name = "N")]
    route_clients: Option<String>,
    /// requests per second per client (0 = back to back) [default: 20]
    #[arg(long, help_heading = "Load", value_name = "R")]
    client_rate: Option<String>,
    /// blocks per client prompt: each workload prompt, cut or extended with random tokens to
    /// this many blocks (0 = as the workload makes them, 8-12 blocks) [default: 0]
    #[arg(long, help_heading = "Load", value_name = "N")]
    query_blocks: Option<String>,
    /// then the same clients without ingest, for ratios (0 = skip) [default: 3]
    #[arg(long, help_heading = "Load", value_name = "S")]
    baseline_seconds: Option<String>,
    /// longest wait for kvdir to synchronize or catch up [default: 60]
    #[arg(long, help_heading = "Load", value_name = "S")]
    sync_timeout_seconds: Option<String>,
    /// before the load, kvdir's CPU and threads with every stream connected and nothing published
    /// (0 = skip) [default: 2]
    #[arg(long, help_heading = "Load", value_name = "S")]
    idle_seconds: Option<String>,
    /// print the report as JSON
    #[arg(long, help_heading = "Load", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    json: Option<String>,
}

/// `kvdir-bench chat`'s flags.
#[allow(dead_code)]
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvdir-bench chat",
    about = "kvdir-bench chat: start simulated OpenAI engines registered in etcd and a kvdir \
             with its OpenAI front door, send a shared-prefix chat workload (system prompt + \
             unique user turn) through kvdir (or, with --direct, straight to the engines), print \
             latency, TTFT, cached-token share, kvdir CPU per request and tokenization time",
    override_usage = "kvdir-bench chat --etcd_addr H:P --spawn_kvdir PATH [--flag=value]...",
    rename_all = "snake_case"
)]
struct ChatCli {
    #[command(flatten)]
    kvdir: super::kvdir_run::KvdirRunFlags,
    /// send the requests round-robin straight to the engines (baseline)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    direct: Option<String>,
    /// simulated OpenAI engines [default: 4]
    #[arg(long, value_name = "N")]
    engines: Option<String>,
    /// DP ranks per engine [default: 1]
    #[arg(long, value_name = "N")]
    dp_size: Option<String>,
    /// tokens per KV block [default: 16]
    #[arg(long, value_name = "N")]
    block_size: Option<String>,
    /// Device blocks per rank [default: 65536]
    #[arg(long, value_name = "N")]
    device_blocks: Option<String>,
    /// client threads, each with its own keep-alive client [default: 4]
    #[arg(long, value_name = "C")]
    clients: Option<String>,
    /// requests in all (the run stops at K or the duration) [default: 200]
    #[arg(long, value_name = "K")]
    requests: Option<String>,
    /// longest run of the clients [default: 60]
    #[arg(long, value_name = "S")]
    duration_seconds: Option<String>,
    /// open loop: request k is due at k/R s (R per second); a client sends it when due, or late
    /// when all are busy, and its latency and TTFT count from when it was due [default: 0 = closed
    /// loop: each client sends its next request when the last one ends]
    #[arg(long, value_name = "R")]
    rate: Option<String>,
    /// distinct system prompts (requests take them in turn) [default: 4]
    #[arg(long, value_name = "S")]
    system_prompts: Option<String>,
    /// approximate prompt size; the system prompt is sized to fit [default: 1000]
    #[arg(long, value_name = "N")]
    prompt_tokens: Option<String>,
    /// approximate system prompt size (instead of --prompt_tokens)
    #[arg(long, value_name = "N")]
    system_prompt_tokens: Option<String>,
    /// stream (SSE); TTFT = the first `data:` line
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    stream: Option<String>,
    /// send each prompt K times at once (parallel sampling, fan-out); each group's prompt is new;
    /// --clients groups run at a time; reports the share of siblings on their group's most used
    /// instance [default: 1 = off]
    #[arg(long, value_name = "K")]
    siblings: Option<String>,
    /// engines' cost per uncached prompt token, µs [default: 20]
    #[arg(long, value_name = "U")]
    prefill_us_per_token: Option<String>,
    /// engines' cost per output token, µs [default: 1000]
    #[arg(long, value_name = "U")]
    decode_us_per_token: Option<String>,
    /// each engine rank prefills one request at a time, first come first served, so requests queue
    /// past its prefill rate [default: off: all at once]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    serial_prefill: Option<String>,
    /// output tokens per request [default: 16]
    #[arg(long, value_name = "N")]
    max_tokens: Option<String>,
    /// CAR, RR, SLO_AWARE or TTFT, for the spawned kvdir [default: CAR]
    #[arg(long, value_name = "P")]
    policy: Option<String>,
    /// the model name of engines and front door [default: kvdir-demo]
    #[arg(long, value_name = "M")]
    served_model_name: Option<String>,
}

/// `kvdir-bench replay`'s flags.
#[allow(dead_code)]
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvdir-bench replay",
    about = "kvdir-bench replay: replay a Mooncake-format trace through simulated engines \
             registered in etcd and a kvdir the tool starts, routing every request with POST \
             /v1/internal/route; once with --policy, then with RR on fresh engines and a fresh \
             kvdir; print hit share, TTFT, imbalance",
    override_usage = "kvdir-bench replay --trace FILE --etcd_addr H:P --spawn_kvdir PATH \
                      [--flag=value]...",
    rename_all = "snake_case"
)]
struct ReplayCli {
    #[command(flatten)]
    kvdir: super::kvdir_run::KvdirRunFlags,
    /// the trace (JSON lines: timestamp, input_length, hash_ids)
    #[arg(long, value_name = "FILE")]
    trace: Option<String>,
    /// kvdir replicas per run, requests spread round-robin [default: 1]
    #[arg(long, value_name = "R")]
    routers: Option<String>,
    /// consecutive requests routed at once, each on its own connection, after one load report
    /// (concurrent arrivals); 1 or a multiple of --routers [default: 1]
    #[arg(long, value_name = "K")]
    concurrent: Option<String>,
    /// engine 0's HTTP port; its KV events and replay ports follow at fixed offsets (+10000,
    /// +30000) [default: 0 = the first free block]
    #[arg(long, value_name = "P")]
    http_port: Option<String>,
    /// replay only the first K requests (0 = all) [default: 0]
    #[arg(long, value_name = "K")]
    requests: Option<String>,
    /// simulated engines [default: 8]
    #[arg(long, value_name = "N")]
    engines: Option<String>,
    /// DP ranks per engine [default: 1]
    #[arg(long, value_name = "N")]
    dp_size: Option<String>,
    /// Device blocks of 512 tokens per engine, split over its ranks [default: 2048]
    #[arg(long, value_name = "N")]
    cache_blocks: Option<String>,
    /// simulated seconds per wall second (0 = no pacing) [default: 30]
    #[arg(long, value_name = "X")]
    speed: Option<String>,
    /// prefill cost of one uncached token, simulated µs [default: 50]
    #[arg(long, value_name = "U")]
    prefill_us_per_token: Option<String>,
    /// fixed cost of every request, simulated ms [default: 5]
    #[arg(long, value_name = "M")]
    overhead_ms: Option<String>,
    /// CAR, RR, SLO_AWARE or TTFT, for the spawned kvdir [default: CAR]
    #[arg(long, value_name = "P")]
    policy: Option<String>,
    /// also replay with RR when --policy is not RR [default: true]
    #[arg(long, value_name = "B")]
    compare_rr: Option<String>,
    /// runs in this order instead, each on fresh engines, e.g. CAR@0.5,CAR@0.8,TTFT,RR (CAR@L:
    /// --car_prefill_lambda=L)
    #[arg(long, value_name = "LIST")]
    policies: Option<String>,
    /// passed to kvdir (0..=1) [default: kvdir's]
    #[arg(long, value_name = "L")]
    car_prefill_lambda: Option<String>,
    /// passed to kvdir (0..=1) [default: kvdir's]
    #[arg(long, value_name = "W")]
    car_host_hit_weight: Option<String>,
    /// exact: kvdir follows the engines' KV events; none: it has no events and credits engines
    /// approximately from its own routing (discovery "events": "none", capacity --cache_blocks)
    /// [default: exact]
    #[arg(long, value_name = "E")]
    events: Option<String>,
}
