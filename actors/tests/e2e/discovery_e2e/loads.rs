//! Loads and heartbeats: LOADMETRICS keys and heartbeats reach the instances report and
//! routing, heartbeats are validated, and a replacement process is no candidate until it
//! reports its own load.

use kvdir::config::Flags;
use kvdir_sim::{Registration, RegistrationOptions};
use serde_json::{json, Value};

use super::{discovering, etcd_put, instance, instances, register, wait_state};
use crate::common::*;

#[test]
fn heartbeats_are_validated() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-hb", 128);
    let eng = free_engine(1);
    let reg = register(&eng, &etcd, "e2e-hb", 1);
    let name = eng.instance_name();
    wait_state(&svc, &name, "ACTIVE", 1);
    let post = |body: Value| {
        http(svc.http_addr(), "POST", "/v1/internal/heartbeat", &[], body.to_string().as_bytes())
    };
    let load = json!({"waiting_requests_num": 7, "gpu_cache_usage_perc": 0.25});
    let ok =
        post(json!({"name": name, "incarnation_id": reg.incarnation_id(), "load_metrics": load}));
    assert_eq!(ok.status, 200, "{}", ok.body);
    // Applied in discovery's next pass over the queued heartbeats (every 20 ms).
    eventually("the heartbeat's load in the report", || {
        let i = instance(&svc, &name).unwrap();
        match (i["waiting_requests_num"].as_u64(), i["gpu_cache_usage_perc"].as_f64()) {
            (Some(7), Some(0.25)) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    });
    let stale = post(json!({"name": name, "incarnation_id": "old", "load_metrics": load}));
    assert_eq!(stale.status, 409);
    assert!(stale.json()["error"].as_str().unwrap().contains("is stale"));
    let unknown =
        post(json!({"name": "127.0.0.1:1", "incarnation_id": null, "load_metrics": load}));
    assert_eq!(unknown.status, 409);
    let bad = post(
        json!({"name": name, "load_metrics": {"waiting_requests_num": 1, "gpu_cache_usage_perc": 2.0}}),
    );
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("gpu_cache_usage_perc = 2 is outside 0..=1"), "{}", bad.body);
    assert_eq!(post(json!({"nom": 1})).status, 400);
}

#[test]
fn load_comes_from_loadmetrics_keys_and_heartbeats_need_the_token() {
    let etcd = etcd_endpoint();
    let flags = Flags { internal_api_token: Some("tok".into()), ..Flags::default() };
    let svc = discovery_service(&etcd.endpoint, "e2e-load", json!({}), flags);
    let eng = free_engine(1);
    let opts = RegistrationOptions {
        etcd: etcd.endpoint.clone(),
        namespace: "e2e-load".into(),
        kind: 1,
        write_loadmetrics: true,
        ..RegistrationOptions::default()
    };
    let reg = Registration::start(&eng, opts).unwrap();
    reg.set_load(11, 0.5);
    let name = eng.instance_name();
    let auth = [("X-Internal-Token", "tok")];
    eventually("the LOADMETRICS load", || {
        let r = http(svc.http_addr(), "GET", "/v1/internal/instances", &auth, b"").json();
        let i = r["instances"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["name"] == name.as_str()).cloned());
        match i {
            Some(i) if i["waiting_requests_num"] == 11 && i["gpu_cache_usage_perc"] == 0.5 => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    let body = json!({"name": name, "incarnation_id": reg.incarnation_id(),
        "load_metrics": {"waiting_requests_num": 1, "gpu_cache_usage_perc": 0.1}});
    let hb =
        http(svc.http_addr(), "POST", "/v1/internal/heartbeat", &[], body.to_string().as_bytes());
    assert_eq!(hb.status, 401);
    let hb =
        http(svc.http_addr(), "POST", "/v1/internal/heartbeat", &auth, body.to_string().as_bytes());
    assert_eq!(hb.status, 200, "{}", hb.body);
}

#[test]
fn only_instance_and_load_keys_are_read_and_loads_apply_on_the_first_listing() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-cache-{}", std::process::id());
    // A CACHE namespace larger than a gRPC client's default 4 MiB message: listing the whole
    // `XLLM:` prefix would transfer it, or fail.
    let big = json!("x".repeat(1 << 20));
    for i in 0..5 {
        etcd_put(&etcd, &format!("/{ns}/XLLM:CACHE:block-{i}"), &big);
    }
    let a = free_engine(1);
    let opts = RegistrationOptions {
        etcd: etcd.endpoint.clone(),
        namespace: ns.clone(),
        kind: 1,
        ttl_s: 5,
        write_loadmetrics: true,
        ..RegistrationOptions::default()
    };
    // Registered, with its load (0 waiting), before kvdir starts: both come from the first
    // listing, where LOADMETRICS sorts before PREFILL in key order. Nothing writes the load
    // again, so a load dropped by the listing would stay unknown (null).
    let _reg = Registration::start(&a, opts).expect("registration");
    let svc = discovering(&etcd.endpoint, &ns, 128);
    let name = a.instance_name();
    let listed = eventually("the first listing with the instance and its load", || {
        let r = instances(&svc);
        let i = r["instances"].as_array().and_then(|v| v.iter().find(|i| i["name"] == name));
        match i {
            Some(i) if i["waiting_requests_num"] == 0 => Ok(r.clone()),
            _ => Err(r.to_string()),
        }
    });
    assert_eq!(listed["etcd_listings"], 1, "{listed}");
    assert_eq!(listed["etcd_listed_keys"], 2, "the instance and its LOADMETRICS only: {listed}");
    assert_eq!(listed["etcd_connected"], true, "{listed}");
}

#[test]
fn a_replacement_is_no_candidate_until_it_reports_its_own_load() {
    let etcd = etcd_endpoint();
    let ns = format!("e2e-newload-{}", std::process::id());
    let svc = discovering(&etcd.endpoint, &ns, 128);
    let eng = free_engine(1);
    let name = eng.instance_name();
    let opts = |incarnation: &str, loads: bool| RegistrationOptions {
        etcd: etcd.endpoint.clone(),
        namespace: ns.clone(),
        kind: 0,
        incarnation_id: Some(incarnation.into()),
        write_loadmetrics: loads,
        ..RegistrationOptions::default()
    };
    let route = || {
        let r = http(svc.http_addr(), "POST", "/v1/internal/route", &[], br#"{"token_ids":[1]}"#);
        (r.status, r.body)
    };
    let first = Registration::start(&eng, opts("first", true)).expect("registration");
    eventually("the first process to be routed to", || match route() {
        (200, body) if body.contains(&name) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    first.kill();
    // The new process does not write LOADMETRICS: the old process's value stays in etcd.
    let _second = Registration::start(&eng, opts("second", false)).expect("registration");
    let replaced = eventually("the replacement, without a load", || match instance(&svc, &name) {
        Some(i) if i["incarnation_id"] == "second" && i["state"] == "ACTIVE" => Ok(i),
        other => Err(format!("{other:?}")),
    });
    assert!(replaced["waiting_requests_num"].is_null(), "{replaced}");
    let (status, body) = route();
    assert_eq!(status, 503, "no candidate without its own load report: {body}");
    let beat = json!({"name": name, "incarnation_id": "second",
                      "load_metrics": {"waiting_requests_num": 1, "gpu_cache_usage_perc": 0.1}});
    let hb =
        http(svc.http_addr(), "POST", "/v1/internal/heartbeat", &[], beat.to_string().as_bytes());
    assert_eq!(hb.status, 200, "{}", hb.body);
    eventually("its own heartbeat to make it a candidate", || match route() {
        (200, _) => Ok(()),
        other => Err(format!("{other:?}")),
    });
}
