//! History replay against the simulator's vLLM dialect (real ZeroMQ, real HTTP): kvdir started
//! after the engine, gaps, a history that no longer reaches back, restarts and vLLM's duplicate
//! stores. What a user sees: the streams report's `phase` and kvdir's hits against the engine's
//! own ground truth.

use kvdir_sim::{Dialect, EngineConfig, Fault, SimEngine};
use kvdir_testkit::eventually;
use serde_json::{json, Value};

use crate::common::*;

/// A vLLM-like engine on ephemeral loopback ports keeping the last `buffer_steps` batches.
fn vllm(name: &str, buffer_steps: usize) -> SimEngine {
    SimEngine::start(EngineConfig {
        name: name.into(),
        dp_size: 1,
        block_size: B,
        device_capacity_blocks: 256,
        dialect: Dialect::Vllm,
        buffer_steps,
        ..EngineConfig::default()
    })
    .expect("the simulated engine starts")
}

/// The stream's report once its phase is `phase`.
fn phase_becomes(svc: &kvdir_service::Service, phase: &str) -> Value {
    eventually(&format!("the stream to be {phase}"), || {
        let r = report(svc);
        let s = r["streams"][0].clone();
        if s["phase"] == phase {
            Ok(s)
        } else {
            Err(format!("phase {}: {s}", s["phase"]))
        }
    })
}

#[test]
fn kvdir_started_after_the_engine_replays_its_history_and_is_exact() {
    let eng = vllm("late", 10_000);
    let (a, b) = (prompt(1, 4), prompt(1000, 3));
    eng.process(0, &a).unwrap();
    eng.process(0, &b).unwrap();
    eng.evict(0, &a, kvdir::wire::Tier::Device).unwrap();
    let svc = service(streams_of(&eng), json!({}));
    let s = phase_becomes(&svc, "live");
    assert_eq!(s["replay"], "history");
    assert!(s["replayed_batches"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(agrees(&svc, &eng, 0, &a), (48, 0), "the eviction was replayed too");
    assert_eq!(agrees(&svc, &eng, 0, &b), (48, 0));
    let c = prompt(5000, 2);
    eng.process(0, &c).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &c), (32, 0), "live batches continue the history");
}

#[test]
fn a_gap_is_filled_from_the_history_and_the_blocks_before_it_keep_their_credit() {
    let eng = vllm("gapfill", 10_000);
    let svc = service(streams_of(&eng), json!({}));
    phase_becomes(&svc, "live");
    let kept = prompt(1, 3);
    eng.process(0, &kept).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &kept), (48, 0));
    eng.faults(0, Fault::DropNext(1)).unwrap();
    let (lost, next) = (prompt(2000, 2), prompt(3000, 2));
    eng.process(0, &lost).unwrap();
    eng.process(0, &next).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &lost), (32, 0), "the history brings the lost batch");
    assert_eq!(agrees(&svc, &eng, 0, &next), (32, 0));
    assert_eq!(agrees(&svc, &eng, 0, &kept), (48, 0));
    let s = phase_becomes(&svc, "live");
    assert!(s["gaps"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["truncated_histories"], 0, "{s}");
}

#[test]
fn a_truncated_history_gives_a_partial_stream_until_the_next_full_clear() {
    let eng = vllm("partial", 2);
    let old = prompt(1, 3);
    eng.process(0, &old).unwrap();
    for i in 0..4 {
        eng.process(0, &prompt(10_000 + i * 100, 1)).unwrap();
    }
    let svc = service(streams_of(&eng), json!({}));
    let s = phase_becomes(&svc, "partial");
    assert_eq!(s["truncated_histories"], 1, "{s}");
    assert_eq!(eng.resident(0, &old).unwrap(), (48, 0), "the engine still holds it");
    assert_eq!(hits(&svc, "partial", 0, &old), Ok((0, 0)), "stored before the history began");
    let seen = prompt(20_000, 2);
    eng.process(0, &seen).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &seen), (32, 0), "learned from a live batch");
    eng.clear(0).unwrap();
    phase_becomes(&svc, "live");
    eng.process(0, &old).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &old), (48, 0), "exact again after the clear");
}

#[test]
fn a_restarted_engine_gives_no_credit_until_replayed_from_zero() {
    let eng = vllm("restart", 10_000);
    let svc = service(streams_of(&eng), json!({}));
    let old = prompt(1, 4);
    eng.process(0, &old).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &old), (64, 0));
    let recoveries = report(&svc)["streams"][0]["recoveries"].as_u64().unwrap();
    assert_eq!(recoveries, 0, "the first replay is no recovery");
    eng.restart(0).unwrap();
    let new = prompt(7000, 2);
    eventually("the restart to be replayed", || {
        let s = report(&svc)["streams"][0].clone();
        let m = query(&svc, &old);
        let stale = entry(&m, "restart", 0).reusable_prefix_tokens;
        assert_eq!(stale, 0, "stale credit after the restart is published: {s}");
        if s["recoveries"].as_u64() > Some(recoveries) && s["phase"] == "live" {
            Ok(())
        } else {
            Err(format!("{s}"))
        }
    });
    eng.process(0, &new).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &new), (32, 0));
    assert_eq!(hits(&svc, "restart", 0, &old), Ok((0, 0)));
}

#[test]
fn vllm_duplicate_stores_and_the_older_copys_removal_keep_the_stream_live() {
    let eng = vllm("duplicate", 10_000);
    let svc = service(streams_of(&eng), json!({}));
    phase_becomes(&svc, "live");
    let a = prompt(1, 4);
    eng.process(0, &a).unwrap();
    eng.store_duplicate(0, &a).unwrap().expect("the last block is resident");
    eng.remove_duplicate(0, &a).unwrap().expect("the older copy goes");
    let child: Vec<i32> = a.iter().copied().chain(prompt(9000, 2)).collect();
    eng.process(0, &child).unwrap();
    assert_eq!(eng.resident(0, &child).unwrap(), (96, 0), "the engine kept the other copy");
    // The removed block gets no credit (a removal cannot say which copy went), so the prefix
    // stops before it: under-credit, never stale. Its children still resolve their keys.
    eventually("the late children to be applied", || {
        let last = eng.next_sequence(0).map_err(|e| e.to_string())? - 1;
        let m = query(&svc, &child);
        let m = entry(&m, "duplicate", 0);
        match (m.synchronized, m.device_hit_tokens, m.sequence) {
            (true, 48, Some(seq)) if seq == last => Ok(()),
            _ => Err(format!("{m:?}, engine at {last}")),
        }
    });
    let s = phase_becomes(&svc, "live");
    assert_eq!((s["gaps"].as_u64(), s["last_fault"].clone()), (Some(0), Value::Null), "{s}");
}
