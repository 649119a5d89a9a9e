//! Routing to a DP rank: a simulated vLLM engine of two DP ranks, listed by address with its
//! KV events. vLLM's own balancer would alternate the ranks; kvdir names the rank that holds
//! the prompt in `X-data-parallel-rank`, the engine serves it there, the route answer names
//! the rank with each rank's score, and the credit is that rank's hit. A client's own rank
//! header is passed through unchanged.

use super::*;

/// A vLLM-dialect engine with `dp` ranks serving the demo model, and its listing.
fn listed_vllm(openai: &OpenAiConfig, dp: u32) -> (SimEngine, Value) {
    let engine = engine_on_free_port(dp, |http_port| EngineConfig {
        http_port,
        dp_size: dp,
        block_size: B,
        device_capacity_blocks: 4096,
        dialect: kvdir_sim::Dialect::Vllm,
        openai: Some(openai.clone()),
        ..EngineConfig::default()
    });
    let eps = engine.endpoints();
    let listing = json!({"name": "vllm-dp", "url": format!("http://{}", engine.instance_name()),
        "dialect": "vllm", "dp_size": dp, "block_size": B, "model": MODEL,
        "topic": engine.config().topic,
        "events": eps.iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        "replay": eps.iter().map(|e| e.replay.clone()).collect::<Vec<_>>()});
    (engine, listing)
}

/// A chat through kvdir, with the client's own rank header when `rank` is given.
fn chat_on(svc: &kvdir_service::Service, messages: &Value, rank: Option<&str>) -> Response {
    let body = json!({"model": MODEL, "messages": messages});
    let mut request = client().post(format!("http://{}/v1/chat/completions", svc.http_addr()));
    if let Some(rank) = rank {
        request = request.header("X-data-parallel-rank", rank);
    }
    request.json(&body).send().expect("kvdir answers")
}

/// `(kvdir's credit header, the engine's cached_tokens)` of an answer.
fn credit_and_reuse(r: Response) -> (u64, u64) {
    let credit = header(&r, "x-kvdir-cached-tokens").parse().unwrap();
    let body: Value = r.json().unwrap();
    (credit, body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap())
}

#[test]
fn the_same_prompt_goes_back_to_the_rank_that_holds_it_and_is_credited_its_hit() {
    let (engine, listing) = listed_vllm(&costs(0, 0, 2), 2);
    let config = json!({"engines": [listing], "engine_poll_interval_ms": 100});
    let directory = kvdir::config::parse_config_file(&config.to_string()).expect("valid config");
    let (_tmp, dir) = model_dir();
    let front = FrontDoorFlags { tokenizer_path: Some(dir), ..FrontDoorFlags::default() };
    let flags = Flags { front, http_server_port: 0, etcd_addr: String::new(), ..Flags::default() };
    let svc = kvdir_service::Service::start(flags, Some(directory)).expect("kvdir starts");
    eventually("both ranks synchronized and the engine loaded", || {
        let synced = query(&svc, &[]).matches.iter().filter(|m| m.synchronized).count();
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let loaded = inst["instances"][0]["waiting_requests_num"].is_u64();
        (synced == 2 && loaded).then_some(()).ok_or(format!("{synced} synchronized: {inst}"))
    });

    let messages = conversation(&long_system_prompt(), "Which rank holds me?");
    let tokens = tokens_of(&messages);
    let first = chat_on(&svc, &messages, None);
    assert_eq!(first.status().as_u16(), 200);
    let holder: u32 = header(&first, "x-kvdir-dp-rank").parse().expect("kvdir names the rank");
    let other = 1 - holder;
    assert!(engine.cached_tokens(holder, &tokens, None).unwrap() > 0, "served on rank {holder}");
    assert_eq!(engine.cached_tokens(other, &tokens, None).unwrap(), 0);
    eventually("the prompt's blocks known on its rank", || {
        let m = find_entry(&query(&svc, &tokens), "vllm-dp", holder).cloned();
        match m {
            Some(m) if m.device_hit_tokens > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // The route answer names the rank, with both ranks' scores.
    let routed = route(&svc, &tokens).expect("routed");
    assert_eq!(routed.dp_rank, Some(holder), "{routed:?}");
    let c = &routed.candidates[0];
    assert_eq!(c.rank_scores.len(), 2, "{c:?}");
    let (held, empty) = (&c.rank_scores[holder as usize], &c.rank_scores[other as usize]);
    assert!(held.kv_hit_ratio > 0.5 && empty.kv_hit_ratio == 0.0, "{c:?}");
    assert!(held.score < empty.score, "{c:?}");

    // Sent again, it lands on that rank (vLLM's balancer would send it to the other one), and
    // kvdir's credit is exactly what the engine reused there.
    let second = chat_on(&svc, &messages, None);
    assert_eq!(header(&second, "x-kvdir-dp-rank"), holder.to_string());
    assert_eq!(header(&second, "x-kvdir-stream-state"), "exact");
    let (credit, reused) = credit_and_reuse(second);
    assert!(reused > 0, "the engine reused the prompt's blocks");
    assert_eq!(credit, reused, "the serving rank's hit, exactly");
    assert_eq!(engine.cached_tokens(other, &tokens, None).unwrap(), 0, "never on the other rank");

    // A client's own rank header is passed through unchanged, and that rank is credited.
    let pinned = chat_on(&svc, &messages, Some(&other.to_string()));
    assert_eq!(pinned.status().as_u16(), 200);
    assert_eq!(header(&pinned, "x-kvdir-dp-rank"), other.to_string());
    assert_eq!(credit_and_reuse(pinned), (0, 0), "the client's rank holds nothing yet");
    assert!(
        engine.cached_tokens(other, &tokens, None).unwrap() > 0,
        "served where the client said"
    );
}
