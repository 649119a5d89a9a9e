//! The KV indexer API (Mooncake Conductor RFC #1403) end to end: real ZeroMQ from simulated
//! engines, real HTTP. The expected shapes come from the RFC's public description (and issue
//! #15): `/register` takes `{endpoint, replay_endpoint, type, modelname, lora_name?,
//! tenant_id?, instance_id, block_size, dp_rank, additionalsalt?}`; `/query` takes `{model,
//! lora_name?, token_ids, tenant_id?, instance_id?, block_size, cache_salt?}` and answers
//! `{tenant: {instance_id: {longest_matched, GPU, CPU, DISK, DP: {rank: tokens}}}}`.

use crate::common::*;
use kvdir::config::Flags;
use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord};
use kvdir::wire::Tier;
use kvdir::wire::{encode_batch, encode_live};
use kvdir_service::Service;
use kvdir_sim::SimEngine;
use serde_json::{json, Value};

/// kvdir with no configured stream: everything comes from `/register`.
fn bare_service() -> Service {
    service_flags(Flags::default())
}

fn service_flags(flags: Flags) -> Service {
    let flags = Flags {
        http_server_port: 0,
        server_host: "127.0.0.1".into(),
        etcd_addr: NO_ETCD.into(),
        ..flags
    };
    Service::start(flags, None).expect("kvdir starts")
}

fn post(svc: &Service, path: &str, body: Value) -> Response {
    http(svc.http_addr(), "POST", path, &[], body.to_string().as_bytes())
}

/// The `/register` body for `rank` of `eng`, plus `extra` fields.
fn registration(eng: &SimEngine, rank: u32, extra: Value) -> Value {
    let ep = &eng.endpoints()[rank as usize];
    let mut body = json!({"endpoint": ep.event, "replay_endpoint": ep.replay, "type": "xllm",
        "modelname": "m1", "instance_id": eng.config().name, "block_size": B, "dp_rank": rank,
        "topic": eng.config().topic});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

fn register(svc: &Service, eng: &SimEngine, rank: u32, extra: Value) {
    let r = post(svc, "/register", registration(eng, rank, extra));
    assert_eq!(r.status, 200, "register: {}", r.body);
}

/// The registered stream `instance`/`rank` as `/v1/internal/streams` lists it.
fn listed(svc: &Service, instance: &str, rank: u32) -> Option<Value> {
    let streams = report(svc)["streams"].as_array().cloned().unwrap_or_default();
    streams.into_iter().find(|s| s["instance_name"] == instance && s["dp_rank"] == rank)
}

/// `/query` for `tokens` with extra fields (model, lora_name, cache_salt, ...).
fn rfc_query(svc: &Service, tokens: &[i32], extra: Value) -> Value {
    let mut body = json!({"model": "m1", "token_ids": tokens, "block_size": B});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = post(svc, "/query", body);
    assert_eq!(r.status, 200, "query: {}", r.body);
    r.json()
}

/// Waits until `/query` says `tenant`/`instance` can reuse `want` tokens.
fn wait_longest(
    svc: &Service,
    tokens: &[i32],
    extra: Value,
    tenant: &str,
    instance: &str,
    want: u64,
) -> Value {
    eventually(&format!("{instance} to match {want} tokens"), || {
        let a = rfc_query(svc, tokens, extra.clone());
        match a[tenant][instance]["longest_matched"].as_u64() {
            Some(n) if n == want => Ok(a),
            _ => Err(a.to_string()),
        }
    })
}

#[test]
fn register_and_unregister_start_and_stop_a_listed_stream() {
    let svc = bare_service();
    let eng = engine("reg-a", 1, 0);
    register(&svc, &eng, 0, json!({}));
    let s = eventually("the registered stream to be listed", || {
        listed(&svc, "reg-a", 0).ok_or_else(|| report(&svc).to_string())
    });
    assert_eq!((s["source"].as_str(), s["model"].as_str()), (Some("register"), Some("m1")));
    let p = prompt(100, 3);
    eng.process(0, &p).unwrap();
    wait_longest(&svc, &p, json!({}), "default", "reg-a", 48);

    let dup = post(&svc, "/register", registration(&eng, 0, json!({})));
    assert_eq!(dup.status, 409, "{}", dup.body);
    assert!(dup.body.contains("already has a stream"), "{}", dup.body);
    let overlap = post(&svc, "/register", registration(&eng, 0, json!({"instance_id": "other"})));
    assert_eq!(overlap.status, 409, "{}", overlap.body);
    assert!(overlap.body.contains("endpoint"), "{}", overlap.body);
    let no_replay = post(
        &svc,
        "/register",
        json!({"endpoint": "tcp://127.0.0.1:1",
        "instance_id": "x", "block_size": B, "modelname": "m1", "type": "vllm", "dp_rank": 0}),
    );
    assert_eq!(no_replay.status, 400, "{}", no_replay.body);
    assert!(no_replay.body.contains("replay_endpoint"), "{}", no_replay.body);

    let r = post(&svc, "/unregister", json!({"instance_id": "reg-a"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let removed = r.json()["removed"].clone();
    assert_eq!(removed[0]["instance_id"], "reg-a");
    assert_eq!(removed[0]["endpoint"], eng.endpoints()[0].event.as_str());
    assert!(listed(&svc, "reg-a", 0).is_none(), "unregistered streams leave the report");
    assert_eq!(rfc_query(&svc, &p, json!({})), json!({}), "and the answers");
    assert_eq!(post(&svc, "/unregister", json!({"instance_id": "reg-a"})).status, 404);
}

#[test]
fn query_answers_in_the_rfc_shape_per_instance_and_dp_rank() {
    let svc = bare_service();
    let a = engine("rfc-a", 2, 0);
    let b = engine("rfc-b", 1, 64);
    let other_model = engine("rfc-c", 1, 0);
    register(&svc, &a, 0, json!({}));
    register(&svc, &a, 1, json!({}));
    register(&svc, &b, 0, json!({"tenant_id": "t2"}));
    register(&svc, &other_model, 0, json!({"modelname": "m2"}));
    let p = prompt(1000, 4);
    a.process(0, &p).unwrap();
    a.process(1, &p[..2 * B as usize]).unwrap();
    b.process(0, &p).unwrap();
    b.offload(0, &p).unwrap();
    b.evict(0, &p, Tier::Device).unwrap();
    other_model.process(0, &p).unwrap();

    let answer = wait_longest(&svc, &p, json!({}), "default", "rfc-a", 32);
    let want_a = json!({"longest_matched": 32, "GPU": 32, "CPU": 0, "DISK": 0,
        "DP": {"0": 64, "1": 32}});
    assert_eq!(
        answer["default"]["rfc-a"], want_a,
        "the weakest rank is what the instance promises"
    );
    // b's tail went to Host and left Device: the engine's own view says how much.
    let (device, host_only) = b.resident(0, &p).unwrap();
    assert!(host_only > 0 && device + host_only == 64, "{device} {host_only}");
    let want_b = json!({"longest_matched": 64, "GPU": device, "CPU": host_only, "DISK": 0,
        "DP": {"0": 64}});
    eventually("b's Host-only blocks to count as CPU", || {
        let answer = rfc_query(&svc, &p, json!({}));
        (answer["t2"]["rfc-b"] == want_b).then_some(()).ok_or_else(|| answer.to_string())
    });
    assert!(answer["default"].get("rfc-c").is_none(), "model m2 is not listed for m1: {answer}");
    let m2 = wait_longest(&svc, &p, json!({"model": "m2"}), "default", "rfc-c", 64);
    assert!(m2["default"].get("rfc-a").is_none(), "{m2}");
    let only_t2 = rfc_query(&svc, &p, json!({"tenant_id": "t2"}));
    assert_eq!(only_t2.as_object().map(|o| o.len()), Some(1), "{only_t2}");
    let one = rfc_query(&svc, &p, json!({"instance_id": "rfc-a"}));
    assert_eq!(one["default"].as_object().map(|o| o.len()), Some(1), "{one}");

    // Unsynchronized: the engine goes away; its rank answers 0 and so does the instance.
    b.stop();
    let gone = wait_longest(&svc, &p, json!({}), "t2", "rfc-b", 0);
    assert_eq!(gone["t2"]["rfc-b"]["DP"], json!({"0": 0}));

    let by_hash = post(&svc, "/query_by_hash", json!({"model": "m1", "block_hashes": [1, 2]}));
    assert_eq!(by_hash.status, 501, "{}", by_hash.body);
    assert!(by_hash.body.contains("by their content"), "{}", by_hash.body);
}

/// Publishes, as the engine's next live message, a vLLM-style `BlockStored` of `tokens` under
/// LoRA adapter `lora`, with hashes that do not collide with the simulator's.
fn publish_lora(eng: &SimEngine, tokens: &[i32], lora: &str) {
    let n = tokens.len() / B as usize;
    let hashes = (0..n as u64).map(|i| (0xA000_0000_0000 + i).into()).collect();
    let mut stored = StoredRecord::new(hashes, None, tokens.to_vec(), B, Tier::Device);
    stored.lora_name = Some(lora.into());
    stored.lora_id = Some(7);
    let batch =
        BatchRecord { timestamp: 1.0, events: vec![EventRecord::Stored(stored)], dp_rank: Some(0) };
    let payload = encode_batch(&batch, BatchForm::Map, EventForm::Positional);
    let seq = eng.next_sequence(0).unwrap();
    let frames = encode_live(eng.config().topic.as_bytes(), seq, payload);
    eng.send_raw(0, frames.to_vec()).unwrap();
}

#[test]
fn lora_blocks_give_credit_to_their_adapter_only() {
    let svc = bare_service();
    let eng = engine("lora", 1, 0);
    register(&svc, &eng, 0, json!({}));
    let base = prompt(5000, 2);
    eng.process(0, &base).unwrap();
    wait_longest(&svc, &base, json!({}), "default", "lora", 32);
    let p = prompt(7000, 3);
    publish_lora(&eng, &p, "adapter-a");
    wait_longest(&svc, &p, json!({"lora_name": "adapter-a"}), "default", "lora", 48);
    let base_q = rfc_query(&svc, &p, json!({}));
    assert_eq!(base_q["default"]["lora"]["longest_matched"], 0, "{base_q}");
    let b_q = rfc_query(&svc, &p, json!({"lora_name": "adapter-b"}));
    assert_eq!(b_q["default"]["lora"]["longest_matched"], 0, "{b_q}");
    let a_on_base = rfc_query(&svc, &base, json!({"lora_name": "adapter-a"}));
    assert_eq!(a_on_base["default"]["lora"]["longest_matched"], 0, "{a_on_base}");
    // The internal query takes the same namespace fields.
    let body = json!({"token_ids": p, "lora_name": "adapter-a"}).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], body.as_bytes());
    assert_eq!(r.json()["matches"][0]["device_hit_tokens"], 48, "{}", r.body);
    let s = listed(&svc, "lora", 0).unwrap();
    assert_eq!(s["skipped_events"], 0, "LoRA events are indexed, not skipped: {s}");
}

#[test]
fn a_salt_isolates_its_streams_blocks() {
    let svc = bare_service();
    let salted = engine("salted", 1, 0);
    let plain = engine("plain", 1, 0);
    register(&svc, &salted, 0, json!({"additionalsalt": "s1"}));
    register(&svc, &plain, 0, json!({}));
    let p = prompt(9000, 2);
    salted.process(0, &p).unwrap();
    plain.process(0, &p).unwrap();
    let with_salt = wait_longest(&svc, &p, json!({"cache_salt": "s1"}), "default", "salted", 32);
    assert_eq!(with_salt["default"]["plain"]["longest_matched"], 0, "{with_salt}");
    let without = wait_longest(&svc, &p, json!({}), "default", "plain", 32);
    assert_eq!(without["default"]["salted"]["longest_matched"], 0, "{without}");
    let other = rfc_query(&svc, &p, json!({"cache_salt": "s2"}));
    assert_eq!(other["default"]["salted"]["longest_matched"], 0, "{other}");
}

#[test]
fn the_indexer_routes_need_the_internal_token() {
    let flags = Flags { internal_api_token: Some("secret".into()), ..Flags::default() };
    let svc = service_flags(flags);
    let eng = engine("tok", 1, 0);
    let body = registration(&eng, 0, json!({})).to_string();
    for path in ["/register", "/unregister", "/query", "/query_by_hash"] {
        let r = http(svc.http_addr(), "POST", path, &[], body.as_bytes());
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    let token = [("X-Internal-Token", "secret")];
    let r = http(svc.http_addr(), "POST", "/register", &token, body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
}
