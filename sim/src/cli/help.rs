//! The `kvdir-sim` command line, declared for clap: every flag's name, value name and help
//! (`--help` is generated from it). Values are kept as text and checked by the simulator's own
//! setters ([`super::CliOptions`], [`super::TextOptions`]), with every problem reported at once
//! ([`kvdir::config::args`]).

use clap::CommandFactory;
use kvdir::config::args;

/// What `kvdir-sim --help` says after the flags.
const AFTER_HELP: &str = "\
Prints every engine's endpoints and the {\"streams\": [...]} JSON for a kvdir config file,
then drives a shared-prefix workload (a few system prompts, multi-turn sessions routed to a
fixed rank each) until Ctrl-C or --duration_s. With --tokenizer_path every engine also serves
POST /v1/chat/completions and /v1/completions on its HTTP port: it tokenizes like the engine,
answers from the DP rank holding the longest cached prefix (ties: fewest requests in flight,
then lowest rank), reports usage.prompt_tokens_details.cached_tokens and the rank in the
x-sim-dp-rank header, publishes the request's KV events and streams tokens (stream: true).";

/// `kvdir-sim`'s flags, each named after its field. Declaration only: the parser reads each
/// value by name, in command-line order.
#[allow(dead_code)]
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvdir-sim",
    about = "kvdir-sim: simulated xLLM (or vLLM) engines that publish KV-cache events over ZeroMQ",
    after_help = AFTER_HELP,
    rename_all = "snake_case"
)]
struct Cli {
    /// instance name prefix; engine k is NAME-k [default: sim]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// number of engines [default: 1]
    #[arg(long, value_name = "N")]
    engines: Option<String>,
    /// DP ranks per engine [default: 1]
    #[arg(long, value_name = "N")]
    dp_size: Option<String>,
    /// PUB port of engine 0 rank 0 (0 = ephemeral) [default: 18000]
    #[arg(long, value_name = "P")]
    event_port: Option<String>,
    /// ROUTER (snapshot) port of engine 0 rank 0 (0 = ephemeral); engine k rank r binds PORT +
    /// k*dp_size + r on 127.0.0.1, and likewise on --event_port [default: 38000]
    #[arg(long, value_name = "P")]
    replay_port: Option<String>,
    /// business HTTP port of engine 0 (0 = none); engine k uses P + k*100, serves GET /health, is
    /// named 127.0.0.1:<port>, and binds events on port+10000+r and snapshots on port+30000+r
    /// (--event_port/--replay_port are then ignored) [default: 0]
    #[arg(long, value_name = "P")]
    http_port: Option<String>,
    /// xllm | vllm: vllm replays the last --buffer_steps batches (history, not snapshots), serves
    /// GET /metrics and an empty GET /health, reports cached_tokens without the prompt's last
    /// token, and registers nowhere unless --etcd_addr [default: xllm]
    #[arg(long, value_name = "D")]
    dialect: Option<String>,
    /// vllm: batches each rank keeps for replay [default: 10000]
    #[arg(long, value_name = "N")]
    buffer_steps: Option<String>,
    /// register every engine in this etcd (needs --http_port)
    #[arg(long, value_name = "H:P")]
    etcd_addr: Option<String>,
    /// etcd key namespace (keys under /NS/) [default: none]
    #[arg(long, value_name = "NS")]
    etcd_namespace: Option<String>,
    /// 0 DEFAULT | 1 PREFILL | 2 DECODE | 3 MIX [default: 0]
    #[arg(long, value_name = "T")]
    instance_type: Option<String>,
    /// POST heartbeats to this kvdir (needs --etcd_addr)
    #[arg(long, value_name = "H:P")]
    heartbeat_to: Option<String>,
    /// X-Internal-Token of heartbeats
    #[arg(long, value_name = "T")]
    internal_api_token: Option<String>,
    /// connect every rank's PUB to H:P+r instead of binding (kvdir's kv_events_bind endpoint);
    /// --event_port is ignored
    #[arg(long, value_name = "tcp://H:P")]
    events_connect: Option<String>,
    /// tokens per block [default: 128]
    #[arg(long, value_name = "N")]
    block_size: Option<String>,
    /// topic frame of live messages; {name} becomes the engine's name (distinct topics for engines
    /// sharing --events_connect) [default: xllm-kv]
    #[arg(long, value_name = "T")]
    topic: Option<String>,
    /// Device tier capacity per rank, blocks [default: 1024]
    #[arg(long, value_name = "N")]
    device_blocks: Option<String>,
    /// Host tier capacity per rank, blocks (0 = no Host) [default: 0]
    #[arg(long, value_name = "N")]
    host_blocks: Option<String>,
    /// u64 | bin32 [default: u64]
    #[arg(long, value_name = "M")]
    hash_mode: Option<String>,
    /// array | short_array | map [default: array]
    #[arg(long, value_name = "F")]
    batch_form: Option<String>,
    /// map | positional [default: map]
    #[arg(long, value_name = "F")]
    event_form: Option<String>,
    /// synthetic requests per second over all ranks (0 = idle) [default: 1]
    #[arg(long, value_name = "R")]
    rate: Option<String>,
    /// workload seed [default: 42]
    #[arg(long, value_name = "S")]
    seed: Option<String>,
    /// stop after N seconds [default: run until Ctrl-C]
    #[arg(long, value_name = "N")]
    duration_s: Option<String>,
    /// write {"token_ids":} of system prompt 0 there, for kvdir queries [default: ...]
    #[arg(long, value_name = "PATH")]
    query_file: Option<String>,
    /// serve OpenAI chat/completions with this model (a directory with tokenizer.json and
    /// tokenizer_config.json, or a tokenizer.json); needs --http_port
    #[arg(long, value_name = "P")]
    tokenizer_path: Option<String>,
    /// Jinja chat template overriding the model's
    #[arg(long, value_name = "FILE")]
    chat_template: Option<String>,
    /// the model name requests must give [default: --tokenizer_path as given]
    #[arg(long, value_name = "N")]
    served_model_name: Option<String>,
    /// simulated prefill per uncached prompt token, us [default: 20]
    #[arg(long, value_name = "N")]
    prefill_us_per_token: Option<String>,
    /// simulated decode per output token, us [default: 1000]
    #[arg(long, value_name = "N")]
    decode_us_per_token: Option<String>,
    /// output tokens of a request that gives no max_tokens [default: 16]
    #[arg(long, value_name = "N")]
    max_tokens: Option<String>,
    /// usage.prompt_tokens_details.cached_tokens: actual, or a misreport to test a router's audit:
    /// zero, half, absent (null details, as vLLM without --enable-prompt-tokens-details) [default:
    /// actual]
    #[arg(long, value_name = "M")]
    report_cached_tokens: Option<String>,
    /// write the project's demo model (a small BPE tokenizer and a ChatML template) into DIR and
    /// exit; use with --tokenizer_path DIR
    #[arg(long, value_name = "DIR")]
    write_demo_model: Option<String>,
}

/// The command, set up as every binary's ([`args::command`]).
pub fn command() -> clap::Command {
    args::command(Cli::command())
}

/// `kvdir-sim --help`.
pub fn help() -> String {
    command().render_help().to_string()
}
