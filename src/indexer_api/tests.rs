//! Tests of the indexer API bodies and the RFC answer.

use super::*;

fn m(instance: &str, rank: u32, synced: bool, device: u64, host_only: u64) -> StreamMatch {
    StreamMatch {
        instance_name: instance.into(),
        dp_rank: rank,
        synchronized: synced,
        partial: false,
        sequence: None,
        device_hit_tokens: device,
        host_only_hit_tokens: host_only,
        reusable_prefix_tokens: device + host_only,
        device_blocks: 0,
        host_blocks: 0,
        error: None,
        approximate: false,
    }
}

#[test]
fn an_instance_answers_its_weakest_rank_and_lists_every_rank() {
    let a0 = m("a", 0, true, 8, 4);
    let a1 = m("a", 1, true, 4, 0);
    let b0 = m("b", 0, false, 0, 0);
    let answer = rfc_answer([("", &a0), ("", &a1), ("t2", &b0)]);
    let a = &answer["default"]["a"];
    assert_eq!((a.longest_matched, a.gpu, a.cpu, a.disk), (4, 4, 0, 0));
    assert_eq!(a.dp, BTreeMap::from([("0".into(), 12), ("1".into(), 4)]));
    let b = &answer["t2"]["b"];
    assert_eq!((b.longest_matched, b.dp["0"]), (0, 0));
}

#[test]
fn register_needs_a_replay_endpoint_and_valid_fields() {
    let ok = br#"{"endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "tcp://127.0.0.1:2",
        "type": "vllm", "modelname": "m", "instance_id": "i", "block_size": 16, "dp_rank": 1,
        "additionalsalt": "s"}"#;
    let r = parse_register(ok).unwrap();
    assert_eq!(
        (r.spec.model.as_str(), r.spec.salt.as_str(), r.tenant.as_str()),
        ("m", "s", "default")
    );
    let no_replay = br#"{"endpoint": "tcp://127.0.0.1:1", "instance_id": "i", "block_size": 16}"#;
    assert!(parse_register(no_replay).unwrap_err().to_string().contains("replay_endpoint"));
    let bad = br#"{"endpoint": "tcp://*:1", "replay_endpoint": "tcp://127.0.0.1:2",
        "instance_id": "i", "block_size": 16}"#;
    assert!(parse_register(bad).unwrap_err().to_string().contains("tcp://*:1"));
    let zero = br#"{"endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "tcp://127.0.0.1:2",
        "instance_id": "i", "block_size": 0}"#;
    assert!(parse_register(zero).unwrap_err().to_string().contains("block_size = 0"));
}
