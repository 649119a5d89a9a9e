//! The `kvdir` command line, declared for clap: every flag's name (`--flag=value` and
//! `--flag value`), value name, help text, plain default and environment variable
//! (`KVDIR_` and the flag's name in capitals, the usual way to configure a service in a
//! container). Values are kept as text here and checked in [`super::parse_flags`], so every bad
//! value is reported at once; the errors clap finds itself (an unknown flag, a missing value)
//! become problems of the same list ([`crate::config::args`]).

use clap::CommandFactory;

use crate::config::args;

/// `kvdir`'s flags, each named after its field (`snake_case`, as in xllm-service). Declaration
/// only: [`super::parse_flags`] reads each value by name from the matches, with its source and
/// position, so the fields themselves are never read.
#[allow(dead_code)]
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvdir",
    version,
    about = "kvdir: KV-cache directory and cache-aware router for vLLM, SGLang and xLLM fleets",
    rename_all = "snake_case"
)]
struct Cli {
    /// JSON file with `streams` (or `discovery`) and limits; empty or absent disables the directory
    #[arg(long, env = "KVDIR_KV_EVENTS_CONFIG_FILE", value_name = "PATH")]
    kv_events_config_file: Option<String>,
    /// bind this endpoint (tcp://*:5557) for engines that connect to kvdir; overrides
    /// kv_events_bind.endpoint of the config file [default: none]
    #[arg(long, env = "KVDIR_KV_EVENTS_BIND", value_name = "ENDPOINT")]
    kv_events_bind: Option<String>,
    /// HTTP port; 0 picks a free one
    #[arg(long, env = "KVDIR_HTTP_SERVER_PORT", value_name = "PORT", default_value = "8888")]
    http_server_port: String,
    /// HTTP bind address
    #[arg(long, env = "KVDIR_SERVER_HOST", value_name = "ADDR", default_value = "127.0.0.1")]
    server_host: String,
    /// HTTP connections open at most (each holds a file descriptor; an engine's heartbeats keep
    /// one); beyond it new connections wait in the listen queue
    #[arg(long, env = "KVDIR_HTTP_MAX_CONNECTIONS", value_name = "N", default_value = "4096")]
    http_max_connections: String,
    /// an idle keep-alive HTTP connection is closed after MS
    #[arg(long, env = "KVDIR_HTTP_KEEP_ALIVE_MS", value_name = "MS", default_value = "5000")]
    http_keep_alive_ms: String,
    /// require X-Internal-Token on internal endpoints
    #[arg(long, env = "KVDIR_INTERNAL_API_TOKEN", value_name = "TOKEN")]
    internal_api_token: Option<String>,
    /// largest accepted HTTP body
    #[arg(long, env = "KVDIR_MAX_REQUEST_BYTES", value_name = "N", default_value = "4194304")]
    max_request_bytes: String,
    /// largest accepted token_ids list
    #[arg(long, env = "KVDIR_MAX_QUERY_TOKENS", value_name = "N", default_value = "1048576")]
    max_query_tokens: String,
    /// etcd of the instance registry (routing, discovery); empty: no etcd, only listed engines
    #[arg(
        long,
        env = "KVDIR_ETCD_ADDR",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:2379"
    )]
    etcd_addr: String,
    /// key prefix /NS/ of the instance registry [default: none]
    #[arg(long, env = "KVDIR_ETCD_NAMESPACE", value_name = "NS")]
    etcd_namespace: Option<String>,
    /// RR, SLO_AWARE, CAR or TTFT, for /v1/internal/route and, when given without
    /// --frontend_policy, the front door [default: CAR]
    #[arg(long, env = "KVDIR_LOAD_BALANCE_POLICY", value_name = "P")]
    load_balance_policy: Option<String>,
    /// the front door's policy [default: --load_balance_policy if given, else TTFT]
    #[arg(long, env = "KVDIR_FRONTEND_POLICY", value_name = "P")]
    frontend_policy: Option<String>,
    /// CAR weight of cache reuse against queue length, 0..=1
    #[arg(long, env = "KVDIR_CAR_PREFILL_LAMBDA", value_name = "X", default_value = "0.5")]
    car_prefill_lambda: String,
    /// CAR weight of Host-only hits against Device hits, 0..=1
    #[arg(long, env = "KVDIR_CAR_HOST_HIT_WEIGHT", value_name = "X", default_value = "0.5")]
    car_host_hit_weight: String,
    /// predict-on-route: a routed request's blocks count as expected on its instance for MS, until
    /// the engine's events confirm them; 0 turns it off
    #[arg(long, env = "KVDIR_CAR_PREDICT_TTL_MS", value_name = "MS", default_value = "2000")]
    car_predict_ttl_ms: String,
    /// CAR weight of expected (predicted) blocks against exact hits, 0..=1
    #[arg(long, env = "KVDIR_CAR_PREDICT_WEIGHT", value_name = "X", default_value = "0.5")]
    car_predict_weight: String,
    /// TTFT: prefill rate of one DP rank until one is learned from the front door's observed TTFTs
    #[arg(
        long,
        env = "KVDIR_TTFT_PREFILL_TOKENS_PER_S",
        value_name = "X",
        default_value = "10000"
    )]
    ttft_prefill_tokens_per_s: String,
    /// TTFT: fixed cost of every request
    #[arg(long, env = "KVDIR_TTFT_OVERHEAD_MS", value_name = "MS", default_value = "5")]
    ttft_overhead_ms: String,
    /// TTFT: decode term of an instance with a full KV cache, scaled by gpu_cache_usage_perc
    #[arg(long, env = "KVDIR_TTFT_DECODE_MS", value_name = "MS", default_value = "10")]
    ttft_decode_ms: String,
    /// TTFT: weight of a cache miss on a loaded fleet (its prefill beyond the best candidate's,
    /// times the fleet's pressure and (4 r (1 - r))^3 of its reuse r)
    #[arg(long, env = "KVDIR_TTFT_LATER_WEIGHT", value_name = "X", default_value = "12")]
    ttft_later_weight: String,
    /// TTFT: weight of the delay a request's prefill adds to those arriving while the queue
    /// ahead of it drains (its service times the requests ahead, times the fleet's pressure)
    #[arg(long, env = "KVDIR_TTFT_QUEUE_WEIGHT", value_name = "X", default_value = "0.05")]
    ttft_queue_weight: String,
    /// SLO_AWARE time-to-first-token target
    #[arg(long, env = "KVDIR_TARGET_TTFT", value_name = "MS", default_value = "1000")]
    target_ttft: String,
    /// SLO_AWARE time-per-output-token target
    #[arg(long, env = "KVDIR_TARGET_TPOT", value_name = "MS", default_value = "50")]
    target_tpot: String,
    /// the served model's tokenizer.json, or its directory (with tokenizer_config.json); turns on
    /// the OpenAI front door (/v1/chat/completions, /v1/completions, /v1/models)
    #[arg(long, env = "KVDIR_TOKENIZER_PATH", value_name = "PATH")]
    tokenizer_path: Option<String>,
    /// Jinja chat template overriding tokenizer_config.json's
    #[arg(long, env = "KVDIR_CHAT_TEMPLATE", value_name = "FILE")]
    chat_template: Option<String>,
    /// model name of the front door [default: the tokenizer directory's name]
    #[arg(long, env = "KVDIR_SERVED_MODEL_NAME", value_name = "NAME")]
    served_model_name: Option<String>,
    /// LoRA adapter names the engines serve; a request whose `model` names one is looked up in that
    /// adapter's keys
    #[arg(long, env = "KVDIR_LORA_ADAPTERS", value_name = "A,B")]
    lora_adapters: Option<String>,
    /// require `Authorization: Bearer KEY` on the front door
    #[arg(long, env = "KVDIR_API_KEY", value_name = "KEY")]
    api_key: Option<String>,
    /// connecting to an engine
    #[arg(
        long,
        env = "KVDIR_UPSTREAM_CONNECT_TIMEOUT_MS",
        value_name = "MS",
        default_value = "3000"
    )]
    upstream_connect_timeout_ms: String,
    /// waiting for an engine's response head, and the longest silence between two chunks of its
    /// body
    #[arg(long, env = "KVDIR_UPSTREAM_TIMEOUT_MS", value_name = "MS", default_value = "300000")]
    upstream_timeout_ms: String,
    /// hold a front door request while every engine's estimated time to first token is above MS; 0
    /// turns it off
    #[arg(long, env = "KVDIR_OVERLOAD_TTFT_MS", value_name = "MS", default_value = "0")]
    overload_ttft_ms: String,
    /// requests held at most; past it they get 429
    #[arg(long, env = "KVDIR_OVERLOAD_QUEUE", value_name = "N", default_value = "256")]
    overload_queue: String,
    /// the longest a request is held, then it is sent anyway
    #[arg(long, env = "KVDIR_OVERLOAD_MAX_WAIT_MS", value_name = "MS", default_value = "30000")]
    overload_max_wait_ms: String,
    /// validate flags and the config file, then exit
    #[arg(long, env = "KVDIR_CHECK_CONFIG")]
    check_config: bool,
    /// run with in-process simulated engines (the default with no flag and no KVDIR_ variable)
    #[arg(long, env = "KVDIR_DEMO")]
    demo: bool,
    /// run the demo and stop it after N seconds [default: run until Ctrl-C]
    #[arg(long, env = "KVDIR_DEMO_SECONDS", value_name = "N")]
    demo_seconds: Option<String>,
    /// text or json (one object per line), to stderr; filter with RUST_LOG, e.g.
    /// RUST_LOG=kvdir_service=debug
    #[arg(long, env = "KVDIR_LOG_FORMAT", value_name = "F", default_value = "text")]
    log_format: String,
    /// accepted for xllm-service compatibility and ignored with a warning (one per occurrence):
    /// set block_size in the kv_events_config_file
    #[arg(long, env = "KVDIR_BLOCK_SIZE", value_name = "N", action = clap::ArgAction::Append)]
    block_size: Vec<String>,
}

/// The command: [`Cli`] as [`args::command`] sets it up, and with no environment value shown
/// in `--help` (`KVDIR_API_KEY` is a secret).
pub fn command() -> clap::Command {
    args::command(Cli::command()).mut_args(|a| a.hide_env_values(true))
}
