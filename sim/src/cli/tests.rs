//! Flag parsing and the engine configs and registrations the flags describe.

use super::*;

fn parse(args: &[&str]) -> Result<CliCommand, SimError> {
    parse_args(args.iter().map(|s| s.to_string()))
}

#[test]
fn both_flag_forms_and_defaults() {
    let CliCommand::Run(o) =
        parse(&["--dp_size=2", "--engines", "3", "--topic=", "--hash_mode", "BIN32"]).unwrap()
    else {
        panic!("not run")
    };
    assert_eq!((o.dp_size, o.engines, o.topic.as_str()), (2, 3, ""));
    assert_eq!(o.hash_mode, HashMode::Bin32);
    assert_eq!((o.event_port, o.replay_port, o.block_size), (18000, 38000, 128));
    assert_eq!(parse(&["--rate=2", "--help"]).unwrap(), CliCommand::Help);
}

#[test]
fn all_problems_are_reported_together() {
    let err = parse(&["--dp_size=x", "--bogus=1", "stray", "--rate=-1", "--name", "--seed"]);
    let msg = err.unwrap_err().to_string();
    for needle in [
        "--dp_size = \"x\"",
        "unknown flag --bogus",
        "\"stray\"",
        "--rate",
        "--name needs",
        "--seed needs",
    ] {
        assert!(msg.contains(needle), "{needle} missing from {msg}");
    }
}

#[test]
fn engines_get_consecutive_port_ranges_and_names() {
    let o = CliOptions { engines: 2, dp_size: 3, ..CliOptions::default() };
    let configs = o.engine_configs().unwrap();
    assert_eq!(configs[1].name, "sim-1");
    assert_eq!((configs[1].event_port, configs[1].replay_port), (18003, 38003));
    let o = CliOptions { engines: 2, event_port: 0, replay_port: 0, ..CliOptions::default() };
    assert!(o.engine_configs().unwrap().iter().all(|c| c.event_port == 0));
    let o = CliOptions { engines: 3, event_port: 65534, ..CliOptions::default() };
    assert!(o.engine_configs().unwrap_err().to_string().contains("65536"));
}

#[test]
fn http_port_gives_engines_100_ports_apart_and_derived_zmq_ports() {
    let CliCommand::Run(o) =
        parse(&["--http_port=8000", "--engines=2", "--dp_size=2", "--event_port=1"]).unwrap()
    else {
        panic!("not run")
    };
    let configs = o.engine_configs().unwrap();
    assert_eq!(configs[1].http_port, 8100);
    assert_eq!(configs[1].instance_name(), "127.0.0.1:8100");
    let resolved = configs[1].resolved();
    assert_eq!((resolved.event_port, resolved.replay_port), (18100, 38100));
    assert!(o.registration_options().is_none());
}

#[test]
fn registration_flags_are_checked_together() {
    let msg = parse(&["--etcd_addr=127.0.0.1:2379", "--instance_type=4"]).unwrap_err().to_string();
    assert!(msg.contains("--instance_type = 4"), "{msg}");
    let CliCommand::Run(o) = parse(&["--etcd_addr=127.0.0.1:2379", "--heartbeat_to=h:1"]).unwrap()
    else {
        panic!("not run")
    };
    let msg = o.engine_configs().unwrap_err().to_string();
    assert!(msg.contains("--etcd_addr needs --http_port"), "{msg}");
    let o = CliOptions { heartbeat_to: Some("h:1".into()), ..CliOptions::default() };
    assert!(o.engine_configs().unwrap_err().to_string().contains("--heartbeat_to needs"));
    let o = CliOptions { http_port: 8000, dp_size: 101, engines: 101, ..CliOptions::default() };
    let msg = o.engine_configs().unwrap_err().to_string();
    assert!(msg.contains("--dp_size = 101") && msg.contains("--engines = 101"), "{msg}");
}

#[test]
fn registration_options_follow_the_flags() {
    let args = [
        "--http_port=8000",
        "--etcd_addr=127.0.0.1:2379",
        "--etcd_namespace=prod",
        "--instance_type=1",
        "--heartbeat_to=127.0.0.1:9000",
        "--internal_api_token=s",
    ];
    let CliCommand::Run(o) = parse(&args).unwrap() else { panic!("not run") };
    let r = o.registration_options().unwrap();
    assert_eq!((r.etcd.as_str(), r.namespace.as_str(), r.kind), ("127.0.0.1:2379", "prod", 1));
    assert_eq!(r.heartbeat_to.as_deref(), Some("127.0.0.1:9000"));
    assert_eq!(r.internal_token.as_deref(), Some("s"));
    assert!(r.write_loadmetrics);
}

#[test]
fn text_flags_load_one_model_for_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    kvdir_text::demo::write_model(dir.path()).unwrap();
    let path = dir.path().display().to_string();
    let args = [
        "--http_port=8000",
        "--engines=2",
        "--tokenizer_path",
        path.as_str(),
        "--prefill_us_per_token=7",
        "--decode_us_per_token=0",
        "--max_tokens=3",
        "--report_cached_tokens=half",
    ];
    let CliCommand::Run(o) = parse(&args).unwrap() else { panic!("not run") };
    let configs = o.engine_configs().unwrap();
    let (a, b) = (configs[0].openai.as_ref().unwrap(), configs[1].openai.as_ref().unwrap());
    assert!(std::sync::Arc::ptr_eq(&a.model, &b.model), "one model for all engines");
    assert_eq!(a.served_model_name, path, "named by its path by default");
    assert_eq!((a.prefill_us_per_token, a.decode_us_per_token, a.max_tokens), (7, 0, 3));
    assert_eq!(
        (a.cached_report, a.cached_report.report(33)),
        (crate::CachedReport::Half, Some(16))
    );
    let named = CliOptions {
        text: TextOptions { served_model_name: Some("m".into()), ..o.text.clone() },
        ..(*o).clone()
    };
    assert_eq!(named.engine_configs().unwrap()[0].openai.as_ref().unwrap().served_model_name, "m");
    assert!(CliOptions::default().engine_configs().unwrap()[0].openai.is_none());
}

#[test]
fn text_flag_problems_name_the_value_and_the_fix() {
    let missing = std::env::temp_dir().join("kvdir-sim-no-such-model");
    let missing = missing.display().to_string();
    let o = CliOptions {
        text: TextOptions { tokenizer_path: Some(missing.clone()), ..TextOptions::default() },
        ..CliOptions::default()
    };
    let msg = o.engine_configs().unwrap_err().to_string();
    assert!(msg.contains("needs --http_port"), "{msg}");
    let o = CliOptions { http_port: 8000, ..o };
    let msg = o.engine_configs().unwrap_err().to_string();
    assert!(msg.contains(&format!("--tokenizer_path {missing}")), "{msg}");
    let msg = parse(&["--max_tokens=x", "--chat_template=t.jinja"]).unwrap_err().to_string();
    assert!(msg.contains("--max_tokens = \"x\""), "{msg}");
    let msg = parse(&["--report_cached_tokens=lies"]).unwrap_err().to_string();
    assert!(msg.contains("actual, zero, half, absent"), "{msg}");
    let CliCommand::Run(o) = parse(&["--chat_template=t.jinja"]).unwrap() else { panic!() };
    let msg = o.engine_configs().unwrap_err().to_string();
    assert!(msg.contains("need --tokenizer_path"), "{msg}");
    let flags = ["--tokenizer_path", "--chat_template", "--prefill_us_per_token", "x-sim-dp-rank"];
    for flag in flags.into_iter().chain(["--report_cached_tokens"]) {
        assert!(help().contains(flag), "{flag} missing from the help");
    }
}

#[test]
fn write_demo_model_stands_alone() {
    assert_eq!(
        parse(&["--write_demo_model", "/tmp/m"]).unwrap(),
        CliCommand::WriteDemoModel("/tmp/m".into())
    );
    let msg = parse(&["--write_demo_model=/tmp/m", "--dp_size=2"]).unwrap_err().to_string();
    assert!(msg.contains("--write_demo_model DIR is used alone"), "{msg}");
}

#[test]
fn dialect_flags_make_vllm_engines_that_do_not_register() {
    let CliCommand::Run(o) = parse(&["--dialect=vllm", "--buffer_steps", "7"]).unwrap() else {
        panic!("not run")
    };
    let configs = o.engine_configs().unwrap();
    assert_eq!((configs[0].dialect, configs[0].buffer_steps), (Dialect::Vllm, 7));
    assert!(o.registration_options().is_none(), "vLLM registers nowhere by default");
    let o = CliOptions { http_port: 8000, etcd_addr: Some("127.0.0.1:2379".into()), ..*o };
    let backend = o.registration_options().unwrap().backend_type;
    assert_eq!(backend.as_deref(), Some("vllm"), "registered by hand as vllm");
    let msg = parse(&["--dialect=sglang"]).unwrap_err().to_string();
    assert!(msg.contains("--dialect = \"sglang\" is not one of xllm, vllm"), "{msg}");
    let CliCommand::Run(o) = parse(&["--dialect=vllm", "--buffer_steps=0"]).unwrap() else {
        panic!("not run")
    };
    let msg = o.engine_configs().unwrap_err().to_string();
    assert!(msg.contains("buffer_steps = 0"), "{msg}");
    assert_eq!(CliOptions::default().dialect, Dialect::Xllm);
    assert!(help().contains("--dialect") && help().contains("--buffer_steps"));
}

#[test]
fn events_connect_makes_every_engine_connect_with_a_topic_of_its_own() {
    let CliCommand::Run(o) =
        parse(&["--engines=2", "--events_connect=tcp://127.0.0.1:5557", "--topic=kv@{name}@"])
            .unwrap()
    else {
        panic!("not run")
    };
    let configs = o.engine_configs().unwrap();
    assert_eq!(configs[1].events_connect.as_deref(), Some("tcp://127.0.0.1:5557"));
    assert_eq!((configs[0].topic.as_str(), configs[1].topic.as_str()), ("kv@sim-0@", "kv@sim-1@"));
    assert_eq!((configs[1].event_port, configs[1].replay_port), (0, 38001));
    let bad = CliOptions { events_connect: Some("5557".into()), ..CliOptions::default() };
    assert!(bad.engine_configs().unwrap_err().to_string().contains("is not tcp://host:port"));
}
