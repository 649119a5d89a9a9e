//! Tests of the chat flags: defaults, the kvdir flags a run passes, and problems that name the
//! flag, the value and the fix.

use super::*;

fn parse(args: &[&str]) -> Result<ChatCommand, BenchError> {
    parse_chat_args(args.iter().map(|a| a.to_string()))
}

fn run_options(args: &[&str]) -> ChatOptions {
    match parse(args) {
        Ok(ChatCommand::Run(o)) => *o,
        other => panic!("{args:?}: {other:?}"),
    }
}

const REQUIRED: [&str; 2] = ["--etcd_addr=127.0.0.1:2379", "--spawn_kvdir=/bin/kvdir"];

#[test]
fn defaults_and_the_kvdir_flags_of_a_run() {
    let o = run_options(&REQUIRED);
    assert_eq!((o.engines, o.dp_size, o.clients, o.requests), (4, 1, 4, 200));
    assert_eq!(o.system_prompt_tokens + USER_TURN_TOKENS, 1000);
    assert!(!o.stream && !o.direct);
    let b = o.bench_options(std::path::Path::new("/tmp/m"));
    assert_eq!(
        b.kvdir_args,
        ["--tokenizer_path=/tmp/m", "--served_model_name=kvdir-demo", "--load_balance_policy=CAR"]
    );
    assert_eq!(b.host_blocks, 0);
    let Mode::Etcd { namespace, .. } = b.mode else { panic!("etcd mode") };
    assert!(namespace.starts_with("kvdir-chat-"), "{namespace}");
}

#[test]
fn policy_prompt_size_switches_and_passthrough() {
    let mut args = REQUIRED.to_vec();
    args.extend([
        "--policy=RR",
        "--prompt_tokens=8000",
        "--stream",
        "--kvdir_arg=--max_request_bytes=16777216",
    ]);
    let o = run_options(&args);
    assert_eq!(o.system_prompt_tokens, 8000 - USER_TURN_TOKENS);
    assert!(o.stream);
    assert_eq!((o.siblings, run_options(&REQUIRED).siblings), (1, 1), "off by default");
    let b = o.bench_options(std::path::Path::new("/m"));
    assert_eq!(b.kvdir_args[2..], ["--load_balance_policy=RR", "--max_request_bytes=16777216"]);
    let o = run_options(&["--etcd_addr=127.0.0.1:2379", "--direct", "--system_prompt_tokens=50"]);
    assert!(o.direct && o.kvdir.spawn_kvdir.is_none());
    assert_eq!(o.system_prompt_tokens, 50);
    assert_eq!(o.bench_options(std::path::Path::new("/m")).spawn_kvdir, None);
}

#[test]
fn every_problem_names_the_flag_and_the_fix() {
    let err = parse(&[
        "--engines=0",
        "--policy=FAST",
        "--prompt_tokens=lots",
        "--duration_seconds=0",
        "--stream=maybe",
        "--siblings=0",
        "--etcd_addr=10.0.0.1:2379",
        "--bogus=1",
    ])
    .unwrap_err()
    .to_string();
    for needle in [
        "--spawn_kvdir PATH is required (or --direct to bypass kvdir)",
        "--engines = 0 is below the minimum 1",
        "--policy = \"FAST\" is not one of CAR, RR, SLO_AWARE",
        "--prompt_tokens = \"lots\" is not a token count in 1..=1000000",
        "--duration_seconds = \"0\" is not seconds in 0.1..=3600",
        "--stream = \"maybe\" is not true or false",
        "--siblings = \"0\" is not a count in 1..=64",
        "--etcd_addr = 10.0.0.1:2379 is not on this host",
        "unknown flag --bogus; run kvdir-bench chat --help",
    ] {
        assert!(err.contains(needle), "{needle} missing from {err}");
    }
    let both = parse(&["--prompt_tokens=10", "--system_prompt_tokens=5"]).unwrap_err().to_string();
    assert!(both.contains("--etcd_addr H:P is required"), "{both}");
    assert!(both.contains("both size the prompt; give one"), "{both}");
}

#[test]
fn siblings_are_a_count() {
    let mut args = REQUIRED.to_vec();
    args.push("--siblings=8");
    assert_eq!(run_options(&args).siblings, 8);
}

#[test]
fn rate_is_requests_per_second_zero_is_the_closed_loop_and_prefill_may_be_serial() {
    assert_eq!(run_options(&REQUIRED).rate, 0.0);
    let mut args = REQUIRED.to_vec();
    args.extend(["--rate=12.5", "--serial_prefill"]);
    let o = run_options(&args);
    assert_eq!((o.rate, o.serial_prefill), (12.5, true));
    args.push("--rate=-1");
    let err = parse(&args).unwrap_err().to_string();
    assert!(
        err.contains("--rate=\"-1\" is not a number of requests per second in 0..=100000"),
        "{err}"
    );
}

#[test]
fn help_is_asked_for() {
    assert_eq!(parse(&["--help"]).unwrap(), ChatCommand::Help);
}
