//! The cache-truth audit end to end: kvdir's credit on the chosen engine against the cached
//! tokens the simulated engine reports, read by an operator in `/v1/internal/instances`,
//! `/metrics` and the WARN log. A healthy engine shows only exact answers and no warning; an
//! engine that reports 0, reports half, reports nothing, or whose events kvdir cannot use
//! (a block size that differs from kvdir's config) triggers its own warning.

use kvdir_sim::CachedReport;
use tracing_subscriber::filter::LevelFilter;

use super::*;

/// WARN lines of the cache audit about `instance` that contain `what`.
fn audit_warnings(instance: &str, what: &str) -> Vec<String> {
    let log = captured_log();
    let named = format!("instance=\"{instance}\"");
    let plain = format!("instance={instance} ");
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains("cache audit"))
        .filter(|l| l.contains(&named) || l.contains(&plain))
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

/// An engine whose answers report cached tokens as `report` says.
fn reporting(etcd: &str, ns: &str, report: CachedReport) -> (SimEngine, Registration) {
    let openai = OpenAiConfig { cached_report: report, ..costs(0, 0, 2) };
    serving(etcd, ns, &openai)
}

/// One engine reporting as `report` says, behind a kvdir routing with CAR, with the WARN log
/// captured while it lives; its instance name.
struct Audited {
    svc: kvdir_service::Service,
    name: String,
    _engine: (SimEngine, Registration, LogCapture),
}

fn audited_engine(label: &str, report: CachedReport) -> Audited {
    let log = capture_logs(LevelFilter::WARN);
    let etcd = etcd_endpoint();
    let ns = format!("fd-audit-{label}-{}", std::process::id());
    let (engine, reg) = reporting(&etcd.endpoint, &ns, report);
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Car);
    ready(&svc, 1);
    Audited { svc, name: engine.instance_name(), _engine: (engine, reg, log) }
}

/// `instance`'s entry of `cache_audit` in `/v1/internal/instances`.
fn audit_of(svc: &kvdir_service::Service, instance: &str) -> Value {
    let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
    inst["cache_audit"][instance].clone()
}

/// Waits until `instance` has `n` audited answers in all; its audit then.
fn audited(svc: &kvdir_service::Service, instance: &str, n: u64) -> Value {
    eventually("the answers audited", || {
        let a = audit_of(svc, instance);
        let total: u64 = ["exact", "under", "over", "not_reported"]
            .iter()
            .map(|k| a[k].as_u64().unwrap_or(0))
            .sum();
        (total == n).then_some(a.clone()).ok_or_else(|| format!("{total} of {n}: {a}"))
    })
}

/// The value of one `/metrics` sample.
fn sample(svc: &kvdir_service::Service, name: &str, labels: &str) -> Option<f64> {
    let text = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    let prefix = format!("{name}{{{labels}}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
}

/// One chat through the front door; `usage` asks for the final usage chunk when streaming.
/// The answer's `x-kvdir-cached-tokens`, and its SSE events (empty for a JSON answer) or body.
fn ask(svc: &kvdir_service::Service, messages: &Value, stream: bool, usage: bool) -> (u64, String) {
    let mut body = json!({"model": MODEL, "messages": messages, "stream": stream});
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    let url = format!("http://{}/v1/chat/completions", svc.http_addr());
    let r = client().post(url).json(&body).send().expect("kvdir answers");
    assert_eq!(r.status().as_u16(), 200);
    let credited = header(&r, "x-kvdir-cached-tokens").parse().unwrap();
    (credited, r.text().unwrap())
}

/// Waits until kvdir's directory holds every whole block of `messages`' prompt.
fn settled(svc: &kvdir_service::Service, messages: &Value) {
    let prompt = tokens_of(messages);
    let whole = prompt.len() as u64 / u64::from(B) * u64::from(B);
    eventually("the prompt in kvdir's directory", || {
        let m = query(svc, &prompt).matches;
        match m.first() {
            Some(m) if m.device_hit_tokens == whole => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

#[test]
fn a_healthy_engine_is_all_exact_and_a_client_gets_exactly_the_usage_it_asked_for() {
    let Audited { svc, name, _engine } = audited_engine("ok", CachedReport::Actual);
    let system = long_system_prompt();
    let mut credited = Vec::new();
    // (stream, include_usage) of each request, each one after the previous one's events.
    for (i, (stream, usage)) in
        [(false, false), (true, false), (true, true), (false, false)].into_iter().enumerate()
    {
        let messages = conversation(&system, &format!("question {i}"));
        let (c, answer) = ask(&svc, &messages, stream, usage);
        credited.push(c);
        if stream {
            let events: Vec<&str> = answer.lines().filter(|l| l.starts_with("data: ")).collect();
            assert_eq!(events.last(), Some(&"data: [DONE]"), "{answer}");
            let usage_events: Vec<&&str> =
                events.iter().filter(|e| e.contains("prompt_tokens")).collect();
            if usage {
                assert_eq!(usage_events.len(), 1, "the client asked for usage: {answer}");
                let chunk: Value = serde_json::from_str(&usage_events[0][6..]).unwrap();
                assert_eq!(chunk["usage"]["prompt_tokens_details"]["cached_tokens"], c);
            } else {
                assert!(usage_events.is_empty(), "usage the client did not ask for: {answer}");
                assert!(!answer.contains("\n\n\n"), "no stray event separator: {answer:?}");
            }
        }
        settled(&svc, &messages);
    }
    assert!(credited[1..].iter().all(|c| *c > 0), "the shared prompt is credited: {credited:?}");
    let a = audited(&svc, &name, 4);
    assert_eq!(
        (a["exact"].as_u64(), a["under"].as_u64(), a["over"].as_u64()),
        (Some(4), Some(0), Some(0)),
        "{a}"
    );
    assert_eq!(a["exact_tokens"], credited.iter().sum::<u64>(), "{a}");
    assert_eq!((a["warning"].clone(), a["not_reported"].clone()), (Value::Null, json!(0)), "{a}");
    let labels = |outcome: &str| format!("instance=\"{name}\",outcome=\"{outcome}\"");
    let requests = "kvdir_frontend_cache_audit_requests_total";
    assert_eq!(sample(&svc, requests, &labels("exact")), Some(4.0));
    assert_eq!(sample(&svc, requests, &labels("over")), Some(0.0));
    let warning = "kvdir_frontend_cache_audit_warning";
    for kind in ["zero_reuse", "stale_credit", "missed_credit", "not_reported"] {
        let labels = format!("instance=\"{name}\",kind=\"{kind}\"");
        assert_eq!(sample(&svc, warning, &labels), Some(0.0), "{kind}");
    }
    assert_eq!(audit_warnings(&name, ""), Vec::<String>::new());
}

#[test]
fn an_engine_that_reports_zero_where_kvdir_credited_hits_warns_of_a_mismatch() {
    let Audited { svc, name, _engine } = audited_engine("zero", CachedReport::Zero);
    let system = long_system_prompt();
    let warm = conversation(&system, "warm up");
    ask(&svc, &warm, false, false);
    settled(&svc, &warm);
    for i in 0..5 {
        let (credited, _) = ask(&svc, &conversation(&system, &format!("q{i}")), i % 2 == 0, false);
        assert!(credited > 0);
    }
    let a = audited(&svc, &name, 6);
    assert_eq!((a["over"].as_u64(), a["exact"].as_u64()), (Some(5), Some(1)), "{a}");
    assert_eq!(a["warning_kind"], "zero_reuse", "{a}");
    let text = a["warning"].as_str().unwrap();
    for setting in ["block_size", "PYTHONHASHSEED", "event endpoint"] {
        assert!(text.contains(setting), "{setting}: {text}");
    }
    let labels = format!("instance=\"{name}\",kind=\"zero_reuse\"");
    assert_eq!(sample(&svc, "kvdir_frontend_cache_audit_warning", &labels), Some(1.0));
    let logged = audit_warnings(&name, "block_size");
    assert_eq!(logged.len(), 1, "one WARN, rate-limited: {logged:?}");
    assert!(logged[0].contains("reported 0 cached tokens"), "{logged:?}");
}

#[test]
fn an_engine_that_reuses_less_than_credited_warns_of_stale_credit() {
    let Audited { svc, name, _engine } = audited_engine("half", CachedReport::Half);
    let system = long_system_prompt();
    let warm = conversation(&system, "warm up");
    ask(&svc, &warm, false, false);
    settled(&svc, &warm);
    for i in 0..20 {
        ask(&svc, &conversation(&system, &format!("q{i}")), i % 2 == 1, false);
    }
    let a = audited(&svc, &name, 21);
    assert_eq!(a["over"], 20, "{a}");
    assert!(a["over_tokens"].as_u64().unwrap() >= 20 * u64::from(B), "{a}");
    assert_eq!(a["warning_kind"], "stale_credit", "{a}");
    let logged = audit_warnings(&name, "stale");
    assert!(!logged.is_empty() && logged[0].contains("removals"), "{logged:?}");
}

#[test]
fn an_engine_without_cached_tokens_is_counted_and_hinted_once() {
    let Audited { svc, name, _engine } = audited_engine("absent", CachedReport::Absent);
    for i in 0..3 {
        // The streamed ones: kvdir asked for usage, found no details in it, and stripped it.
        let streamed = i > 0;
        let (_, answer) = ask(&svc, &conversation("Hi.", &format!("q{i}")), streamed, false);
        assert_eq!(answer.contains("prompt_tokens"), !streamed, "{answer}");
    }
    let a = audited(&svc, &name, 3);
    assert_eq!(
        (a["not_reported"].as_u64(), a["warning_kind"].as_str()),
        (Some(3), Some("not_reported"))
    );
    assert!(a["warning"].as_str().unwrap().contains("--enable-prompt-tokens-details"), "{a}");
    let hints = audit_warnings(&name, "--enable-prompt-tokens-details");
    assert_eq!(hints.len(), 1, "a one-time hint: {hints:?}");
}

#[test]
fn events_of_another_block_size_leave_credit_missing_and_say_where_to_look() {
    let _log = capture_logs(LevelFilter::WARN);
    let etcd = etcd_endpoint();
    let ns = format!("fd-audit-bs-{}", std::process::id());
    let (engine, _reg) = reporting(&etcd.endpoint, &ns, CachedReport::Actual);
    // kvdir is told blocks of 2 * B tokens; the engine uses B.
    let discovery = json!({"discovery": {"enabled": true, "block_size": 2 * B,
        "topic": "xllm-kv", "refresh_interval_ms": 100}});
    let (_tmp, dir) = model_dir();
    let front = FrontDoorFlags { tokenizer_path: Some(dir), ..FrontDoorFlags::default() };
    let svc =
        discovery_service(&etcd.endpoint, &ns, discovery, Flags { front, ..Flags::default() });
    eventually("the engine known with a load", || {
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let loaded = inst["instances"].as_array().into_iter().flatten();
        (loaded.filter(|i| i["waiting_requests_num"].is_u64()).count() == 1)
            .then_some(())
            .ok_or_else(|| inst.to_string())
    });
    let name = engine.instance_name();
    let system = long_system_prompt();
    for i in 0..21 {
        let (credited, _) = ask(&svc, &conversation(&system, &format!("q{i}")), false, false);
        assert_eq!(credited, 0, "kvdir rejects the events: no credit");
    }
    let a = audited(&svc, &name, 21);
    assert!(a["under"].as_u64().unwrap() >= 20, "the engine reuses the shared prompt: {a}");
    assert_eq!(a["warning_kind"], "missed_credit", "{a}");
    assert!(a["warning"].as_str().unwrap().contains("block_size"), "{a}");
    let logged = audit_warnings(&name, "unsynchronized");
    assert_eq!(logged.len(), 1, "{logged:?}");
}
