//! Engines that announce themselves (`kv_events_bind.announce`): no engine is listed; an
//! engine publishing under llm-d's topic `kv@<ip>:<port>@<model>` from an allowed address is
//! listed by kvdir (`source: announce`), replayed from `replay_port` on its host and credited;
//! a topic of an address outside the allow list stays unknown (and kvdir never calls it), and
//! so does a second engine on the same host (one replay port a host); an announced engine that
//! fails its polls for `drop_after_ms` is dropped.

use super::*;

#[test]
fn an_engine_announced_by_its_topic_is_listed_credited_and_dropped_when_gone() {
    let port = free_ports(1);
    let replay_port = free_ports(1);
    let http = TestEngine::start();
    http.set(|s| s.start_time = None); // as vLLM with several API servers: from its events
    let ctx = zmq::Context::new();
    let topic = format!("kv@127.0.0.1:{}@kvdir-demo", http.port);
    let engine = Rank::with_replay(&ctx, port, &topic, &format!("tcp://127.0.0.1:{replay_port}"));
    let stranger = Rank::connect(&ctx, port, "kv@10.11.12.13:8000@kvdir-demo", 0);
    let early = prompt(1, 2);
    engine.store(&early); // before kvdir listens: only the history brings it
    let config = json!({
        "kv_events_bind": {"endpoint": format!("tcp://127.0.0.1:{port}"),
            "announce": {"allow": ["127.0.0.0/8"], "replay_port": replay_port, "block_size": B,
                         "drop_after_ms": 1000}},
        "engine_poll_interval_ms": 100,
    });
    let file = parse_config_file(&config.to_string()).expect("a valid config");
    let svc = Service::start(flags(), Some(file)).expect("kvdir starts");
    engine.wait_subscribed();
    stranger.wait_subscribed();
    let name = format!("127.0.0.1:{}", http.port);
    let later = prompt(50, 3);
    engine.store(&later); // announces the engine: its stream replays both batches
    stranger.store(&prompt(90, 1));
    let s = live(&svc, &name, 0);
    assert_eq!(s["replay_endpoint"], format!("tcp://127.0.0.1:{replay_port}"));
    credits(&svc, &name, 0, &early, 2 * B as u64);
    credits(&svc, &name, 0, &later, 3 * B as u64);
    let instances = http_json(&svc, "/v1/internal/instances");
    let list = instances["instances"].as_array().unwrap();
    let listed: Vec<&str> = list.iter().filter_map(|i| i["name"].as_str()).collect();
    assert_eq!(listed, [name.as_str()], "the stranger is not listed: {instances}");
    assert_eq!(list[0]["engine"]["source"], "announce");
    assert_eq!(list[0]["engine"]["model"], "kvdir-demo");
    let bind = report(&svc)["bind"].clone();
    let unknown = bind["unknown_topics"].to_string();
    assert!(unknown.contains("10.11.12.13"), "counted as unknown: {bind}");
    // A second engine on the same host: announce gives a host one replay port, so it is
    // refused (a WARN says to list it) rather than given the first one's replay endpoint.
    let twin = TestEngine::start();
    let twin_topic = format!("kv@127.0.0.1:{}@kvdir-demo", twin.port);
    let twin_rank = Rank::connect(&ctx, port, &twin_topic, 0);
    twin_rank.wait_subscribed();
    let unknown = |svc: &Service| report(svc)["bind"]["unknown_messages"].as_u64().unwrap_or(0);
    let before = unknown(&svc);
    twin_rank.store(&prompt(80, 1));
    eventually("the twin's message read", || unknown(&svc) > before);
    // Two more polls of the first engine: the announcement has had its tick.
    let polls = |svc: &Service| {
        let i = http_json(svc, "/v1/internal/instances");
        i["instances"][0]["engine"]["polls"].as_u64().unwrap_or(0)
    };
    let seen = polls(&svc);
    eventually("two poll ticks", || polls(&svc) >= seen + 2);
    let after = http_json(&svc, "/v1/internal/instances");
    assert_eq!(after["instances"].as_array().map(Vec::len), Some(1), "{after}");

    http.set(|s| s.healthy = false);
    eventually("the engine dropped after failing its polls", || {
        let i = http_json(&svc, "/v1/internal/instances");
        match i["instances"].as_array().map(Vec::len) {
            Some(0) => Ok(()),
            _ => Err(i.to_string()),
        }
    });
    // Back, it announces itself again with its next batch.
    http.set(|s| s.healthy = true);
    engine.store(&prompt(70, 1));
    live(&svc, &name, 0);
}

fn http_json(svc: &Service, path: &str) -> Value {
    http(svc.http_addr(), "GET", path, &[], b"").json()
}
