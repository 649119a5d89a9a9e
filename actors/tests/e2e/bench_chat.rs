//! `kvdir-bench chat` against the real `kvdir` binary it spawns: a handful of chat requests
//! through the front door to simulated OpenAI engines in a real etcd (test support uses
//! `KVDIR_TEST_ETCD` or starts a private one); everything binds 127.0.0.1 and the run is
//! bounded by its request count and duration.

use kvdir_bench::chat::{self, ChatCommand, ChatOptions};
use kvdir_testkit::etcd::etcd_endpoint;

use crate::common::load_tool_turn;

fn options(flags: &[&str]) -> ChatOptions {
    let mut args = vec![format!("--spawn_kvdir={}", env!("CARGO_BIN_EXE_kvdir"))];
    args.extend(flags.iter().map(|f| f.to_string()));
    match chat::parse_chat_args(args) {
        Ok(ChatCommand::Run(o)) => *o,
        other => panic!("{flags:?}: {other:?}"),
    }
}

/// Two system prompts over two engines, twelve streamed requests from two clients: every
/// request is served through kvdir, repeated system prompts come back cached, and kvdir's CPU
/// and tokenization time are read.
#[test]
fn a_short_chat_run_counts_its_requests_and_sees_cached_system_prompts() {
    let _turn = load_tool_turn();
    let etcd = etcd_endpoint();
    let o = options(&[
        &format!("--etcd_addr={}", etcd.endpoint),
        "--engines=2",
        "--clients=2",
        "--requests=12",
        "--duration_seconds=60",
        "--system_prompts=2",
        "--prompt_tokens=400",
        "--decode_us_per_token=100",
        "--max_tokens=4",
        "--stream",
        "--sync_timeout_seconds=30",
    ]);
    let report = chat::run(&o).expect("the run completes");
    let text = report.text();
    assert_eq!((report.served(), report.errors()), (12, 0), "{text}");
    assert_eq!(report.stats.instances.values().sum::<u64>(), 12, "{text}");
    assert!(report.stats.prompt_tokens >= 12 * 200, "{text}");
    assert!(report.stats.cached_tokens > 0, "repeated system prompts are cached: {text}");
    assert!(report.kvdir_cpu.is_some_and(|c| c >= 0.0), "{text}");
    let (_, tokenized) = report.tokenization.expect("the tokenization histogram is read");
    assert_eq!(tokenized, 12, "{text}");
    let json = report.json();
    assert_eq!(json["requests"]["ok"], 12, "{json}");
}
