//! The parity check at registration, end to end: kvdir with the demo model's tokenizer lists
//! simulated vLLM engines (which tokenize over `POST /tokenize` and report their block size in
//! `/metrics`). With the engines' own template every check agrees; with a deliberately wrong
//! template, or a wrong block size in the listing, an operator sees the disagreement before any
//! traffic: `engine.parity` in `/v1/internal/instances`, `kvdir_engine_parity_mismatch` in
//! `/metrics`, and a WARN naming the first differing position.

use super::listed::listed_without_events;
use super::*;

/// kvdir listing `listings`, with the demo tokenizer and chat template `template`, if any.
fn kvdir_listing(listings: &[Value], template: Option<PathBuf>) -> kvdir_service::Service {
    let config = json!({"engines": listings, "engine_poll_interval_ms": 100});
    let file = kvdir::config::parse_config_file(&config.to_string()).expect("valid config");
    let (_tmp, dir) = model_dir();
    let front = FrontDoorFlags {
        tokenizer_path: Some(dir),
        chat_template: template,
        ..FrontDoorFlags::default()
    };
    let flags = Flags { front, http_server_port: 0, etcd_addr: String::new(), ..Flags::default() };
    kvdir_service::Service::start(flags, Some(file)).expect("kvdir starts")
}

/// The instance's `engine.parity`, once checked.
fn parity(svc: &kvdir_service::Service, name: &str) -> Value {
    eventually("the engine's parity check", || {
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let list = inst["instances"].as_array().cloned().unwrap_or_default();
        let i = list.iter().find(|i| i["name"] == name).ok_or("not listed")?;
        match &i["engine"]["parity"] {
            Value::Null => Err(i.to_string()),
            p => Ok(p.clone()),
        }
    })
}

fn mismatch_gauge(svc: &kvdir_service::Service, name: &str) -> Option<f64> {
    let text = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    let prefix = format!("kvdir_engine_parity_mismatch{{instance=\"{name}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

#[test]
fn an_engine_that_tokenizes_as_kvdir_does_agrees_on_every_check() {
    let (engine, listing) = listed_without_events(&costs(0, 0, 1));
    let name = engine.instance_name();
    let svc = kvdir_listing(&[listing], None);
    let p = parity(&svc, &name);
    assert_eq!(p["tokens"]["result"], "match", "{p}");
    assert!(p["tokens"]["tokens"].as_u64() > Some(20), "the chat is a few dozen tokens: {p}");
    assert_eq!(p["block_size"]["ok"], true, "{p}");
    assert_eq!(p["block_size"]["engine"], "16", "{p}");
    assert_eq!(p["model"]["ok"], true, "{p}");
    assert_eq!(p["model"]["engine"], MODEL, "{p}");
    assert_eq!(mismatch_gauge(&svc, &name), Some(0.0));
}

#[test]
fn a_wrong_template_and_block_size_are_named_before_any_traffic() {
    let _log = capture_logs(tracing_subscriber::filter::LevelFilter::WARN);
    let tmp = tempfile::tempdir().unwrap();
    let template = tmp.path().join("wrong.jinja");
    // The roles without ChatML's markers: the same words, other tokens.
    let wrong = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:";
    std::fs::write(&template, wrong).unwrap();
    let (engine, mut listing) = listed_without_events(&costs(0, 0, 1));
    listing["block_size"] = json!(2 * B);
    let name = engine.instance_name();
    let svc = kvdir_listing(&[listing], Some(template));
    let p = parity(&svc, &name);
    assert_eq!(p["tokens"]["result"], "differ", "{p}");
    assert_eq!(p["tokens"]["position"], 0, "ChatML's first marker differs: {p}");
    assert_eq!(p["block_size"]["ok"], false, "{p}");
    assert_eq!(p["block_size"]["configured"], (2 * B).to_string());
    assert_eq!(mismatch_gauge(&svc, &name), Some(1.0));
    let warned = eventually("the WARN", || {
        let log = captured_log();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(&name) && l.contains("position 0"))
            .map(String::from)
            .collect();
        lines.first().cloned().ok_or("no WARN yet".to_string())
    });
    assert!(warned.contains("--tokenizer_path"), "the fix is named: {warned}");
}
