//! Predict-on-route end to end: three simulated engines (two DP ranks each, real ZeroMQ)
//! registered in a real etcd, kvdir discovering them, siblings of a new prompt routed through
//! `POST /v1/internal/route` before any engine's KV events could exist.

use std::sync::{Arc, Barrier};

use crate::common::*;
use kvdir::car::{CandidateReport, Routed};
use kvdir::config::Flags;
use kvdir_service::Service;
use kvdir_sim::{Registration, SimEngine};
use serde_json::json;

const SIBLINGS: usize = 8;
/// Blocks of the new prompt: more than the 16 a query hashes before it walks, so a prediction
/// must cover keys the walk (which stops at once: nothing holds the prompt) never hashed.
const NEW_BLOCKS: usize = 40;

fn candidate<'a>(r: &'a Routed, name: &str) -> &'a CandidateReport {
    r.candidates.iter().find(|c| c.name == name).unwrap()
}

/// An engine with two DP ranks registered under `ns` with an idle load report.
fn registered(etcd: &str, ns: &str) -> (SimEngine, Registration) {
    let (eng, reg) = registered_engine(etcd, ns, 2);
    reg.set_load(0, 0.1);
    (eng, reg)
}

/// kvdir on the fleet of `ns` with `--car_predict_ttl_ms=ttl_ms`, once it routes over `n`
/// loaded instances whose streams (two each) are synchronized.
fn kvdir(etcd: &str, ns: &str, ttl_ms: u64, n: usize) -> Service {
    let mut flags = Flags::default();
    flags.route.predict_ttl_ms = ttl_ms;
    let svc = discovery_service(etcd, ns, json!({}), flags);
    eventually("every instance a scored candidate with synchronized streams", || {
        let r = route(&svc, &prompt(1, 1))?;
        let scored = r.candidates.iter().filter(|c| c.score.is_some()).count();
        let synced = query(&svc, &[]).matches.iter().filter(|m| m.synchronized).count();
        if scored == n && synced == 2 * n {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    });
    svc
}

/// `SIBLINGS` routes of `tokens` sent at once from as many threads.
fn siblings(svc: &Service, tokens: &[i32]) -> Vec<Routed> {
    let start = Arc::new(Barrier::new(SIBLINGS));
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..SIBLINGS)
            .map(|_| {
                let start = Arc::clone(&start);
                s.spawn(move || {
                    start.wait();
                    route(svc, tokens).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn siblings_of_a_new_prompt_follow_the_first_with_prediction_and_scatter_without() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-predict-{}", std::process::id());
    let fleet: Vec<_> = (0..3).map(|_| registered(&etcd.endpoint, &ns)).collect();
    let predicting = kvdir(&etcd.endpoint, &ns, 2000, 3);
    let new_prompt = prompt(5_000, NEW_BLOCKS);
    // An engine never reuses a prompt's last token, so of a prompt of whole blocks it reuses
    // every block but the last: what the route credits, expected or exact.
    let reused = ((NEW_BLOCKS - 1) * B as usize) as u64;
    let full = reused as f64 / new_prompt.len() as f64;

    let routed = siblings(&predicting, &new_prompt);
    let chosen = &routed[0].prefill;
    let picks: Vec<&String> = routed.iter().map(|r| &r.prefill).collect();
    assert!(picks.iter().all(|p| *p == chosen), "one instance for all siblings: {picks:?}");
    // The last sibling's explanation: the expected blocks, on both ranks, apart from the exact
    // hit (there is none: no engine has seen the prompt).
    let last = routed.iter().find(|r| candidate(r, chosen).predicted_hit_ratio == Some(full));
    let c = candidate(last.expect("a sibling credited with the prediction"), chosen);
    assert_eq!(c.kv_hit_ratio, Some(0.0));
    let expected: Vec<u64> = c.dp_hits.iter().map(|h| h.predicted_hit_tokens).collect();
    assert_eq!(expected, [reused, reused], "a prediction covers every block, on every rank");
    // The exact directory says nothing about it.
    let body = json!({ "token_ids": new_prompt }).to_string();
    let q =
        http(predicting.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], body.as_bytes());
    assert!(!q.body.contains("predict"), "{}", q.body);
    let exact = query(&predicting, &new_prompt);
    assert_eq!(exact.matches.len(), 6);
    assert!(exact.matches.iter().all(|m| m.reusable_prefix_tokens == 0), "{exact:?}");

    // The engine's events arrive: the exact hit takes over and the prediction is dropped.
    let (eng, _) = fleet.iter().find(|(e, _)| e.instance_name() == *chosen).unwrap();
    eng.process(0, &new_prompt).unwrap();
    eng.process(1, &new_prompt).unwrap();
    let confirmed = eventually("the exact hit to replace the prediction", || {
        let r = route(&predicting, &new_prompt)?;
        let c = candidate(&r, chosen);
        if c.kv_hit_ratio == Some(full) && c.predicted_hit_ratio == Some(0.0) {
            Ok(r)
        } else {
            Err(format!("{c:?}"))
        }
    });
    assert_eq!(&confirmed.prefill, chosen);
    // /metrics counts what happened to the predictions.
    let text = http(predicting.http_addr(), "GET", "/metrics", &[], b"").body;
    let count = |event: &str| -> f64 {
        let series = format!("kvdir_route_predictions_total{{event=\"{event}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&series));
        line.and_then(|l| l[series.len()..].parse().ok()).unwrap_or(-1.0)
    };
    let blocks = NEW_BLOCKS as f64;
    assert!(count("recorded") >= blocks, "a key per block of the new prompt:\n{text}");
    assert!(count("confirmed") >= blocks, "the engine's events confirmed them:\n{text}");

    // The same fleet with prediction off: the siblings tie everywhere and rotate.
    let exact_only = kvdir(&etcd.endpoint, &ns, 0, 3);
    let routed = siblings(&exact_only, &prompt(9_000, 8));
    let mut picks: Vec<&String> = routed.iter().map(|r| &r.prefill).collect();
    picks.sort();
    picks.dedup();
    assert!(picks.len() > 1, "scattered: {picks:?}");
    assert!(routed.iter().all(|r| r.candidates.iter().all(|c| c.predicted_hit_ratio == Some(0.0))));
}
