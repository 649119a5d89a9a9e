//! Tests of the command line: both forms, every problem at once (clap's and the values'), the
//! demo rule, the policies and the flags kept for xllm-service.

use super::*;

#[test]
fn flags_accept_both_forms_and_report_all_errors() {
    let Command::Run(f) = parse_flags(&[
        "--http_server_port=9000",
        "--server_host",
        "127.0.0.2",
        "--kv_events_config_file=",
        "--internal_api_token",
        "s3cret",
        "--check_config",
    ])
    .unwrap() else {
        panic!("run expected")
    };
    assert_eq!(f.http_server_port, 9000);
    assert_eq!(f.server_host, "127.0.0.2");
    assert_eq!(f.kv_events_config_file, None, "an empty path disables the directory");
    assert_eq!(f.internal_api_token.as_deref(), Some("s3cret"));
    assert!(f.check_config);
    assert_eq!(f.log_format, LogFormat::Text, "the default");

    let Command::Run(f) = parse_flags(&["--log_format", "json"]).unwrap() else {
        panic!("run expected")
    };
    assert_eq!(f.log_format, LogFormat::Json);
    let err = parse_flags(&["--log_format=xml"]).unwrap_err();
    assert_eq!(err.problems, ["--log_format=\"xml\" is not supported; use text or json"]);

    let err =
        parse_flags(&["--http_server_port=70000", "--bogus=1", "--max_request_bytes"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--http_server_port=\"70000\" is not an integer in 0..=65535",
            "unknown flag --bogus; run kvdir --help for the list",
            "--max_request_bytes needs a value: --max_request_bytes=VALUE",
        ]
    );
    assert_eq!(parse_flags(&["--help"]).unwrap(), Command::Help);
    let err = parse_flags(&[
        "--car_prefill_lambda=1.5",
        "--load_balance_policy=FASTEST",
        "--target_ttft=-1",
    ])
    .unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--car_prefill_lambda=\"1.5\" is outside the allowed range 0..=1",
            "--load_balance_policy=\"FASTEST\" is not one of RR, SLO_AWARE, CAR, TTFT",
            "--target_ttft=\"-1\" is not a non-negative number of milliseconds",
        ]
    );
    let Command::Run(f) =
        parse_flags(&["--load_balance_policy", "RR", "--car_host_hit_weight=1"]).unwrap()
    else {
        panic!("run expected")
    };
    assert_eq!((f.route.policy, f.route.host_weight), (crate::car::Policy::Rr, 1.0));
    let no_args = Flags { demo: true, ..Flags::default() };
    assert_eq!(
        parse_flags::<&str>(&[]).unwrap(),
        Command::Run(Box::new(no_args)),
        "no flags runs the demo"
    );
}

#[test]
fn predict_on_route_flags_are_validated_and_zero_turns_it_off() {
    let Command::Run(f) =
        parse_flags(&["--car_predict_ttl_ms=0", "--car_predict_weight", "0.25"]).unwrap()
    else {
        panic!("run expected")
    };
    assert_eq!((f.route.predict_ttl_ms, f.route.predict_weight), (0, 0.25));
    assert_eq!(Flags::default().route.predict_ttl_ms, 2000);
    let err = parse_flags(&["--car_predict_ttl_ms=2s", "--car_predict_weight=2"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--car_predict_ttl_ms=\"2s\" is not an integer in 0..=600000",
            "--car_predict_weight=\"2\" is outside the allowed range 0..=1",
        ]
    );
}

#[test]
fn overload_flags_are_validated_and_off_by_default() {
    let off = Flags::default().front.overload;
    assert_eq!((off.enabled(), off.queue, off.max_wait_ms), (false, 256, 30_000));
    let args = ["--overload_ttft_ms=2000", "--overload_queue", "0", "--overload_max_wait_ms=500"];
    let Command::Run(f) = parse_flags(&args).unwrap() else { panic!("run expected") };
    let o = f.front.overload;
    assert_eq!((o.enabled(), o.ttft_bound_ms, o.queue, o.max_wait_ms), (true, 2000, 0, 500));
    let err = parse_flags(&["--overload_ttft_ms=-1", "--overload_max_wait_ms=0"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--overload_ttft_ms=\"-1\" is not an integer in 0..=3600000",
            "--overload_max_wait_ms=\"0\" is not an integer in 1..=3600000",
        ]
    );
}

#[test]
fn the_ttft_policy_and_its_settings_are_validated() {
    let args = ["--load_balance_policy=TTFT", "--ttft_prefill_tokens_per_s", "8000"];
    let Command::Run(f) = parse_flags(&args).unwrap() else { panic!("run expected") };
    assert_eq!((f.route.policy, f.route.ttft.tokens_per_s), (crate::car::Policy::Ttft, 8000.0));
    let args = ["--ttft_overhead_ms=2.5", "--ttft_decode_ms=0"];
    let Command::Run(f) = parse_flags(&args).unwrap() else { panic!("run expected") };
    assert_eq!((f.route.ttft.overhead_ms, f.route.ttft.decode_ms), (2.5, 0.0));
    let bad = ["--ttft_prefill_tokens_per_s=0", "--ttft_overhead_ms=-1", "--ttft_decode_ms=x"];
    let err = parse_flags(&bad).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "--ttft_prefill_tokens_per_s=\"0\" is not a number of tokens per second of at least 1",
            "--ttft_overhead_ms=\"-1\" is not a non-negative number of milliseconds",
            "--ttft_decode_ms=\"x\" is not a non-negative number of milliseconds",
        ]
    );
}

#[test]
fn a_demo_length_means_the_demo() {
    let demo = |args: &[&str]| match parse_flags(args).unwrap() {
        Command::Run(f) => (f.demo, f.demo_seconds),
        other => panic!("{other:?}"),
    };
    assert_eq!(demo(&["--demo_seconds=60"]), (true, Some(60)));
    assert_eq!(demo(&[]), (true, None), "no flags at all");
    assert_eq!(demo(&["--http_server_port=0"]), (false, None), "the service");
}

#[test]
fn the_front_door_routes_with_ttft_unless_a_policy_is_given() {
    let front = |args: &[&str]| match parse_flags(args).unwrap() {
        Command::Run(f) => (f.route.policy, f.front.policy),
        other => panic!("{other:?}"),
    };
    use crate::car::Policy::{Car, Rr, Ttft};
    assert_eq!(front(&["--demo"]), (Car, Ttft), "the defaults");
    assert_eq!(front(&["--load_balance_policy=CAR"]), (Car, Car), "it follows a given one");
    assert_eq!(front(&["--frontend_policy=TTFT"]), (Car, Ttft));
    assert_eq!(front(&["--load_balance_policy=RR"]), (Rr, Rr));
    assert_eq!(front(&["--frontend_policy=CAR", "--load_balance_policy=RR"]), (Rr, Car));
    assert_eq!(front(&["--load_balance_policy=CAR", "--frontend_policy", "TTFT"]), (Car, Ttft));
    let err = parse_flags(&["--frontend_policy=FAST"]).unwrap_err();
    assert_eq!(err.problems, ["--frontend_policy=\"FAST\" is not one of RR, SLO_AWARE, CAR, TTFT"]);
}

#[test]
fn the_old_block_size_flag_starts_with_a_warning_instead_of_failing() {
    let Command::Run(f) =
        parse_flags(&["--block_size=128", "--http_server_port", "9000", "--block_size", "16"])
            .unwrap()
    else {
        panic!("run expected")
    };
    assert_eq!(f.http_server_port, 9000, "the other flags still apply");
    assert_eq!(f.warnings.len(), 2);
    assert_eq!(
        f.warnings[0],
        "--block_size=128 does not configure the directory and is ignored (kept for xllm-service \
         command lines); set block_size in the kv_events_config_file: discovery.block_size or \
         streams[].block_size"
    );
    assert!(f.warnings[1].starts_with("--block_size=16 does not configure the directory"));
    assert!(usage().contains("--block_size"));
    let Command::Run(plain) = parse_flags(&["--http_server_port=9000"]).unwrap() else {
        panic!("run expected")
    };
    assert!(plain.warnings.is_empty());
}

#[test]
fn an_unknown_flag_suggests_the_closest_name_and_a_switch_takes_no_value() {
    let err = parse_flags(&["--etc_addr=h:1", "--demo=1", "--http_server_port=1"]).unwrap_err();
    assert_eq!(
        err.problems,
        [
            "unknown flag --etc_addr (did you mean --etcd_addr?); run kvdir --help for the list",
            "--demo takes no value",
        ]
    );
}
