//! Unit tests of the registration's pure parts; the etcd behaviour is tested against a real
//! server in `sim/tests/e2e/etcd.rs`.

use kvdir::registry::{parse_instance, parse_key, InstanceType, RegistryKey};

use super::*;

#[test]
fn instance_json_parses_as_kvdir_reads_it() {
    let o = RegistrationOptions {
        kind: 3,
        current_type: Some(2),
        register_ts_ms: Some(7),
        backend_type: Some("xllm".into()),
        ..RegistrationOptions::default()
    };
    let v = instance_json("127.0.0.1:8000", 2, "abc", Some("m"), &o);
    let r = parse_instance("127.0.0.1:8000", v.to_string().as_bytes()).unwrap();
    assert_eq!((r.kind, r.dp_size, r.mix_acting_prefill), (InstanceType::Mix, 2, false));
    assert_eq!(r.identity.incarnation_id.as_deref(), Some("abc"));
    assert_eq!(r.identity.register_ts_ms, Some(7));
    assert_eq!(r.model, "m", "an OpenAI engine names its model");
    let plain = instance_json("127.0.0.1:8000", 1, "abc", None, &RegistrationOptions::default());
    for absent in ["register_ts_ms", "backend_type", "current_type", "model_name"] {
        assert!(plain.get(absent).is_none(), "{absent} present in {plain}");
    }
    assert_eq!(plain["rpc_address"], "");
}

#[test]
fn keys_follow_the_type_and_namespace() {
    let key = format!("{}XLLM:{}:127.0.0.1:8000", namespace_prefix("prod"), type_segment(1));
    assert_eq!(key, "/prod/XLLM:PREFILL:127.0.0.1:8000");
    let parsed = parse_key("/prod/", &key);
    assert_eq!(parsed, Some(RegistryKey::Instance(InstanceType::Prefill, "127.0.0.1:8000".into())));
    assert_eq!(type_segment(0), "DEFAULT");
    assert_eq!(type_segment(2), "DECODE");
    assert_eq!(type_segment(3), "MIX");
}

#[test]
fn bad_options_are_all_reported() {
    let o = RegistrationOptions {
        etcd: String::new(),
        kind: 4,
        current_type: Some(9),
        ttl_s: 0,
        heartbeat_interval: Duration::ZERO,
        incarnation_id: Some(String::new()),
        heartbeat_to: Some("nowhere".into()),
        ..RegistrationOptions::default()
    };
    let msg = o.validate(0).unwrap_err().to_string();
    for needle in [
        "http_port = 0",
        "etcd endpoint is empty",
        "kind = 4",
        "current_type = 9",
        "ttl_s = 0",
        "heartbeat_interval",
        "incarnation_id is empty",
        "\"nowhere\"",
    ] {
        assert!(msg.contains(needle), "{needle} missing from {msg}");
    }
    assert!(RegistrationOptions::default().validate(8000).is_ok());
}

#[test]
fn incarnations_are_distinct_hex() {
    let (a, b) = (random_incarnation(), random_incarnation());
    assert_ne!(a, b);
    assert_eq!(a.len(), 32);
    assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn load_json_parses_as_kvdir_reads_it() {
    let load = Load { waiting: 3, usage: 0.25 };
    let parsed = kvdir::registry::parse_load_bytes(load.to_json().to_string().as_bytes()).unwrap();
    assert_eq!((parsed.waiting_requests_num, parsed.gpu_cache_usage_perc), (3, 0.25));
}
