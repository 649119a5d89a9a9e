//! Queries and routes answered while heartbeats flood the same HTTP workers: every answer is
//! exact (the prompt's blocks on the engine that holds them, the route to it), and every
//! heartbeat is answered. The prompts are long enough to be read in lanes (`kvdir::query`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use crate::common::*;
use kvdir::config::Flags;
use kvdir::query::QueryResponse;
use serde_json::json;

/// Threads sending heartbeats, and heartbeats each sends.
const FLOODERS: usize = 4;
const BEATS: u64 = 250;

#[test]
fn queries_and_routes_stay_exact_while_heartbeats_flood() {
    let etcd = kvdir_testkit::etcd::etcd_endpoint();
    let ns = format!("e2e-flood-{}", std::process::id());
    let svc = discovery_service(&etcd.endpoint, &ns, json!({}), Flags::default());
    let (a, ra) = registered_engine(&etcd.endpoint, &ns, 1);
    let (b, rb) = registered_engine(&etcd.endpoint, &ns, 1);
    let p = prompt(1, 64);
    a.process(0, &p[..32 * B as usize]).unwrap();
    let (na, nb) = (a.instance_name(), b.instance_name());
    let body = json!({ "token_ids": p }).to_string();
    assert!(body.len() > 4 * 512, "read in lanes");
    let held = 32 * u64::from(B);
    let exact = |r: &QueryResponse| {
        let hit =
            |n: &str| r.matches.iter().find(|m| m.instance_name == n).map(|m| m.device_hit_tokens);
        (hit(&na), hit(&nb)) == (Some(held), Some(0))
    };
    eventually("A's blocks and both instances known", || {
        let r = route(&svc, &p)?;
        let answer =
            http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], body.as_bytes());
        let q: QueryResponse = serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
        match (exact(&q), r.candidates.len(), r.prefill == na) {
            (true, 2, true) => Ok(()),
            seen => Err(format!("{seen:?} {r:?}")),
        }
    });
    let answered = Arc::new(AtomicU64::new(0));
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|t| {
            let (addr, answered) = (svc.http_addr(), Arc::clone(&answered));
            // Both engines' own loads (as registered): the decision must not change.
            let beats = [
                (na.clone(), ra.incarnation_id().to_string()),
                (nb.clone(), rb.incarnation_id().to_string()),
            ];
            thread::spawn(move || {
                for i in 0..BEATS {
                    let (name, incarnation) = &beats[(i as usize + t) % 2];
                    let beat = json!({"name": name, "incarnation_id": incarnation,
                        "load_metrics": {"waiting_requests_num": 1, "gpu_cache_usage_perc": 0.2}});
                    let r = http(
                        addr,
                        "POST",
                        "/v1/internal/heartbeat",
                        &[],
                        beat.to_string().as_bytes(),
                    );
                    assert_eq!(r.status, 200, "{}", r.body);
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let (mut during, mut rounds) = (0, 0);
    while answered.load(Ordering::Relaxed) < FLOODERS as u64 * BEATS && rounds < 10_000 {
        rounds += 1;
        let before = answered.load(Ordering::Relaxed);
        let q = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], body.as_bytes());
        assert_eq!(q.status, 200, "{}", q.body);
        let q: QueryResponse = serde_json::from_str(&q.body).unwrap();
        assert!(exact(&q), "{q:?}");
        let r = route(&svc, &p).unwrap();
        assert_eq!(r.prefill, na, "{r:?}");
        let ratio = r.candidates.iter().find(|c| c.name == na).and_then(|c| c.kv_hit_ratio);
        assert_eq!(ratio, Some(0.5), "{r:?}");
        during += usize::from(answered.load(Ordering::Relaxed) > before);
    }
    for f in flooders {
        f.join().expect("every heartbeat answered 200");
    }
    assert_eq!(answered.load(Ordering::Relaxed), FLOODERS as u64 * BEATS);
    assert!(during >= 3, "{during} query-and-route rounds overlapped the heartbeats");
}
