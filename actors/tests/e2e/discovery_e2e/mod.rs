//! End-to-end discovery against a real etcd (started by `.ci/run`, or privately by the test
//! support when `KVDIR_TEST_ETCD` is unset; a missing etcd fails the test, never skips it):
//! simulated engines register like xLLM engines, and kvdir follows them in
//! `/v1/internal/instances` and in query answers.

mod loads;

use crate::common::*;
use kvdir::config::Flags;
use kvdir_service::Service;
use kvdir_sim::{Registration, RegistrationOptions, SimEngine};
use kvdir_testkit::etcd::{etcd_endpoint, EtcdServer};
use serde_json::{json, Value};

/// Starts kvdir with discovery on `etcd` under `namespace`.
fn discovering(etcd: &str, namespace: &str, max_streams: u64) -> Service {
    let extra = json!({"max_streams": max_streams, "replay_timeout_ms": 500});
    discovery_service(etcd, namespace, extra, Flags::default())
}

fn register(eng: &SimEngine, etcd: &EtcdServer, namespace: &str, kind: u8) -> Registration {
    let opts = RegistrationOptions {
        etcd: etcd.endpoint.clone(),
        namespace: namespace.into(),
        kind,
        ttl_s: 2,
        ..RegistrationOptions::default()
    };
    Registration::start(eng, opts).expect("registration")
}

fn instances(svc: &Service) -> Value {
    http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json()
}

fn instance(svc: &Service, name: &str) -> Option<Value> {
    instances(svc)["instances"].as_array()?.iter().find(|i| i["name"] == name).cloned()
}

fn wait_state(svc: &Service, name: &str, state: &str, streams: usize) -> Value {
    eventually(&format!("{name} to be {state} with {streams} streams"), || {
        let i = instance(svc, name).ok_or_else(|| instances(svc).to_string())?;
        let n = i["streams"].as_array().map_or(0, Vec::len);
        if i["state"] == state && n == streams {
            Ok(i)
        } else {
            Err(i.to_string())
        }
    })
}

#[test]
fn several_instances_and_dp_ranks_are_discovered_and_queried() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-multi", 128);
    let a = free_engine(2);
    let d = free_engine(1);
    let _ra = register(&a, &etcd, "e2e-multi", 1);
    let _rd = register(&d, &etcd, "e2e-multi", 2);
    wait_state(&svc, &a.instance_name(), "ACTIVE", 2);
    wait_state(&svc, &d.instance_name(), "ACTIVE", 0);
    // The exclusion is decided by the next reconciliation, which may follow the state.
    eventually("the DECODE instance listed as excluded", || {
        let dec = instance(&svc, &d.instance_name()).ok_or_else(|| "no instance".to_string())?;
        match dec["excluded"].as_str() {
            Some(why) if why.contains("DECODE") => Ok(()),
            _ => Err(dec.to_string()),
        }
    });
    let p = prompt(1, 3);
    a.process(1, &p).unwrap();
    let name = a.instance_name();
    eventually("rank 1's blocks in the answer", || {
        let r = query(&svc, &p);
        let (m0, m1) = (entry(&r, &name, 0), entry(&r, &name, 1));
        if m1.synchronized
            && m1.device_hit_tokens == 48
            && m0.synchronized
            && m0.device_hit_tokens == 0
        {
            Ok(())
        } else {
            Err(format!("{m0:?} {m1:?}"))
        }
    });
}

#[test]
fn lease_loss_keeps_streams_until_suspect_then_drops_them() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-lease", 128);
    let eng = free_engine(1);
    let reg = register(&eng, &etcd, "e2e-lease", 1);
    let name = eng.instance_name();
    wait_state(&svc, &name, "ACTIVE", 1);
    let p = prompt(1, 2);
    eng.process(0, &p).unwrap();
    assert_eq!(agrees_named(&svc, &eng, &name, &p), (32, 0));
    reg.pause();
    wait_state(&svc, &name, "LEASE_LOST", 1);
    assert_eq!(hits(&svc, &name, 0, &p), Ok((32, 0)), "the grace period keeps the index");
    wait_state(&svc, &name, "SUSPECT", 0);
    eventually("the query entries to go", || {
        let r = query(&svc, &p);
        if r.matches.iter().any(|m| m.instance_name == name) {
            Err(format!("{r:?}"))
        } else {
            Ok(())
        }
    });
    reg.resume().unwrap();
    wait_state(&svc, &name, "ACTIVE", 1);
}

#[test]
fn a_dead_engine_goes_suspect_at_once_and_leaves_the_answers() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-dead", 128);
    let eng = free_engine(1);
    let reg = register(&eng, &etcd, "e2e-dead", 0);
    let name = eng.instance_name();
    wait_state(&svc, &name, "ACTIVE", 1);
    reg.kill();
    eng.stop();
    wait_state(&svc, &name, "SUSPECT", 0);
    assert!(query(&svc, &[]).matches.iter().all(|m| m.instance_name != name));
}

#[test]
fn a_replacement_on_the_same_address_gets_no_credit_before_its_snapshot() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-replace", 128);
    let port = free_http_port(1);
    let old = engine_on(port, 1);
    let reg = register(&old, &etcd, "e2e-replace", 1);
    let name = old.instance_name();
    wait_state(&svc, &name, "ACTIVE", 1);
    let p = prompt(1, 3);
    old.process(0, &p).unwrap();
    assert_eq!(agrees_named(&svc, &old, &name, &p), (48, 0));
    let first = instance(&svc, &name).unwrap()["incarnation_id"].clone();
    reg.kill();
    old.stop();
    let new = engine_on(port, 1);
    let _reg = register(&new, &etcd, "e2e-replace", 1);
    let q = prompt(500, 1);
    new.process(0, &q).unwrap();
    eventually("the new process, with only its own blocks", || {
        // While the old stream is dropped and the new one starts, the entry may be absent:
        // that is no credit either.
        let r = query(&svc, &p);
        if let Some(m) = find_entry(&r, &name, 0) {
            assert_eq!(m.reusable_prefix_tokens, 0, "stale credit for the replaced process: {m:?}");
        }
        let i = instance(&svc, &name).ok_or("no instance")?;
        let fresh = hits(&svc, &name, 0, &q)?;
        if i["incarnation_id"] != first && fresh == (16, 0) {
            Ok(())
        } else {
            Err(format!("{i} {fresh:?}"))
        }
    });
}

#[test]
fn a_dp_topology_change_resubscribes() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-dp", 128);
    let port = free_http_port(2);
    let one = engine_on(port, 1);
    let reg = register(&one, &etcd, "e2e-dp", 1);
    let name = one.instance_name();
    wait_state(&svc, &name, "ACTIVE", 1);
    reg.kill();
    one.stop();
    let two = engine_on(port, 2);
    let _reg = register(&two, &etcd, "e2e-dp", 1);
    wait_state(&svc, &name, "ACTIVE", 2);
    let p = prompt(1, 1);
    two.process(1, &p).unwrap();
    eventually("rank 1 of the new topology", || {
        hits(&svc, &name, 1, &p).and_then(
            |h| {
                if h == (16, 0) {
                    Ok(())
                } else {
                    Err(format!("{h:?}"))
                }
            },
        )
    });
}

#[test]
fn namespaces_are_isolated() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-ns-a", 128);
    let other = free_engine(1);
    let _r = register(&other, &etcd, "e2e-ns-b", 1);
    let mine = free_engine(1);
    let _m = register(&mine, &etcd, "e2e-ns-a", 1);
    wait_state(&svc, &mine.instance_name(), "ACTIVE", 1);
    assert!(instance(&svc, &other.instance_name()).is_none(), "{}", instances(&svc));
}

#[test]
fn capacity_admits_whole_instances_in_name_order() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-cap", 3);
    let mut engines: Vec<SimEngine> = (0..3).map(|_| free_engine(2)).collect();
    engines.sort_by_key(SimEngine::instance_name);
    let _regs: Vec<Registration> =
        engines.iter().map(|e| register(e, &etcd, "e2e-cap", 1)).collect();
    wait_state(&svc, &engines[0].instance_name(), "ACTIVE", 2);
    let second = wait_state(&svc, &engines[1].instance_name(), "ACTIVE", 0);
    assert!(second["excluded"].as_str().unwrap().starts_with("capacity"), "{second}");
    wait_state(&svc, &engines[2].instance_name(), "ACTIVE", 0);
}

#[test]
fn discovery_survives_an_etcd_restart() {
    let mut etcd = EtcdServer::private();
    let svc = discovering(&etcd.endpoint, "e2e-restart", 128);
    let a = free_engine(1);
    let _ra = register(&a, &etcd, "e2e-restart", 1);
    wait_state(&svc, &a.instance_name(), "ACTIVE", 1);
    etcd.restart();
    let b = free_engine(1);
    let _rb = register(&b, &etcd, "e2e-restart", 1);
    wait_state(&svc, &b.instance_name(), "ACTIVE", 1);
    let report = instances(&svc);
    assert!(
        report["etcd_listings"].as_u64().unwrap() >= 2,
        "re-listed after the restart: {report}"
    );
}

/// Like `agrees`, for an engine whose instance name is its HTTP address.
fn agrees_named(svc: &Service, eng: &SimEngine, name: &str, tokens: &[i32]) -> (u64, u64) {
    eventually("kvdir to agree with the engine", || {
        let truth = eng.resident(0, tokens).map_err(|e| e.to_string())?;
        let got = hits(svc, name, 0, tokens)?;
        if got == truth {
            Ok(got)
        } else {
            Err(format!("kvdir {got:?}, engine {truth:?}"))
        }
    })
}

#[test]
fn port_overflow_and_overlaps_exclude_the_instances_involved() {
    let etcd = etcd_endpoint();
    let svc = discovering(&etcd.endpoint, "e2e-ports", 128);
    let put = |name: &str, dp: u32| {
        let v = json!({"name": name, "rpc_address": "", "type": 1, "dp_size": dp, "incarnation_id": name});
        etcd_put(&etcd, &format!("/e2e-ports/XLLM:PREFILL:{name}"), &v);
    };
    put("127.0.0.1:65000", 1);
    put("127.0.0.1:9001", 2);
    put("127.0.0.1:9002", 1);
    put("127.0.0.1:9100", 1);
    etcd_put(&etcd, "/e2e-ports/XLLM:PREFILL:127.0.0.1:9200", &json!("not an instance"));
    let why = |name: &str| {
        eventually(&format!("{name} in the report"), || {
            let i = instance(&svc, name).ok_or("absent")?;
            Ok::<Value, String>(i)
        })
    };
    eventually("the exclusions", || {
        let overflow = why("127.0.0.1:65000")["excluded"].as_str().unwrap_or_default().to_string();
        let a = why("127.0.0.1:9001")["excluded"].as_str().unwrap_or_default().to_string();
        let b = why("127.0.0.1:9002")["excluded"].as_str().unwrap_or_default().to_string();
        let fine = why("127.0.0.1:9100");
        let ok = overflow.starts_with("port overflow")
            && a.contains("overlaps instance 127.0.0.1:9002")
            && b.contains("overlaps instance 127.0.0.1:9001")
            && fine["excluded"].is_null()
            && fine["streams"] == json!([0]);
        if ok {
            Ok(())
        } else {
            Err(format!("{overflow} | {a} | {b} | {fine}"))
        }
    });
    assert!(instance(&svc, "127.0.0.1:9200").is_none(), "a value that does not parse is ignored");
}

#[test]
fn kvdir_serves_while_etcd_is_down_and_says_so() {
    let mut etcd = EtcdServer::private();
    etcd.stop();
    let svc = discovering(&etcd.endpoint, "e2e-down", 128);
    assert_eq!(query(&svc, &[1, 2]).matches.len(), 0, "queries are answered");
    eventually("the etcd error in the report", || {
        let r = instances(&svc);
        if r["etcd_connected"] == false
            && r["etcd_error"].as_str().is_some_and(|e| e.contains("etcd"))
        {
            Ok(())
        } else {
            Err(r.to_string())
        }
    });
}

#[test]
fn a_relist_keeps_a_suspect_instance_suspect_until_it_is_removed() {
    let mut etcd = EtcdServer::private();
    let svc = discovering(&etcd.endpoint, "e2e-relist", 128);
    let eng = free_engine(1);
    let reg = register(&eng, &etcd, "e2e-relist", 1);
    let name = eng.instance_name();
    wait_state(&svc, &name, "ACTIVE", 1);
    // The lease expires while /health keeps answering: LEASE_LOST, then SUSPECT after 3 s
    // without heartbeats.
    reg.pause();
    wait_state(&svc, &name, "SUSPECT", 0);
    etcd.restart(); // the watch dies and kvdir lists again, without the instance's key
    eventually("a second listing", || {
        let r = instances(&svc);
        if r["etcd_listings"].as_u64() >= Some(2) {
            Ok(())
        } else {
            Err(r.to_string())
        }
    });
    // /health still answers 200, so probing again would bring the instance back to LEASE_LOST
    // and restart its clock. It stays SUSPECT until it is removed (15 s after SUSPECT).
    eventually("the SUSPECT instance to be removed", || match instance(&svc, &name) {
        None => Ok(()),
        Some(i) if i["state"] == "SUSPECT" => Err(i.to_string()),
        Some(i) => panic!("a re-list changed the state of a SUSPECT instance: {i}"),
    });
}
