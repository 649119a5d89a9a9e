//! The compact route answer over real HTTP, etcd and engines: a read of the streams with
//! credit alone (a fleet past 128 streams, here asked for with `"list": "compact"`) decides as
//! a read of every stream, and the chosen instance's ranks without credit, read from the
//! directory on demand, still give it its predicted credit and a whole `dp_hits`.

use crate::common::*;
use kvdir::car::{CandidateReport, Policy, RouteSummary, Routed};
use kvdir::config::Flags;
use kvdir_sim::{Registration, SimEngine};
use kvdir_testkit::etcd::etcd_endpoint;
use serde_json::json;

fn route_listing(
    svc: &kvdir_service::Service,
    tokens: &[i32],
    list: &str,
) -> Result<Routed, String> {
    let body = json!({ "token_ids": tokens, "list": list }).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/route", &[], body.as_bytes());
    if r.status != 200 {
        return Err(format!("{}: {}", r.status, r.body));
    }
    serde_json::from_str(&r.body).map_err(|e| e.to_string())
}

/// The queues the instances list reports for `names`, in order (`None`: not listed yet).
fn waiting_of(svc: &kvdir_service::Service, names: [&String; 2]) -> [Option<serde_json::Value>; 2] {
    let r = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
    let list = r["instances"].as_array().cloned().unwrap_or_default();
    names.map(|n| list.iter().find(|i| &i["name"] == n).map(|i| i["waiting_requests_num"].clone()))
}

/// Two registered engines of 2 ranks behind one service with `flags`: A's rank 1 holds the
/// prompt's first half, its rank 0 nothing (A's exact credit is the minimum over its ranks, 0,
/// and only rank 1 has credit in a compact read), A reports an empty queue and B three
/// requests. Nothing is routed until the service knows all of that exactly: each route queues
/// work at its choice, and one decided on B's first report, before its queue of 3, could tie.
/// Its fields drop in order: the engines, their registrations, the service, etcd.
struct TwoEngines {
    _engines: [SimEngine; 2],
    _registrations: [Registration; 2],
    svc: kvdir_service::Service,
    _etcd: kvdir_testkit::etcd::EtcdServer,
    names: [String; 2],
    prompt: Vec<i32>,
}

fn two_engines(ns: &str, flags: Flags, prompt_seed: i32) -> TwoEngines {
    let etcd = etcd_endpoint();
    let svc = discovery_service(&etcd.endpoint, ns, json!({}), flags);
    let (a, ra) = registered_engine(&etcd.endpoint, ns, 2);
    let (b, rb) = registered_engine(&etcd.endpoint, ns, 2);
    let names = [a.instance_name(), b.instance_name()];
    let prompt = prompt(prompt_seed, 8);
    a.process(1, &prompt[..4 * B as usize]).unwrap();
    ra.set_load(0, 0.2);
    rb.set_load(3, 0.2);
    eventually("A's rank 1 holding the prompt and both loads known", || {
        match (hits(&svc, &names[0], 1, &prompt)?, waiting_of(&svc, [&names[0], &names[1]])) {
            ((64, 0), [Some(a), Some(b)]) if a == 0 && b == 3 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    TwoEngines { _engines: [a, b], _registrations: [ra, rb], svc, _etcd: etcd, names, prompt }
}

#[test]
fn a_compact_answer_decides_alike_and_gives_the_chosen_instance_every_rank() {
    let t = two_engines("e2e-compact-route", Flags::default(), 1);
    let (svc, [na, nb], prompt) = (&t.svc, t.names.clone(), &t.prompt);
    // The first route predicts the prompt on the instance it chose; the next two see that.
    let first = route_listing(svc, prompt, "all").unwrap();
    assert_eq!(first.prefill, na, "the idle instance: {first:?}");
    let compact = route_listing(svc, prompt, "compact").unwrap();
    let all = route_listing(svc, prompt, "all").unwrap();
    assert_eq!((&compact.prefill, &all.prefill), (&na, &na));
    let summary = RouteSummary { candidates: 2, prefill: 2, with_credit: 1, ..Default::default() };
    assert_eq!((compact.summary, all.summary), (Some(summary), None));
    let (c, f) = (&compact.candidates[0], all.candidates.iter().find(|c| c.name == na).unwrap());
    assert_eq!(c.name, na, "the chosen instance first");
    // Each route queues work at its choice, so the TTFT terms move from one to the next; the
    // credit and the CAR score do not.
    let credit = |c: &CandidateReport| {
        (c.kv_hit_ratio, c.predicted_hit_ratio, c.dp_hits.clone(), c.score, c.chosen)
    };
    assert_eq!(credit(c), credit(f), "the chosen instance's credit, its rank without any too");
    let ranks: Vec<(u32, u64, bool)> =
        c.dp_hits.iter().map(|h| (h.dp_rank, h.device_hit_tokens, h.synchronized)).collect();
    assert_eq!(ranks, [(0, 0, true), (1, 64, true)]);
    assert!(c.predicted_hit_ratio > Some(0.0), "predicted over both ranks: {c:?}");
    let other = compact.candidates.iter().find(|c| c.name == nb).expect("B listed");
    assert_eq!(other.dp_hits.len(), 2, "a listed candidate has every rank: {other:?}");
}

/// Under TTFT too (the front door's policy), a compact decision builds only the instances
/// credited with part of the prompt and scores the others from their load, ranks and queued
/// work; debug builds check each such decision against one over every candidate.
#[test]
fn a_compact_ttft_answer_scores_uncredited_instances_from_their_queue() {
    let mut flags = Flags::default();
    flags.route.policy = Policy::Ttft;
    let t = two_engines("e2e-compact-route-ttft", flags, 2);
    let (svc, na, prompt) = (&t.svc, t.names[0].clone(), &t.prompt);
    let first = route_listing(svc, prompt, "compact").unwrap();
    assert_eq!((&first.prefill, first.policy), (&na, Policy::Ttft), "less queued: {first:?}");
    let summary = first.summary.unwrap();
    assert_eq!((summary.candidates, summary.prefill, summary.with_credit), (2, 2, 0));
    // The prompt is now expected on A: A is built, with its predicted credit.
    let second = route_listing(svc, prompt, "compact").unwrap();
    let credited = second.candidates.iter().find(|c| c.name == na).unwrap();
    assert_eq!(second.prefill, na, "{second:?}");
    assert!(credited.predicted_hit_ratio > Some(0.0), "{credited:?}");
    assert_eq!(second.summary.map(|s| s.with_credit), Some(1));
}
