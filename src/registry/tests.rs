//! Unit tests of registry parsing and the instance state machine (planning: `discovery`).

use std::time::{Duration, Instant};

use super::*;

/// A registry record of `name` (`kind`: the xLLM type number), `dp` ranks, `inc`arnation.
pub(crate) fn record(name: &str, kind: u64, dp: u32, inc: Option<&str>) -> InstanceRecord {
    let mut v = serde_json::json!({"name": name, "rpc_address": "", "type": kind, "dp_size": dp});
    if let Some(i) = inc {
        v["incarnation_id"] = i.into();
    }
    parse_instance(name, v.to_string().as_bytes()).unwrap()
}

const LOAD: LoadMetrics =
    LoadMetrics { waiting_requests_num: 3, gpu_cache_usage_perc: 0.5, prefill_tokens_per_s: None };

#[test]
fn keys_carry_namespace_type_and_name() {
    assert_eq!(namespace_prefix("prod"), "/prod/");
    assert_eq!(namespace_prefix(""), "");
    assert_eq!(
        parse_key("/prod/", "/prod/XLLM:PREFILL:10.0.0.1:8000"),
        Some(RegistryKey::Instance(InstanceType::Prefill, "10.0.0.1:8000".into()))
    );
    assert_eq!(parse_key("", "XLLM:LOADMETRICS:h:1"), Some(RegistryKey::Load("h:1".into())));
    assert_eq!(parse_key("/prod/", "XLLM:PREFILL:h:1"), None, "another namespace");
    assert_eq!(parse_key("", "XLLM:CACHE:h:1"), None, "the deprecated cache keys are ignored");
}

#[test]
fn instance_values_parse_leniently_and_errors_name_the_problem() {
    let r = record("127.0.0.1:8000", 3, 0, Some("a"));
    assert_eq!(
        (r.kind, r.dp_size, r.backend.as_str(), r.mix_acting_prefill),
        (InstanceType::Mix, 1, "xllm", true)
    );
    let extra = br#"{"name":"h:1","rpc_address":"x","type":1,"unknown":[1],"ttft_profiling_data":[[100,20.5]]}"#;
    assert_eq!(parse_instance("h:1", extra).unwrap().ttft_profile, [(100.0, 20.5)]);
    assert!(matches!(parse_instance("h:1", b"{"), Err(RecordError::Parse(_))));
    assert_eq!(
        parse_instance("h:1", br#"{"name":"h:1","rpc_address":"","type":7}"#)
            .unwrap_err()
            .to_string(),
        "instance type 7 is not 0 (DEFAULT), 1 (PREFILL), 2 (DECODE) or 3 (MIX)"
    );
    assert!(matches!(
        parse_instance("h:2", br#"{"name":"h:1","rpc_address":"","type":1}"#),
        Err(RecordError::NameMismatch { .. })
    ));
    assert!(matches!(
        parse_instance("nohost", br#"{"name":"nohost","rpc_address":"","type":1}"#),
        Err(RecordError::Name(_))
    ));
}

#[test]
fn load_values_must_be_valid() {
    let ok =
        parse_load_bytes(br#"{"waiting_requests_num": 2, "gpu_cache_usage_perc": 0.25}"#).unwrap();
    assert_eq!(ok.waiting_requests_num, 2);
    assert!(
        parse_load_bytes(br#"{"waiting_requests_num": -1, "gpu_cache_usage_perc": 0.2}"#).is_err()
    );
    let err = parse_load_bytes(br#"{"waiting_requests_num": 1, "gpu_cache_usage_perc": 1.5}"#)
        .unwrap_err();
    assert_eq!(err, "gpu_cache_usage_perc = 1.5 is outside 0..=1");
}

/// A heartbeat body parses without a JSON tree: names borrowed, or owned when escaped; the
/// incarnation absent, null or given; other load fields ignored; the same checks as etcd's.
#[test]
fn heartbeat_bodies_parse_into_their_fields() {
    let body = br#"{"name":"h:1","incarnation_id":"a","load_metrics":
        {"waiting_requests_num":4,"gpu_cache_usage_perc":1,"other":[1,{"x":null}]}}"#;
    let hb: HeartbeatBody = serde_json::from_slice(body).unwrap();
    assert!(matches!(hb.name, std::borrow::Cow::Borrowed("h:1")), "{:?}", hb.name);
    assert_eq!(hb.incarnation(), Some("a"));
    let load = hb.load_metrics.check().unwrap();
    assert_eq!((load.waiting_requests_num, load.gpu_cache_usage_perc), (4, 1.0));
    let escaped = br#"{"name":"h\u003a1","load_metrics":{"waiting_requests_num":0,"gpu_cache_usage_perc":0}}"#;
    let hb: HeartbeatBody = serde_json::from_slice(escaped).unwrap();
    assert_eq!((hb.name.as_ref(), hb.incarnation()), ("h:1", None));
    let null = br#"{"name":"h:1","incarnation_id":null,"load_metrics":{"waiting_requests_num":0,"gpu_cache_usage_perc":0}}"#;
    assert_eq!(serde_json::from_slice::<HeartbeatBody>(null).unwrap().incarnation(), None);
    let check = |load: &str| {
        let body = format!(r#"{{"name":"h:1","load_metrics":{load}}}"#);
        serde_json::from_slice::<HeartbeatBody>(body.as_bytes()).unwrap().load_metrics.check()
    };
    let negative = check(r#"{"waiting_requests_num":-1,"gpu_cache_usage_perc":0.2}"#);
    assert_eq!(negative.unwrap_err(), "waiting_requests_num must be a non-negative integer");
    let fraction = check(r#"{"waiting_requests_num":1.5,"gpu_cache_usage_perc":0.2}"#);
    assert_eq!(fraction.unwrap_err(), "waiting_requests_num must be a non-negative integer");
    let missing = check(r#"{"waiting_requests_num":1}"#);
    assert_eq!(missing.unwrap_err(), "gpu_cache_usage_perc must be a number in 0..=1");
    let over = check(r#"{"waiting_requests_num":1,"gpu_cache_usage_perc":2}"#);
    assert_eq!(over.unwrap_err(), "gpu_cache_usage_perc = 2 is outside 0..=1");
    let text =
        br#"{"name":"h:1","load_metrics":{"waiting_requests_num":"1","gpu_cache_usage_perc":0}}"#;
    let err = serde_json::from_slice::<HeartbeatBody>(text).unwrap_err().to_string();
    assert!(err.contains("invalid type: string \"1\""), "{err}");
    assert!(serde_json::from_slice::<HeartbeatBody>(br#"{"nom":1}"#).is_err());
    let etcd = parse_load_bytes(br#"{"waiting_requests_num":2,"gpu_cache_usage_perc":0.5}"#);
    assert_eq!(etcd.unwrap().waiting_requests_num, 2);
    assert!(parse_load_bytes(b"not json").is_err());
}

#[test]
fn puts_refresh_or_replace_by_identity() {
    let t = Instant::now();
    let mut reg = Registry::default();
    assert_eq!(reg.put(record("h:1", 1, 1, Some("a")), t), PutOutcome::New);
    assert_eq!(reg.put(record("h:1", 1, 2, Some("a")), t), PutOutcome::Refreshed);
    assert_eq!(reg.put(record("h:1", 1, 2, Some("b")), t), PutOutcome::Replaced);
    let mut old = record("h:2", 1, 1, None);
    old.identity.register_ts_ms = Some(5);
    reg.put(old.clone(), t);
    assert_eq!(reg.put(old.clone(), t), PutOutcome::Refreshed);
    old.identity.register_ts_ms = Some(6);
    assert_eq!(reg.put(old, t), PutOutcome::Replaced, "register_ts_ms stands in for incarnation");
}

#[test]
fn lease_loss_grace_suspect_and_removal() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("h:1", 1, 1, Some("a")), t);
    let ticket = reg.deleted("h:1").expect("an ACTIVE instance is probed");
    reg.probed("h:1", ticket, true, t);
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::LeaseLost);
    reg.heartbeat("h:1", Some("a"), LOAD, t + Duration::from_secs(2)).unwrap();
    reg.tick(t + Duration::from_millis(4999));
    assert_eq!(
        reg.get("h:1").unwrap().state,
        InstanceState::LeaseLost,
        "a heartbeat extends the grace"
    );
    reg.tick(t + Duration::from_secs(5));
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::Suspect);
    reg.heartbeat("h:1", Some("a"), LOAD, t + Duration::from_secs(6)).unwrap();
    assert_eq!(
        reg.get("h:1").unwrap().state,
        InstanceState::LeaseLost,
        "a heartbeat revives SUSPECT"
    );
    reg.tick(t + Duration::from_secs(9));
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::Suspect, "3 s without a heartbeat");
    assert!(reg.tick(t + Duration::from_millis(23_999)).is_empty());
    assert_eq!(reg.tick(t + Duration::from_secs(24)), ["h:1"]);
    assert!(reg.get("h:1").is_none());
}

/// The count discovery skips a refresh by moves with every change a plan reads, and only
/// with those: loads and heartbeats that change no state leave it.
#[test]
fn changes_count_what_plans_read() {
    let t = Instant::now();
    let mut reg = Registry::default();
    let mut last = reg.changes();
    let mut moved = |reg: &Registry| std::mem::replace(&mut last, reg.changes()) != reg.changes();
    reg.put(record("h:1", 1, 1, Some("a")), t);
    assert!(moved(&reg), "a new instance");
    reg.load("h:1", LOAD);
    reg.heartbeat("h:1", Some("a"), LOAD, t).unwrap();
    reg.tick(t + Duration::from_secs(1));
    assert!(!moved(&reg), "loads, heartbeats and ticks that change no state");
    let ticket = reg.deleted("h:1").unwrap();
    reg.probed("h:1", ticket, true, t);
    assert!(moved(&reg), "ACTIVE to LEASE_LOST");
    reg.tick(t + Duration::from_secs(6));
    assert!(moved(&reg), "LEASE_LOST to SUSPECT");
    reg.heartbeat("h:1", Some("a"), LOAD, t + Duration::from_secs(7)).unwrap();
    assert!(moved(&reg), "SUSPECT to LEASE_LOST");
    reg.put(record("h:1", 1, 1, Some("a")), t);
    assert!(moved(&reg), "registered again");
    let ticket = reg.deleted("h:1").unwrap();
    reg.probed("h:1", ticket, false, t);
    assert!(moved(&reg), "ACTIVE to SUSPECT");
    reg.tick(t + Duration::from_secs(60));
    assert!(moved(&reg) && reg.get("h:1").is_none(), "removed");
}

#[test]
fn heartbeats_for_unknown_or_stale_instances_are_refused() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("h:1", 1, 1, Some("a")), t);
    assert_eq!(
        reg.heartbeat("h:9", Some("a"), LOAD, t),
        Err(HeartbeatError::Unknown("h:9".into()))
    );
    let stale = reg.heartbeat("h:1", Some("old"), LOAD, t).unwrap_err();
    assert_eq!(
        stale.to_string(),
        "incarnation Some(\"old\") of \"h:1\" is stale; the registered incarnation is Some(\"a\")"
    );
    reg.heartbeat("h:1", Some("a"), LOAD, t).unwrap();
    assert_eq!(reg.get("h:1").unwrap().load, Some(LOAD));
}

#[test]
fn a_relist_neither_probes_again_nor_restarts_the_timers() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("h:1", 1, 1, Some("a")), t);
    let ticket = reg.deleted("h:1").unwrap();
    assert_eq!(reg.deleted("h:1"), None, "one probe in flight at a time");
    reg.probed("h:1", ticket, true, t);
    // The watch is lost and etcd re-listed 2 s later, without the key: no new probe.
    assert_eq!(reg.deleted("h:1"), None, "LEASE_LOST is not probed again");
    assert_eq!(reg.get("h:1").unwrap().since, t, "the grace period keeps its start");
    reg.tick(t + Duration::from_secs(3));
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::Suspect);
    assert_eq!(reg.deleted("h:1"), None, "SUSPECT is not probed again");
    assert!(reg.heartbeat("h:1", Some("a"), LOAD, t + Duration::from_secs(4)).is_ok());
    reg.tick(t + Duration::from_secs(7));
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::Suspect);
    assert_eq!(reg.tick(t + Duration::from_secs(22)), ["h:1"], "15 s after SUSPECT, not later");
    assert!(reg.heartbeat("h:1", Some("a"), LOAD, t + Duration::from_secs(23)).is_err());
}

#[test]
fn a_probe_answer_never_overrides_a_newer_registration() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.put(record("h:1", 1, 1, Some("a")), t);
    let ticket = reg.deleted("h:1").unwrap();
    reg.put(record("h:1", 1, 1, Some("a")), t + Duration::from_millis(100));
    reg.probed("h:1", ticket, false, t + Duration::from_millis(900));
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::Active, "the PUT came later");
    let replaced = reg.deleted("h:1").unwrap();
    reg.put(record("h:1", 1, 1, Some("b")), t + Duration::from_secs(1));
    reg.probed("h:1", replaced, false, t + Duration::from_secs(2));
    assert_eq!(reg.get("h:1").unwrap().state, InstanceState::Active, "nor after a replacement");
}

#[test]
fn loads_before_their_instance_are_kept_and_replacements_start_without_one() {
    let t = Instant::now();
    let mut reg = Registry::default();
    reg.load("h:1", LOAD);
    reg.put(record("h:1", 1, 1, Some("a")), t);
    assert_eq!(reg.get("h:1").unwrap().load, Some(LOAD), "the load seen first is applied");
    reg.put(record("h:1", 1, 1, Some("b")), t);
    assert_eq!(reg.get("h:1").unwrap().load, None, "a new process has no load of its own yet");
    reg.load("h:2", LOAD);
    reg.load_deleted("h:2");
    reg.put(record("h:2", 1, 1, Some("c")), t);
    assert_eq!(reg.get("h:2").unwrap().load, None, "a deleted LOADMETRICS key is forgotten");
    for n in 0..MAX_PENDING_LOADS + 10 {
        reg.load(&format!("x{n}:1"), LOAD);
    }
    reg.put(record("x4100:1", 1, 1, Some("d")), t);
    assert_eq!(reg.get("x4100:1").unwrap().load, None, "pending loads are bounded");
    reg.put(record("x0:1", 1, 1, Some("e")), t);
    assert_eq!(reg.get("x0:1").unwrap().load, Some(LOAD));
}

#[test]
fn the_watched_range_holds_every_listed_prefix_and_not_the_cache() {
    for ns in ["", "/prod/"] {
        let (start, end) = watched_range(ns);
        let inside = |k: &str| start.as_str() <= k && k < end.as_str();
        for p in watched_prefixes(ns) {
            assert!(inside(&p) && inside(&format!("{p}host:1\u{7f}")), "{p}");
        }
        assert!(!inside(&format!("{ns}XLLM:CACHE:x")));
        assert!(!inside(&format!("{ns}XLLM:PREFILL;")));
    }
}

/// Reports (routes' candidates, `/v1/internal/instances`) name a role by its key segment.
#[test]
fn a_role_serializes_as_its_key_segment() {
    use InstanceType::*;
    for kind in [Default, Prefill, Decode, Mix] {
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, format!("\"{}\"", kind.key_segment()));
        assert_eq!(serde_json::from_str::<InstanceType>(&json).unwrap(), kind);
    }
}
