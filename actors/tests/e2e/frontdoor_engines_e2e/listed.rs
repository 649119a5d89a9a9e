//! Engines listed by address without KV events, behind the front door: kvdir credits them
//! approximately from its own routing, until the credit's TTL.

use super::*;

/// An engine serving the demo model in vLLM's dialect (`/health`, `/metrics` with its process
/// start), listed by address without `events`: kvdir subscribes to nothing of it.
pub(super) fn listed_without_events(openai: &OpenAiConfig) -> (SimEngine, Value) {
    let engine = engine_on_free_port(1, |http_port| EngineConfig {
        http_port,
        block_size: B,
        device_capacity_blocks: 4096,
        dialect: kvdir_sim::Dialect::Vllm,
        openai: Some(openai.clone()),
        ..EngineConfig::default()
    });
    let url = format!("http://{}", engine.instance_name());
    let listing = json!({"url": url, "dialect": "vllm", "block_size": B, "model": MODEL});
    (engine, listing)
}

#[test]
fn a_listed_engine_without_events_is_credited_approximately_until_its_ttl() {
    let openai = costs(20, 0, 4);
    let (engines, listings): (Vec<_>, Vec<_>) =
        (0..2).map(|_| listed_without_events(&openai)).unzip();
    let config = json!({"engines": listings, "engine_poll_interval_ms": 100,
        "approximate_ttl_ms": 3000});
    let directory = kvdir::config::parse_config_file(&config.to_string()).expect("valid config");
    let (_tmp, dir) = model_dir();
    let front = FrontDoorFlags { tokenizer_path: Some(dir), ..FrontDoorFlags::default() };
    let flags = Flags { front, http_server_port: 0, etcd_addr: String::new(), ..Flags::default() };
    let svc = kvdir_service::Service::start(flags, Some(directory)).expect("kvdir starts");
    eventually("both engines known by their process, approximate, with a load", || {
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let list = inst["instances"].as_array().cloned().unwrap_or_default();
        let ready =
            |i: &Value| i["approximate_blocks"].is_u64() && i["waiting_requests_num"].is_u64();
        match list.iter().filter(|i| i["approximate"] == true && ready(i)).count() {
            2 => Ok(()),
            _ => Err(inst.to_string()),
        }
    });
    let streams = report(&svc);
    assert_eq!(streams["streams"].as_array().map(Vec::len), Some(0), "no streams: {streams}");

    // The first chat: nothing credited anywhere, and the answer says the credit is approximate.
    let system = long_system_prompt();
    let first = conversation(&system, "What is the capital of France?");
    let r = chat(&svc, &first, false);
    assert_eq!(r.status().as_u16(), 200);
    let holder = header(&r, "x-kvdir-instance");
    assert_eq!(header(&r, "x-kvdir-stream-state"), "approximate");
    assert_eq!(header(&r, "x-kvdir-cached-tokens"), "0");

    // Its blocks are now assumed cached on the engine that served it, and only there.
    let prompt = tokens_of(&first);
    let answer = query(&svc, &prompt);
    let whole = prompt.len() as u64 / u64::from(B) * u64::from(B);
    for m in &answer.matches {
        assert!(m.approximate && m.synchronized, "{m:?}");
        let want = if m.instance_name == holder { whole } else { 0 };
        assert_eq!(m.device_hit_tokens, want, "{m:?}");
    }

    // A load report taken while the first chat ran is replaced by an idle one (CAR at the
    // default lambda would leave a busier engine).
    eventually("every engine reporting an empty queue", || {
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let list = inst["instances"].as_array().cloned().unwrap_or_default();
        match list.iter().all(|i| i["waiting_requests_num"] == 0) {
            true => Ok(()),
            false => Err(inst.to_string()),
        }
    });
    // The second chat with that system prompt goes back to it, and the engine confirms the
    // credit: it reuses what kvdir assumed.
    let second = conversation(&system, "And the capital of Spain?");
    let r = chat(&svc, &second, false);
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(header(&r, "x-kvdir-instance"), holder, "back to the engine that served it");
    assert_eq!(header(&r, "x-kvdir-stream-state"), "approximate");
    let assumed = header(&r, "x-kvdir-cached-tokens");
    let body: Value = r.json().unwrap();
    let cached = &body["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(cached.as_u64() > Some(200), "the system prompt's blocks are reused: {body}");
    assert_eq!(assumed, cached.to_string(), "kvdir assumed what the engine reused");

    // The route answer marks the credit approximate on every rank.
    let routed = route(&svc, &tokens_of(&second)).expect("routed");
    let c = routed.candidates.iter().find(|c| c.name == holder).unwrap();
    assert!(c.kv_hit_ratio > Some(0.5) && c.dp_hits.iter().all(|h| h.approximate), "{c:?}");
    let json = serde_json::to_value(&routed).unwrap();
    assert!(json.to_string().contains("\"approximate\":true"), "{json}");

    // The credit lives its TTL from the latest request that used it, then expires.
    eventually("the approximate credit to expire after its TTL", || {
        let answer = query(&svc, &prompt);
        let m = find_entry(&answer, &holder, 0).cloned();
        match m {
            Some(m) if m.approximate && m.device_hit_tokens == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    drop(engines);
}
