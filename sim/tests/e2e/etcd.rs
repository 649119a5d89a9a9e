//! Engines register in a real etcd like xLLM engines (protocol.md section 5): the instance key
//! and JSON as kvdir parses them, the lease, pause/resume/kill, re-put of a deleted key, the
//! namespace, LOADMETRICS, heartbeats, and surviving an etcd restart.
//!
//! Every test gets its etcd from `kvdir_testkit::etcd` (a private server, or `KVDIR_TEST_ETCD`); the restart
//! test always uses a private one. Tests poll with deadlines; the only fixed waits are
//! observation windows for "stays present" and "no more heartbeats".

use std::time::{Duration, Instant};

use crate::etcd_support::{
    engine_with_http, eventually, EtcdReader, HeartbeatSink, Patience, DEADLINE,
};
use kvdir::registry::{parse_instance, parse_key, parse_load_bytes, InstanceType, RegistryKey};
use kvdir_sim::http;
use kvdir_sim::{Registration, RegistrationOptions, SimError};
use kvdir_testkit::etcd::{etcd_endpoint, EtcdServer};

fn options(etcd: &EtcdServer) -> RegistrationOptions {
    RegistrationOptions { etcd: etcd.endpoint.clone(), ..RegistrationOptions::default() }
}

fn health(name: &str) -> u16 {
    let response = http::request(name, "GET", "/health", &[], None, Duration::from_secs(2));
    response.map(|r| r.status).unwrap_or(0)
}

#[test]
fn the_key_and_json_appear_and_parse_as_kvdir_reads_them() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(2);
    let opts = RegistrationOptions {
        register_ts_ms: Some(1234),
        backend_type: Some("xllm".into()),
        ..options(&etcd)
    };
    let reg = Registration::start(&engine, opts).expect("registers");
    let name = engine.instance_name();
    let port: u32 = name.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_eq!(engine.endpoints()[1].event, format!("tcp://127.0.0.1:{}", port + 10001));
    assert_eq!(engine.endpoints()[1].replay, format!("tcp://127.0.0.1:{}", port + 30001));
    let reader = EtcdReader::new(&etcd);
    let key = format!("XLLM:DEFAULT:{name}");
    assert_eq!(reg.key(), key);
    let kv = reader.get(&key).expect("the key is written before start returns");
    assert_ne!(kv.lease, 0, "the instance key is leased");
    assert_eq!(
        parse_key("", &key),
        Some(RegistryKey::Instance(InstanceType::Default, name.clone()))
    );
    let record = parse_instance(&name, &kv.value).expect("kvdir parses the value");
    assert_eq!(
        (record.kind, record.dp_size, record.backend.as_str()),
        (InstanceType::Default, 2, "xllm")
    );
    assert_eq!(record.identity.incarnation_id.as_deref(), Some(reg.incarnation_id()));
    assert_eq!(record.identity.register_ts_ms, Some(1234));
    assert_eq!(health(&name), 200);
    assert!(reader.get(&format!("XLLM:LOADMETRICS:{name}")).is_none(), "LOADMETRICS is opt-in");
}

#[test]
fn the_lease_keeps_the_key_beyond_twice_the_ttl() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(1);
    let reg = Registration::start(&engine, RegistrationOptions { ttl_s: 2, ..options(&etcd) })
        .expect("registers");
    let reader = EtcdReader::new(&etcd);
    let window = Instant::now() + Duration::from_secs(5);
    let mut checks = 0;
    while Instant::now() < window {
        assert!(reader.get(reg.key()).is_some(), "the key vanished after {checks} checks");
        checks += 1;
        std::thread::sleep(Duration::from_millis(200)); // sampling within the window
    }
}

#[test]
fn pause_lets_the_lease_expire_while_health_answers_and_resume_puts_it_back() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(1);
    let ttl_s = 2;
    let reg =
        Registration::start(&engine, RegistrationOptions { ttl_s, ..options(&etcd) }).unwrap();
    let reader = EtcdReader::new(&etcd);
    reg.pause();
    let paused = Instant::now();
    let gone = Duration::from_secs(ttl_s as u64 + 2);
    Patience::new(gone)
        .eventually("the key expires after pause", || reader.get(reg.key()).is_none());
    assert!(paused.elapsed() <= gone);
    assert_eq!(health(&engine.instance_name()), 200, "/health answers while paused");
    reg.resume().expect("resume registers again");
    let kv = reader.get(reg.key()).expect("resume returns once the key is written");
    let record = parse_instance(&engine.instance_name(), &kv.value).unwrap();
    assert_eq!(record.identity.incarnation_id.as_deref(), Some(reg.incarnation_id()));
    let lease = kv.lease;
    let window = Instant::now() + Duration::from_secs(ttl_s as u64 + 1);
    while Instant::now() < window {
        assert!(reader.get(reg.key()).is_some(), "keepalives resumed with the new lease {lease}");
        std::thread::sleep(Duration::from_millis(200)); // sampling within the window
    }
}

#[test]
fn a_deleted_key_is_put_again_and_kill_removes_it_at_once() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(1);
    let reg = Registration::start(&engine, options(&etcd)).unwrap();
    let reader = EtcdReader::new(&etcd);
    let key = reg.key().to_string();
    reader.delete(&key);
    assert!(reader.get(&key).is_none());
    eventually("the deleted key is put again", || reader.get(&key).is_some());
    reg.kill();
    assert!(reader.get(&key).is_none(), "kill revokes the lease before it returns");
    let again = Registration::start(&engine, options(&etcd)).unwrap();
    assert!(reader.get(&key).is_some());
    drop(again);
    assert!(reader.get(&key).is_none(), "drop revokes the lease too");
}

#[test]
fn a_replaced_engine_registers_a_new_incarnation_on_the_same_address() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(2);
    let reader = EtcdReader::new(&etcd);
    let old = Registration::start(&engine, options(&etcd)).unwrap();
    let (key, old_id) = (old.key().to_string(), old.incarnation_id().to_string());
    old.kill();
    for rank in 0..2 {
        engine.restart(rank).unwrap();
    }
    let new = Registration::start(&engine, options(&etcd)).unwrap();
    assert_ne!(new.incarnation_id(), old_id);
    let record = parse_instance(&engine.instance_name(), &reader.get(&key).unwrap().value).unwrap();
    assert_eq!(record.identity.incarnation_id.as_deref(), Some(new.incarnation_id()));
    let fixed = RegistrationOptions { incarnation_id: Some("fixed".into()), ..options(&etcd) };
    drop(new);
    assert_eq!(Registration::start(&engine, fixed).unwrap().incarnation_id(), "fixed");
}

#[test]
fn the_namespace_and_type_shape_the_key() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(1);
    let opts = RegistrationOptions {
        namespace: "prod".into(),
        kind: 3,
        current_type: Some(2),
        ..options(&etcd)
    };
    let reg = Registration::start(&engine, opts).unwrap();
    let name = engine.instance_name();
    let key = format!("/prod/XLLM:MIX:{name}");
    assert_eq!(reg.key(), key);
    let reader = EtcdReader::new(&etcd);
    let kv = reader.get(&key).expect("the namespaced key exists");
    assert!(reader.get(&format!("XLLM:MIX:{name}")).is_none());
    assert_eq!(
        parse_key("/prod/", &key),
        Some(RegistryKey::Instance(InstanceType::Mix, name.clone()))
    );
    let record = parse_instance(&name, &kv.value).unwrap();
    assert!(!record.mix_acting_prefill, "current_type 2 means acting as decode");
}

#[test]
fn loadmetrics_parse_and_follow_set_load() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(1);
    let opts =
        RegistrationOptions { write_loadmetrics: true, namespace: "ns".into(), ..options(&etcd) };
    let reg = Registration::start(&engine, opts).unwrap();
    let reader = EtcdReader::new(&etcd);
    let key = format!("/ns/XLLM:LOADMETRICS:{}", engine.instance_name());
    assert_eq!(parse_key("/ns/", &key), Some(RegistryKey::Load(engine.instance_name())));
    let load = |reader: &EtcdReader| {
        let kv = reader.get(&key)?;
        assert_eq!(kv.lease, 0, "LOADMETRICS has no lease");
        let parsed = parse_load_bytes(&kv.value).expect("kvdir parses the load");
        Some((parsed.waiting_requests_num, parsed.gpu_cache_usage_perc))
    };
    assert_eq!(load(&reader), Some((0, 0.0)));
    reg.set_load(5, 0.5);
    eventually("LOADMETRICS follows set_load", || load(&reader) == Some((5, 0.5)));
}

#[test]
fn heartbeats_carry_name_incarnation_load_and_token() {
    let etcd = etcd_endpoint();
    let engine = engine_with_http(1);
    let sink = HeartbeatSink::start(200);
    let opts = RegistrationOptions {
        heartbeat_to: Some(sink.addr()),
        heartbeat_interval: Duration::from_millis(100),
        internal_token: Some("secret".into()),
        ..options(&etcd)
    };
    let reg = Registration::start(&engine, opts).unwrap();
    reg.set_load(7, 0.25);
    let beat = sink.wait_for(|b| b.body["load_metrics"]["waiting_requests_num"] == 7);
    assert_eq!(beat.path, "/v1/internal/heartbeat");
    assert_eq!(beat.token.as_deref(), Some("secret"));
    assert_eq!(beat.body["name"], engine.instance_name());
    assert_eq!(beat.body["incarnation_id"], reg.incarnation_id());
    assert_eq!(beat.body["load_metrics"]["gpu_cache_usage_perc"], 0.25);
    eventually("status 200 recorded", || reg.last_heartbeat_status() == Some(200));
    sink.set_status(409);
    eventually("status 409 recorded", || reg.last_heartbeat_status() == Some(409));
    reg.pause();
    let before = sink.count();
    // The observation window itself (six heartbeat intervals): an absence cannot be polled for.
    std::thread::sleep(Duration::from_millis(600));
    assert!(sink.count() <= before + 1, "heartbeats stop while paused (one may be in flight)");
    reg.resume().unwrap();
    let resumed = sink.count();
    eventually("heartbeats resume", || sink.count() > resumed);
}

#[test]
fn registration_survives_an_etcd_restart() {
    let mut etcd = EtcdServer::private();
    let engine = engine_with_http(1);
    let reg =
        Registration::start(&engine, RegistrationOptions { ttl_s: 2, ..options(&etcd) }).unwrap();
    etcd.restart();
    let reader = EtcdReader::new(&etcd);
    eventually("the key is back after the restart", || reader.get(reg.key()).is_some());
    reader.delete(reg.key());
    eventually("the worker still re-puts a deleted key", || reader.get(reg.key()).is_some());
    etcd.stop();
    etcd.restart();
    let reader = EtcdReader::new(&etcd);
    eventually("the key is back after a stop and start", || reader.get(reg.key()).is_some());
}

#[test]
fn bad_registrations_fail_with_the_bad_value() {
    let plain = kvdir_sim::SimEngine::start(kvdir_sim::EngineConfig::default()).unwrap();
    let err = Registration::start(&plain, RegistrationOptions::default()).unwrap_err();
    assert!(err.to_string().contains("http_port = 0"), "{err}");
    let engine = engine_with_http(1);
    let nowhere =
        RegistrationOptions { etcd: "127.0.0.1:1".into(), ..RegistrationOptions::default() };
    let started = Instant::now();
    let err = Registration::start(&engine, nowhere).unwrap_err();
    assert!(matches!(err, SimError::Etcd { .. }), "{err}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    assert!(started.elapsed() < DEADLINE, "start gives up within its timeouts");
}

#[test]
fn the_binary_registers_its_engines_and_prints_derived_ports() {
    let etcd = etcd_endpoint();
    let port = {
        let probe = engine_with_http(2);
        probe.config().http_port
    };
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kvdir-sim"))
        .args([format!("--http_port={port}"), format!("--etcd_addr={}", etcd.endpoint)])
        .args(["--dp_size=2", "--etcd_namespace=demo", "--instance_type=1", "--duration_s=60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut child = KillOnDrop(Some(child));
    let name = format!("127.0.0.1:{port}");
    let key = format!("/demo/XLLM:PREFILL:{name}");
    let reader = EtcdReader::new(&etcd);
    eventually("the binary registers", || reader.get(&key).is_some());
    let record = parse_instance(&name, &reader.get(&key).unwrap().value).unwrap();
    assert_eq!((record.kind, record.dp_size), (InstanceType::Prefill, 2));
    // Written after the instance key, so an observer can see the key first.
    let load_key = format!("/demo/XLLM:LOADMETRICS:{name}");
    eventually("the binary writes LOADMETRICS", || reader.get(&load_key).is_some());
    assert_eq!(health(&name), 200);
    let mut child = child.0.take().expect("still running");
    child.kill().expect("kill the binary");
    let out = child.wait_with_output().expect("the binary ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (_, json) = stdout.split_once("kvdir config (static streams):\n").expect("config header");
    let config: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
    let stream = &config["streams"][1];
    assert_eq!(stream["instance_name"], name);
    assert_eq!(stream["endpoint"], format!("tcp://127.0.0.1:{}", u32::from(port) + 10001));
    assert_eq!(stream["replay_endpoint"], format!("tcp://127.0.0.1:{}", u32::from(port) + 30001));
    assert!(stdout.contains(&format!("registered {key}")), "{stdout}");
}

/// Kills the binary when a failed assertion ends the test before it does (it would otherwise
/// run on for its `--duration_s`).
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
