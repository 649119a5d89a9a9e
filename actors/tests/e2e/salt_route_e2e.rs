//! What the route credits, end to end: simulated engines registered in a real etcd, real
//! ZeroMQ, `POST /v1/internal/route`. An engine never reuses a prompt's last token, so a fully
//! cached prompt of whole blocks is credited one block less; and blocks a vLLM engine stored
//! for a request with a `cache_salt` (the salt in its first block's `extra_keys`) are credited
//! to requests with that salt only.

use crate::common::*;
use kvdir::car::{CandidateReport, Routed};
use kvdir::config::Flags;
use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, ExtraKey, StoredRecord};
use kvdir::wire::{encode_batch, encode_live, Tier};
use kvdir_service::Service;
use kvdir_sim::SimEngine;
use serde_json::{json, Value};

fn candidate<'a>(r: &'a Routed, name: &str) -> &'a CandidateReport {
    r.candidates.iter().find(|c| c.name == name).unwrap()
}

/// kvdir on the fleet of `ns`, once it routes over `n` scored instances with synchronized
/// streams.
fn kvdir(etcd: &str, ns: &str, n: usize) -> Service {
    let svc = discovery_service(etcd, ns, json!({}), Flags::default());
    eventually("every instance a scored candidate with a synchronized stream", || {
        let r = route(&svc, &prompt(1, 1))?;
        let scored = r.candidates.iter().filter(|c| c.score.is_some()).count();
        let synced = query(&svc, &[]).matches.iter().filter(|m| m.synchronized).count();
        (scored == n && synced == n).then_some(()).ok_or_else(|| format!("{r:?}"))
    });
    svc
}

/// A route request for `tokens` with the extra body fields `extra`.
fn route_with(svc: &Service, tokens: &[i32], extra: Value) -> Routed {
    let mut body = json!({ "token_ids": tokens });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = http(svc.http_addr(), "POST", "/v1/internal/route", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// The Device tokens the route credits on `instance` for `tokens` with `extra` fields.
fn credited(svc: &Service, instance: &str, tokens: &[i32], extra: Value) -> u64 {
    candidate(&route_with(svc, tokens, extra), instance).dp_hits[0].device_hit_tokens
}

/// Publishes, as the engine's next live message, vLLM-style `BlockStored` events: `tokens`
/// from the prompt's start, salted with `salt` on the first block, in stores of `per_event`
/// blocks, each chained to the one before (only the first carries `extra_keys`). Hashes do not
/// collide with the simulator's.
fn publish_salted(eng: &SimEngine, tokens: &[i32], salt: &str, per_event: usize) {
    let hashes: Vec<u64> = (0..tokens.len() as u64 / u64::from(B)).map(|i| 0xB000 + i).collect();
    let mut events = Vec::new();
    for (k, chunk) in hashes.chunks(per_event).enumerate() {
        let start = k * per_event * B as usize;
        let toks = tokens[start..start + chunk.len() * B as usize].to_vec();
        let hs = chunk.iter().map(|h| (*h).into()).collect();
        let mut s = StoredRecord::new(hs, None, toks, B, Tier::Device);
        if k == 0 {
            s.extra_keys = std::iter::once(ExtraKey::salt(salt))
                .chain(std::iter::repeat_n(None, chunk.len() - 1))
                .collect();
        } else {
            s.parent = Some(hashes[start / B as usize - 1].into());
        }
        events.push(EventRecord::Stored(s));
    }
    let batch = BatchRecord { timestamp: 1.0, events, dp_rank: Some(0) };
    let payload = encode_batch(&batch, BatchForm::Array, EventForm::Map);
    let seq = eng.next_sequence(0).unwrap();
    eng.send_raw(0, encode_live(eng.config().topic.as_bytes(), seq, payload).to_vec()).unwrap();
}

#[test]
fn a_fully_cached_prompt_is_credited_all_but_its_last_block_and_a_salt_only_with_it() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-salt-{}", std::process::id());
    let (a, _reg_a) = registered_engine(&etcd.endpoint, &ns, 1);
    let (b, _reg_b) = registered_engine(&etcd.endpoint, &ns, 1);
    let (a_name, b_name) = (a.instance_name(), b.instance_name());
    let svc = kvdir(&etcd.endpoint, &ns, 2);

    // Four whole blocks cached on a: the route credits three, the query reports all four.
    let p = prompt(3_000, 4);
    a.process(0, &p).unwrap();
    let whole = 4 * u64::from(B);
    eventually("a's blocks in the directory", || {
        let m = query(&svc, &p).matches;
        let hit = m.iter().find(|m| m.instance_name == a_name).map(|m| m.device_hit_tokens);
        (hit == Some(whole)).then_some(()).ok_or_else(|| format!("{m:?}"))
    });
    let r = route_with(&svc, &p, json!({}));
    assert_eq!(r.prefill, a_name, "the engine that holds the prompt");
    let c = candidate(&r, &a_name);
    assert_eq!(c.dp_hits[0].device_hit_tokens, whole - u64::from(B), "n - block_size");
    assert_eq!(c.kv_hit_ratio, Some(0.75));
    let longer: Vec<i32> = p.iter().copied().chain([42]).collect();
    assert_eq!(credited(&svc, &a_name, &longer, json!({})), whole, "one more token: every block");

    // b stored a salted request's blocks, then a decode block chained to them.
    let s = prompt(6_000, 3);
    publish_salted(&b, &s, "tenant-7", 2);
    let salted = json!({"cache_salt": "tenant-7"});
    let asked: Vec<i32> = s.iter().copied().chain([42]).collect();
    let hit = eventually("b's salted blocks credited to the salt", || {
        let hit = credited(&svc, &b_name, &asked, salted.clone());
        (hit > 0).then_some(hit).ok_or_else(|| "no credit yet".to_string())
    });
    assert_eq!(hit, 3 * u64::from(B), "the salted first block and the blocks chained to it");
    assert_eq!(route_with(&svc, &asked, salted).prefill, b_name);
    assert_eq!(credited(&svc, &b_name, &asked, json!({})), 0, "no salt: no credit");
    let other = json!({"cache_salt": "tenant-8"});
    assert_eq!(credited(&svc, &b_name, &asked, other), 0, "another salt: no credit");
    let salted_q = json!({"token_ids": asked, "cache_salt": "tenant-7"}).to_string();
    let q = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], salted_q.as_bytes());
    let matches = q.json()["matches"].clone();
    let on_b = matches.as_array().unwrap().iter().find(|m| m["instance_name"] == b_name.as_str());
    assert_eq!(on_b.unwrap()["device_hit_tokens"], 48, "the query takes the salt too: {matches}");
    let streams = http(svc.http_addr(), "GET", "/v1/internal/streams", &[], b"").json();
    let listed = streams["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["instance_name"] == b_name.as_str());
    assert_eq!(listed.unwrap()["skipped_events"], 0, "a salt is indexed, not skipped");
}
