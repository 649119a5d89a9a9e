//! The engine as an OpenAI-compatible server, over real loopback HTTP: prompts tokenized as
//! the engine's template says, cached prefixes reported as `cached_tokens`, the rank rule, the
//! KV events of served requests on ZeroMQ, and OpenAI error JSON for bad requests.

use crate::openai_support;

use crate::common::Subscriber;
use kvdir::wire::{EngineHash, Event, Tier};
use std::time::{Duration, Instant};

use kvdir_sim::{block_hashes, EngineConfig, HashMode, OpenAiConfig};
use openai_support::{
    cached, chat, chat_tokens, engine, model, openai, post, serving, system_prompt, B, MODEL,
};
use serde_json::{json, Value};

#[test]
fn the_same_chat_twice_hits_its_full_blocks_and_another_system_prompt_does_not() {
    let engine = serving(1, openai());
    let body = chat(&system_prompt(6), "What does the directory hold?", json!({}));
    let tokens = chat_tokens(&body);
    let first = post(&engine, "/v1/chat/completions", &body.to_string());
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        first.body["usage"]["prompt_tokens"],
        tokens.len(),
        "the engine tokenizes as ChatML"
    );
    assert_eq!(cached(&first), 0, "nothing is cached before the first request");
    let full_blocks = (tokens.len() as u64 / u64::from(B)) * u64::from(B);
    assert_eq!(engine.resident(0, &tokens).unwrap(), (full_blocks, 0), "the prompt was cached");

    let second = post(&engine, "/v1/chat/completions", &body.to_string());
    assert_eq!(second.status, 200, "{}", second.body);
    assert!(cached(&second) > 0);
    assert_eq!(cached(&second), full_blocks, "every full block of the prompt is a hit");

    // ChatML's `<|im_start|>system\n` is a prefix every chat shares; past it, nothing is.
    let other =
        chat("A different system prompt entirely.", "What does the directory hold?", json!({}));
    let shared = shared_full_blocks(&tokens, &chat_tokens(&other));
    assert!(shared < full_blocks / 2, "the test prompts share only the template's head");
    let third = post(&engine, "/v1/chat/completions", &other.to_string());
    assert_eq!((third.status, cached(&third)), (200, shared), "{}", third.body);
    let by_ids = json!({"prompt": (400..440).collect::<Vec<i32>>(), "max_tokens": 1});
    let fourth = post(&engine, "/v1/completions", &by_ids.to_string());
    assert_eq!((fourth.status, cached(&fourth)), (200, 0), "an unseen prompt has no hit");

    let usage = &second.body["usage"];
    assert_eq!(usage["completion_tokens"], 4);
    assert_eq!(usage["total_tokens"], tokens.len() + 4);
    assert_eq!(second.body["object"], "chat.completion");
    assert_eq!(second.body["model"], MODEL);
    let content = second.body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{}", second.body);
    assert_eq!(second.body["choices"][0]["finish_reason"], "length");
}

#[test]
fn the_rank_holding_the_longest_prefix_serves_and_ties_go_to_the_idle_lowest_rank() {
    let engine = serving(3, openai());
    let body = chat(&system_prompt(4), "Which rank am I on?", json!({}));
    let tokens = chat_tokens(&body);
    engine.process(2, &tokens).unwrap();
    let answer = post(&engine, "/v1/chat/completions", &body.to_string());
    assert_eq!(answer.rank, Some(2), "rank 2 holds the prompt");
    assert!(cached(&answer) > 0);

    let fresh = json!({"prompt": (400..440).collect::<Vec<i32>>()});
    let answer = post(&engine, "/v1/completions", &fresh.to_string());
    assert_eq!((answer.rank, cached(&answer)), (Some(0), 0), "a tie goes to the lowest rank");
}

/// Tokens in the full blocks two prompts share from their start.
fn shared_full_blocks(a: &[i32], b: &[i32]) -> u64 {
    let same = a.iter().zip(b).take_while(|(x, y)| x == y).count() as u64;
    same / u64::from(B) * u64::from(B)
}

#[test]
fn completions_take_text_with_special_tokens_or_token_ids() {
    let engine = serving(1, openai());
    let text = system_prompt(3);
    let ids = model().encode(&text, true).unwrap();
    let body = json!({"model": MODEL, "prompt": text, "max_tokens": 3});
    let first = post(&engine, "/v1/completions", &body.to_string());
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["object"], "text_completion");
    assert_eq!(first.body["usage"]["prompt_tokens"], ids.len());
    assert_eq!(first.body["usage"]["completion_tokens"], 3);
    assert!(first.body["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()));

    let by_ids = json!({"prompt": ids, "max_tokens": 1});
    let second = post(&engine, "/v1/completions", &by_ids.to_string());
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(cached(&second), (ids.len() as u64 / u64::from(B)) * u64::from(B));
}

#[test]
fn a_served_request_publishes_its_blocks_on_zeromq() {
    let engine = serving(1, openai());
    let sub = Subscriber::connect(&engine, 0);
    let body = chat(&system_prompt(2), "Publish me.", json!({}));
    let tokens = chat_tokens(&body);
    assert_eq!(post(&engine, "/v1/chat/completions", &body.to_string()).status, 200);
    let (seq, batch) = sub.recv_live();
    assert_eq!(seq, 0);
    let [Event::Stored(stored)] = batch.events.as_slice() else {
        panic!("one BlockStored expected: {:?}", batch.events)
    };
    let want: Vec<EngineHash> = block_hashes(B, &tokens)
        .into_iter()
        .map(|h| HashMode::U64.to_wire(h).canonical())
        .collect();
    assert_eq!(batch.hashes(stored.hashes), want.as_slice());
    assert_eq!(stored.tier, Tier::Device);
    assert_eq!(engine.published(0).unwrap().blocks, want.len() as u64);
}

#[test]
fn time_to_answer_pays_the_prefill_of_uncached_tokens_only() {
    let per_token = Duration::from_millis(5);
    let config = OpenAiConfig { prefill_us_per_token: per_token.as_micros() as u64, ..openai() };
    let engine = serving(1, config);
    let body = chat(&system_prompt(6), "How long does this take?", json!({})).to_string();
    let timed = || {
        let start = Instant::now();
        let answer = post(&engine, "/v1/chat/completions", &body);
        (start.elapsed(), answer)
    };
    let (cold, first) = timed();
    let prompt = first.body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cold >= per_token * prompt as u32, "{cold:?} for {prompt} uncached tokens");
    let (warm, second) = timed();
    let uncached = prompt - cached(&second);
    assert!(uncached < prompt / 4, "most of the prompt is cached: {}", second.body);
    assert!(warm < cold, "a cache hit answers faster: {warm:?} vs {cold:?}");
}

#[test]
fn with_serial_prefill_a_rank_prefills_one_request_at_a_time() {
    let per_token = Duration::from_millis(2);
    let config = OpenAiConfig {
        prefill_us_per_token: per_token.as_micros() as u64,
        serial_prefill: true,
        ..openai()
    };
    let engine = serving(1, config);
    // Three different prompts at once on one rank: the last answer waits for all three
    // prefills (each request pays for at least its own, and they do not overlap).
    let start = Instant::now();
    let answers: Vec<(Duration, u64)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..3)
            .map(|i| {
                let engine = &engine;
                scope.spawn(move || {
                    let body = chat(&format!("{i} {}", system_prompt(2)), "Hi", json!({}));
                    let answer = post(engine, "/v1/chat/completions", &body.to_string());
                    assert_eq!(answer.status, 200, "{}", answer.body);
                    let prompt = answer.body["usage"]["prompt_tokens"].as_u64().unwrap();
                    (start.elapsed(), prompt - cached(&answer))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let last = answers.iter().map(|a| a.0).max().unwrap();
    let uncached: u64 = answers.iter().map(|a| a.1).sum();
    assert!(last >= per_token * uncached as u32, "{last:?} for {uncached} tokens in turn");
}

#[test]
fn a_restarted_rank_serves_on_with_an_empty_cache_and_sequence_zero() {
    let engine = serving(1, openai());
    let body = chat(&system_prompt(2), "Before and after.", json!({})).to_string();
    assert_eq!(post(&engine, "/v1/chat/completions", &body).status, 200);
    assert!(cached(&post(&engine, "/v1/chat/completions", &body)) > 0);
    engine.restart(0).unwrap();
    let sub = Subscriber::connect(&engine, 0);
    let after = post(&engine, "/v1/chat/completions", &body);
    assert_eq!((after.status, cached(&after)), (200, 0), "the restart emptied the cache");
    assert_eq!(sub.recv_live().0, 0, "the first batch after a restart is sequence 0");
}

fn error_of(answer: &openai_support::Answer) -> (&str, &str) {
    let error = &answer.body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", answer.body);
    (error["type"].as_str().unwrap_or(""), error["code"].as_str().unwrap_or(""))
}

#[test]
fn bad_requests_get_openai_error_json_with_the_right_status() {
    let engine = serving(1, OpenAiConfig { max_request_bytes: 2048, ..openai() });
    let chat_path = "/v1/chat/completions";
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (chat_path, "{not json".into(), 400, "invalid_json"),
        (chat_path, "[1, 2]".into(), 400, "invalid_json"),
        (chat_path, json!({"model": MODEL}).to_string(), 400, "invalid_value"),
        (chat_path, json!({"messages": "hi"}).to_string(), 400, "invalid_value"),
        (chat_path, chat("s", "u", json!({"model": "other"})).to_string(), 404, "model_not_found"),
        (chat_path, chat("s", "u", json!({"max_tokens": 0})).to_string(), 400, "invalid_value"),
        (chat_path, chat("s", "u", json!({"stream": "yes"})).to_string(), 400, "invalid_value"),
        (chat_path, chat(&"x".repeat(4096), "u", json!({})).to_string(), 413, "request_too_large"),
        ("/v1/completions", json!({"prompt": [1, -2]}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"prompt": [999_999]}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"max_tokens": 2}).to_string(), 400, "invalid_value"),
        ("/v1/nothing", "{}".into(), 404, "not_found"),
    ];
    for (path, body, status, code) in cases {
        let answer = post(&engine, path, &body);
        assert_eq!(answer.status, status, "{path} {body}: {}", answer.body);
        assert_eq!(error_of(&answer).1, code, "{path} {body}");
    }
    let message = post(&engine, chat_path, "{}").body["error"]["message"].to_string();
    assert!(message.contains("messages"), "the message names the field: {message}");
    let models = openai_support::client()
        .get(format!("http://{}/v1/models", engine.instance_name()))
        .send()
        .unwrap();
    let models: Value = serde_json::from_str(&models.text().unwrap()).unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
}

#[test]
fn without_a_text_model_the_openai_routes_answer_503_and_health_still_200() {
    let engine = engine(EngineConfig::default());
    let answer = post(&engine, "/v1/chat/completions", &chat("s", "u", json!({})).to_string());
    assert_eq!(answer.status, 503);
    assert_eq!(error_of(&answer), ("service_unavailable_error", "model_not_loaded"));
    assert!(answer.body["error"]["message"].as_str().unwrap().contains("--tokenizer_path"));
    let health = openai_support::client()
        .get(format!("http://{}/health", engine.instance_name()))
        .send()
        .unwrap();
    assert_eq!(health.status(), 200);
    let config = EngineConfig { openai: Some(openai()), ..EngineConfig::default() };
    let problem = config.validate().unwrap_err().to_string();
    assert!(problem.contains("http_port = 0"), "{problem}");
}
