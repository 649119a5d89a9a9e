//! End-to-end routing: simulated engines registered in a real etcd hold different prefixes and
//! report different loads; `POST /v1/internal/route` must follow the CAR formula, explain every
//! candidate, and switch when the loads or the cache change.

use crate::common::*;
use kvdir::car::{Policy, RouteParams, Routed, TtftParams};
use kvdir::config::Flags;
use kvdir_service::Service;
use kvdir_sim::{Registration, SimEngine};
use kvdir_testkit::etcd::etcd_endpoint;
use serde_json::json;

/// Checks every scored candidate against the formula with the numbers the response reports
/// (the predicted term at the default weight 0.5: routing a prompt predicts it).
fn follows_formula(r: &Routed, lambda: f64) {
    for c in r.candidates.iter().filter(|c| c.score.is_some()) {
        let (ratio, cost) = (c.kv_hit_ratio.unwrap(), c.queue_cost.unwrap());
        let predicted = c.predicted_hit_ratio.unwrap();
        let expected = lambda * (1.0 - ratio - 0.5 * predicted) + (1.0 - lambda) * cost;
        assert!((c.score.unwrap() - expected).abs() < 1e-9, "{c:?}");
    }
    let best = r.candidates.iter().filter_map(|c| c.score).fold(f64::INFINITY, f64::min);
    let chosen = r.candidates.iter().find(|c| c.chosen).unwrap();
    assert_eq!(chosen.score, Some(best), "the smallest score wins: {r:?}");
    assert_eq!(chosen.name, r.prefill);
}

#[test]
fn the_route_follows_cache_and_queue() {
    let etcd = etcd_endpoint();
    let svc = discovery_service(&etcd.endpoint, "e2e-route", json!({}), Flags::default());
    let (a, ra) = registered(&etcd.endpoint, "e2e-route");
    let (b, rb) = registered(&etcd.endpoint, "e2e-route");
    let cached_part = prompt(1, 4);
    a.process(0, &cached_part).unwrap();
    let prompt = prompt(1, 8); // A holds the first half
    ra.set_load(1, 0.2);
    rb.set_load(4, 0.2);
    let (na, nb) = (a.instance_name(), b.instance_name());
    // Every route records its prompt as expected on the engine it chose (predict-on-route):
    // a route taken before A's blocks and both loads are known would credit B with the prompt
    // for the predictions' lifetime. So nothing is routed until kvdir knows them.
    eventually("A's blocks and both loads known", || {
        let loaded = |name: &str| {
            let i = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
            let list = i["instances"].as_array().cloned().unwrap_or_default();
            let load = |n: &str| {
                list.iter().find(|x| x["name"] == n).map(|x| x["waiting_requests_num"].clone())
            };
            load(name)
        };
        let a_hits = hits(&svc, &na, 0, &prompt)?;
        match (a_hits, loaded(&na), loaded(&nb)) {
            ((64, 0), Some(la), Some(lb)) if la == 1 && lb == 4 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let cached = eventually("A to be chosen for its cache", || {
        let r = route(&svc, &prompt)?;
        let ca = r.candidates.iter().find(|c| c.name == na).ok_or("A unknown")?;
        if r.prefill == na && ca.kv_hit_ratio == Some(0.5) {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    });
    follows_formula(&cached, 0.5);
    assert_eq!(cached.decode, None, "DEFAULT instances serve alone");
    let cb = cached.candidates.iter().find(|c| c.name == nb).unwrap();
    let ca = cached.candidates.iter().find(|c| c.name == na).unwrap();
    // 0.375 from the exact half, less the predicted rest while A's earlier routes stand.
    let chosen = format!("score 1.0000 is above the chosen {:.4}", ca.score.unwrap());
    assert!(cb.reason.starts_with(&chosen) && ca.score <= Some(0.375), "{cb:?}");
    assert_eq!(
        cached.candidates.iter().find(|c| c.name == na).unwrap().dp_hits[0].device_hit_tokens,
        64
    );

    // A's queue grows until half a prompt of cache no longer pays for it.
    ra.set_load(40, 0.2);
    rb.set_load(1, 0.2);
    let busy = eventually("B to be chosen once A is busy", || {
        let r = route(&svc, &prompt)?;
        if r.prefill == nb {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    });
    follows_formula(&busy, 0.5);

    // An unrelated prompt: nobody has it, so the shorter queue wins.
    let other = route(&svc, &prompt_of(900, 2)).unwrap();
    assert_eq!(other.prefill, nb);
    follows_formula(&other, 0.5);

    // The same fleet under --load_balance_policy=RR: the flag reaches the router.
    let rr_params =
        kvdir::car::RouteParams { policy: kvdir::car::Policy::Rr, ..Default::default() };
    let rr_flags = Flags { route: rr_params, ..Flags::default() };
    let rr = discovery_service(&etcd.endpoint, "e2e-route", json!({}), rr_flags);
    let picks: Vec<String> = eventually("two RR decisions over both instances", || {
        let picks: Vec<String> =
            (0..2).map(|_| route(&rr, &prompt).map(|r| r.prefill)).collect::<Result<_, _>>()?;
        if picks[0] != picks[1] {
            Ok(picks)
        } else {
            Err(format!("{picks:?}"))
        }
    });
    assert!(picks.contains(&na) && picks.contains(&nb), "{picks:?}");
    assert_eq!(route(&rr, &prompt).unwrap().policy, kvdir::car::Policy::Rr);
}

fn prompt_of(first: i32, blocks: usize) -> Vec<i32> {
    prompt(first, blocks)
}

/// An engine registered in etcd under `namespace` with a load report.
fn registered(etcd: &str, namespace: &str) -> (SimEngine, Registration) {
    registered_engine(etcd, namespace, 1)
}

#[test]
fn routing_follows_etcd_without_discovery_and_static_streams_give_no_credit() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-static-{}", std::process::id());
    let (eng, reg) = registered(&etcd.endpoint, &ns);
    let flags =
        Flags { etcd_addr: etcd.endpoint.clone(), etcd_namespace: ns.clone(), ..Flags::default() };
    // Static streams of that very engine: the directory knows its cache, but static streams
    // carry no process identity, so CAR gives them no credit.
    let name = eng.instance_name();
    let mut streams = streams_of(&eng);
    streams[0]["instance_name"] = json!(name); // the name it has in etcd
    let svc = service_with(streams, json!({}), flags.clone());
    let p = prompt(1, 4);
    eng.process(0, &p).unwrap();
    eventually("the engine's blocks in the query answer", || {
        let m = entry(&query(&svc, &p), &name, 0).clone();
        if m.device_hit_tokens == 64 {
            Ok(())
        } else {
            Err(format!("{m:?}"))
        }
    });
    let routed = eventually("a route over the instance from etcd", || route(&svc, &p));
    assert_eq!(routed.prefill, name);
    let chosen = routed.candidates.iter().find(|c| c.chosen).unwrap();
    assert_eq!(chosen.kv_hit_ratio, Some(0.0), "no credit from a static stream: {routed:?}");
    let beat = json!({"name": name, "incarnation_id": reg.incarnation_id(),
                      "load_metrics": {"waiting_requests_num": 3, "gpu_cache_usage_perc": 0.5}});
    let hb =
        http(svc.http_addr(), "POST", "/v1/internal/heartbeat", &[], beat.to_string().as_bytes());
    assert_eq!(hb.status, 200, "heartbeats are accepted: {}", hb.body);
    drop(svc);

    // No kv_events_config_file at all: the same instance is routed to, with zero hit ratios.
    let flags = Flags { http_server_port: 0, server_host: "127.0.0.1".into(), ..flags };
    let bare = Service::start(flags, None).expect("kvdir starts");
    let routed = eventually("a route without a directory", || route(&bare, &p));
    assert_eq!(routed.prefill, name);
    assert_eq!(routed.candidates[0].kv_hit_ratio, Some(0.0));
}

#[test]
fn a_route_answer_says_where_its_time_went() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-timing-{}", std::process::id());
    let (_eng, _reg) = registered(&etcd.endpoint, &ns);
    let svc = discovery_service(&etcd.endpoint, &ns, json!({}), Flags::default());
    eventually("a route over the instance from etcd", || route(&svc, &prompt(1, 4)));
    let body = json!({ "token_ids": prompt(1, 4) }).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/route", &[], body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    let stages = crate::http_api::timing_stages(&r.head);
    let expected = ["body", "parse", "read", "lock", "decide", "json", "handler"];
    assert_eq!(stages, expected, "{}", r.head);
}

#[test]
fn without_instances_the_route_is_a_503_that_says_why() {
    let etcd = etcd_endpoint();
    let eng = engine("static", 1, 0);
    let flags = Flags {
        etcd_addr: etcd.endpoint.clone(),
        etcd_namespace: format!("e2e-empty-{}", std::process::id()),
        ..Flags::default()
    };
    let svc = service_with(streams_of(&eng), json!({}), flags);
    let err = route(&svc, &[1, 2, 3]).unwrap_err();
    assert!(err.starts_with("503"), "{err}");
    assert!(err.contains("no instances are known"), "{err}");
    let bad = http(svc.http_addr(), "POST", "/v1/internal/route", &[], br#"{"token_ids":[-1]}"#);
    assert_eq!(bad.status, 400);
}

/// A heartbeat's load is used by the very next route (protocol: "a fresh heartbeat is used at
/// once"), each instance's on its own: the busy instance gets the whole queue cost and the
/// route goes to the idle one, then the other way round. Loads written to LOADMETRICS follow.
#[test]
fn a_heartbeat_load_is_used_by_the_next_route() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-hb-load-{}", std::process::id());
    let (a, ra) = registered(&etcd.endpoint, &ns);
    let (b, rb) = registered(&etcd.endpoint, &ns);
    let flags = Flags {
        http_server_port: 0,
        server_host: "127.0.0.1".into(),
        etcd_addr: etcd.endpoint.clone(),
        etcd_namespace: ns,
        ..Flags::default()
    };
    let svc = Service::start(flags, None).expect("kvdir starts");
    let p = prompt(1, 4);
    eventually("both instances in the route's candidates", || match route(&svc, &p) {
        Ok(r) if r.candidates.len() == 2 => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let beat = |reg: &Registration, name: &str, waiting: u64| {
        heartbeat(&svc, reg, name, waiting, 0.1);
    };
    let (a, b) = ((&ra, a.instance_name()), (&rb, b.instance_name()));
    for ((busy_reg, busy), (idle_reg, idle)) in [(&a, &b), (&b, &a)] {
        beat(busy_reg, busy, 10);
        beat(idle_reg, idle, 0);
        // Heartbeats reach routing in discovery's next pass over them (every 20 ms).
        eventually("the heartbeats' loads in the route", || {
            let r = route(&svc, &p)?;
            let cost = |name: &str| r.candidates.iter().find(|c| c.name == name)?.queue_cost;
            match (cost(busy), cost(idle)) {
                (Some(1.0), Some(0.0)) if &r.prefill == idle => Ok(()),
                seen => Err(format!("{seen:?} {r:?}")),
            }
        });
    }
    // LOADMETRICS in etcd, written after the heartbeats, also reach routing: once discovery
    // shows the new loads, the next route uses them (discovery updates the router first).
    // The heartbeats left `a` idle and `b` busy; LOADMETRICS turns that round.
    ra.set_load(30, 0.1);
    rb.set_load(0, 0.1);
    eventually("discovery to show the LOADMETRICS loads", || {
        let r = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let waiting = |name: &str| {
            let list = r["instances"].as_array().cloned().unwrap_or_default();
            list.iter().find(|i| i["name"] == name).map(|i| i["waiting_requests_num"].clone())
        };
        match (waiting(&a.1), waiting(&b.1)) {
            (Some(x), Some(y)) if x == 30 && y == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let r = route(&svc, &p).unwrap();
    let cost = |name: &str| r.candidates.iter().find(|c| c.name == name).unwrap().queue_cost;
    assert_eq!((cost(&a.1), cost(&b.1)), (Some(1.0), Some(0.0)), "{r:?}");
    assert_eq!(r.prefill, b.1, "{r:?}");
}

/// The TTFT policy, over real HTTP: a long cached prefix on an engine that is busy with one
/// request beats an idle engine without it (CAR at 0.5 would call it the busiest), until six
/// requests queued there cost more than the prefix saves. Every estimate follows its terms.
/// (`--ttft_later_weight 0 --ttft_queue_weight 0`: the choice is on the estimate alone; the
/// unit tests cover the later cost.)
#[test]
fn ttft_sends_a_request_where_its_first_token_is_expected_soonest() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-ttft-{}", std::process::id());
    let ttft = TtftParams { later_weight: 0.0, queue_weight: 0.0, ..TtftParams::default() };
    let params = RouteParams { policy: Policy::Ttft, ttft, ..RouteParams::default() };
    let svc = discovery_service(
        &etcd.endpoint,
        &ns,
        json!({}),
        Flags { route: params, ..Flags::default() },
    );
    let (a, ra) = registered(&etcd.endpoint, &ns);
    let (b, rb) = registered(&etcd.endpoint, &ns);
    let (na, nb) = (a.instance_name(), b.instance_name());
    let beat = |reg: &Registration, name: &str, waiting: u64| {
        heartbeat(&svc, reg, name, waiting, 0.2);
    };
    // 960 of the prompt's 1024 tokens are cached on A.
    a.process(0, &prompt(5000, 60)).unwrap();
    let p = prompt(5000, 64);
    ra.set_load(0, 0.2);
    rb.set_load(0, 0.2);
    // The LOADMETRICS writes must have arrived before the heartbeats below, or one arriving
    // late would overwrite a heartbeat's load.
    eventually("the LOADMETRICS loads in the report", || {
        let r = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let list = r["instances"].as_array().cloned().unwrap_or_default();
        let usage = |name: &str| {
            list.iter().find(|i| i["name"] == name).and_then(|i| i["gpu_cache_usage_perc"].as_f64())
        };
        match (usage(&na), usage(&nb)) {
            (Some(a), Some(b)) if a == 0.2 && b == 0.2 => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    });
    eventually("A's cache in the route's candidates", || {
        let r = route(&svc, &prompt(9000, 1))?;
        let hit = r.candidates.iter().find(|c| c.name == na).and_then(|c| c.dp_hits.first());
        match (
            r.candidates.len(),
            query(&svc, &p).matches.iter().any(|m| m.device_hit_tokens == 960),
        ) {
            (2, true) if hit.is_some() => Ok(()),
            other => Err(format!("{other:?} {r:?}")),
        }
    });
    // Both idle: everything routed so far is done. Then four uncached 512-token prompts, two on
    // each instance (each goes where less is queued).
    beat(&ra, &na, 0);
    beat(&rb, &nb, 0);
    for k in 0..4 {
        route(&svc, &prompt(20_000 + 1000 * k, 32)).unwrap();
    }
    for (busy, expected) in [(1, &na), (6, &nb)] {
        // B's load shows no change, so B's heartbeat goes first: discovery applies queued
        // heartbeats in order, so once A's new load shows, B's heartbeat (retiring the two
        // prompts routed to it above) has been applied too.
        beat(&rb, &nb, 0);
        beat(&ra, &na, busy);
        // The heartbeats reach routing in discovery's next pass over them (every 20 ms); a
        // probe routes nothing (it would add to the queues).
        eventually("the heartbeats' loads in the route", || {
            let r = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
            let list = r["instances"].as_array().cloned().unwrap_or_default();
            let waiting = |name: &str| {
                list.iter()
                    .find(|i| i["name"] == name)
                    .and_then(|i| i["waiting_requests_num"].as_u64())
            };
            match (waiting(&na), waiting(&nb)) {
                (Some(x), Some(0)) if x == busy => Ok(()),
                seen => Err(format!("{seen:?}")),
            }
        });
        let r = route(&svc, &p).unwrap();
        let terms =
            |name: &str| r.candidates.iter().find(|c| c.name == name).unwrap().ttft.unwrap();
        let (ta, tb) = (terms(&na), terms(&nb));
        assert_eq!((ta.queued_requests, tb.queued_requests), (busy, 0), "{r:?}");
        assert_eq!(tb.own_uncached_tokens, 1024.0, "{r:?}");
        assert!(ta.own_uncached_tokens <= 64.0, "A has all but the last 64 tokens: {r:?}");
        assert_eq!(&r.prefill, expected, "{busy} request(s) queued on A: {r:?}");
        for c in r.candidates.iter() {
            let t = c.ttft.unwrap();
            let prefill = (t.queued_tokens + t.own_uncached_tokens) / t.prefill_tokens_per_s;
            let expected = 1000.0 * prefill + 5.0 * (t.queued_requests as f64 + 1.0) + 2.0;
            assert!((t.estimate_ms - expected).abs() < 1e-6, "{c:?}");
            assert_eq!(c.estimated_ttft_ms, Some(t.estimate_ms));
            assert_eq!((c.score, t.later_ms), (Some(t.estimate_ms), 0.0));
        }
        let best = r.candidates.iter().filter_map(|c| c.estimated_ttft_ms).fold(f64::MAX, f64::min);
        let chosen = r.candidates.iter().find(|c| c.chosen).unwrap();
        assert_eq!(
            (chosen.estimated_ttft_ms, chosen.reason.as_str()),
            (Some(best), "lowest estimated time to first token plus miss cost")
        );
    }
}

/// Sends `name`'s heartbeat with `waiting` requests and `usage`, answered 200.
fn heartbeat(svc: &Service, reg: &Registration, name: &str, waiting: u64, usage: f64) {
    let body = json!({"name": name, "incarnation_id": reg.incarnation_id(),
        "load_metrics": {"waiting_requests_num": waiting, "gpu_cache_usage_perc": usage}});
    let hb =
        http(svc.http_addr(), "POST", "/v1/internal/heartbeat", &[], body.to_string().as_bytes());
    assert_eq!(hb.status, 200, "{}", hb.body);
}
