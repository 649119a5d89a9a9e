//! The text of `kvdir-sim --help`.

/// `kvdir-sim --help`.
pub const HELP: &str = "\
kvdir-sim: simulated xLLM (or vLLM) engines that publish KV-cache events over ZeroMQ

USAGE: kvdir-sim [--flag=value | --flag value]...

  --name NAME           instance name prefix; engine k is NAME-k            [sim]
  --engines N           number of engines                                    [1]
  --dp_size N           DP ranks per engine                                  [1]
  --event_port P        PUB port of engine 0 rank 0 (0 = ephemeral)          [18000]
  --replay_port P       ROUTER (snapshot) port of engine 0 rank 0 (0 = eph.) [38000]
                        engine k rank r binds PORT + k*dp_size + r on 127.0.0.1
  --http_port P         business HTTP port of engine 0 (0 = none); engine k   [0]
                        uses P + k*100, serves GET /health, is named
                        127.0.0.1:<port>, and binds events on port+10000+r and
                        snapshots on port+30000+r (--event_port/--replay_port
                        are then ignored)
  --dialect D           xllm | vllm: vllm replays the last --buffer_steps batches [xllm]
                        (history, not snapshots), serves GET /metrics and an empty
                        GET /health, reports cached_tokens without the prompt's
                        last token, and registers nowhere unless --etcd_addr
  --buffer_steps N      vllm: batches each rank keeps for replay              [10000]
  --etcd_addr H:P       register every engine in this etcd (needs --http_port)
  --etcd_namespace NS   etcd key namespace (keys under /NS/)                 []
  --instance_type T     0 DEFAULT | 1 PREFILL | 2 DECODE | 3 MIX             [0]
  --heartbeat_to H:P    POST heartbeats to this kvdir (needs --etcd_addr)
  --internal_api_token T  X-Internal-Token of heartbeats
  --events_connect tcp://H:P  connect every rank's PUB to H:P+r instead of binding
                        (kvdir's kv_events_bind endpoint); --event_port is ignored
  --block_size N        tokens per block                                     [128]
  --topic T             topic frame of live messages; {name} becomes the engine's
                        name (distinct topics for engines sharing --events_connect) [xllm-kv]
  --device_blocks N     Device tier capacity per rank, blocks                [1024]
  --host_blocks N       Host tier capacity per rank, blocks (0 = no Host)    [0]
  --hash_mode M         u64 | bin32                                          [u64]
  --batch_form F        array | short_array | map                            [array]
  --event_form F        map | positional                                     [map]
  --rate R              synthetic requests per second over all ranks (0 = idle) [1]
  --seed S              workload seed                                        [42]
  --duration_s N        stop after N seconds (default: run until Ctrl-C)
  --query_file PATH     write {\"token_ids\": [...]} of system prompt 0 there, for kvdir queries
  --tokenizer_path P    serve OpenAI chat/completions with this model (a directory with
                        tokenizer.json and tokenizer_config.json, or a tokenizer.json);
                        needs --http_port
  --chat_template FILE  Jinja chat template overriding the model's
  --served_model_name N the model name requests must give        [--tokenizer_path]
  --prefill_us_per_token N  simulated prefill per uncached prompt token, us     [20]
  --decode_us_per_token N   simulated decode per output token, us             [1000]
  --max_tokens N        output tokens of a request that gives no max_tokens  [16]
  --report_cached_tokens M  usage.prompt_tokens_details.cached_tokens: actual, or a
                        misreport to test a router's audit: zero, half, absent (null
                        details, as vLLM without --enable-prompt-tokens-details) [actual]
  --write_demo_model DIR  write the project's demo model (a small BPE tokenizer and a
                        ChatML template) into DIR and exit; use with --tokenizer_path DIR
  --help                this text

Prints every engine's endpoints and the {\"streams\": [...]} JSON for a kvdir config file,
then drives a shared-prefix workload (a few system prompts, multi-turn sessions routed to a
fixed rank each) until Ctrl-C or --duration_s. With --tokenizer_path every engine also serves
POST /v1/chat/completions and /v1/completions on its HTTP port: it tokenizes like the engine,
answers from the DP rank holding the longest cached prefix (ties: fewest requests in flight,
then lowest rank), reports usage.prompt_tokens_details.cached_tokens and the rank in the
x-sim-dp-rank header, publishes the request's KV events and streams tokens (stream: true).
";
