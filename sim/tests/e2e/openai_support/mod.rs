//! Helpers for the OpenAI tests: the demo text model (trained once per test binary, in memory), engines serving it on free loopback HTTP ports, a blocking HTTP client, an
//! independent tokenization of chat requests, and polling with a deadline.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kvdir_sim::{EngineConfig, OpenAiConfig, SimEngine, SimError};
use kvdir_text::{demo, TextModel};
use serde_json::{json, Value};

/// Upper bound for anything that should happen promptly.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// Tokens per block of the test engines.
pub const B: u32 = 4;
/// The served model name.
pub const MODEL: &str = "sim-demo";

/// The demo model, written and loaded once per test binary.
pub fn model() -> Arc<TextModel> {
    static MODEL: OnceLock<Arc<TextModel>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| {
        // The model is held in memory; its directory goes when the closure returns.
        let dir = tempfile::tempdir().expect("a temporary directory");
        demo::write_model(dir.path()).expect("the demo model is written");
        Arc::new(TextModel::load(dir.path(), None).expect("the demo model loads"))
    }))
}

/// An OpenAI config for the demo model: no prefill or decode cost unless a test sets one.
pub fn openai() -> OpenAiConfig {
    OpenAiConfig {
        prefill_us_per_token: 0,
        decode_us_per_token: 0,
        max_tokens: 4,
        ..OpenAiConfig::new(model(), MODEL)
    }
}

/// An engine with `config`'s settings on a free HTTP port in 25000..29900 (derived ZeroMQ
/// ports +10000/+30000 free too), block size [`B`].
pub fn engine(config: EngineConfig) -> SimEngine {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2654435761) % 4000;
    for _attempt in 0..50 {
        let slot = (seed + NEXT.fetch_add(1, Ordering::Relaxed) * 8) % 4900;
        let http_port = 25000 + u16::try_from(slot).expect("below 4900");
        let config = EngineConfig {
            name: format!("oai-{http_port}"),
            http_port,
            block_size: B,
            ..config.clone()
        };
        match SimEngine::start(config) {
            Ok(engine) => return engine,
            Err(SimError::Bind { .. } | SimError::Http { .. }) => continue,
            Err(e) => panic!("the engine does not start: {e}"),
        }
    }
    panic!("no free HTTP port with free derived ports in 50 attempts");
}

/// An engine serving the demo model with `openai`.
pub fn serving(dp_size: u32, openai: OpenAiConfig) -> SimEngine {
    engine(EngineConfig { dp_size, openai: Some(openai), ..EngineConfig::default() })
}

/// A blocking client without proxies.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().no_proxy().timeout(DEADLINE).build().expect("a client")
}

/// A whole answer: status, a header's value, and the body as JSON (`Null` if it is not JSON).
pub struct Answer {
    pub status: u16,
    pub rank: Option<u32>,
    pub body: Value,
}

/// POSTs `body` (any text) to `path` of `engine`.
pub fn post(engine: &SimEngine, path: &str, body: &str) -> Answer {
    let url = format!("http://{}{path}", engine.instance_name());
    let response = client()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .expect("the engine answers");
    let status = response.status().as_u16();
    let rank = response
        .headers()
        .get(kvdir_sim::DP_RANK_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let text = response.text().expect("a body");
    Answer { status, rank, body: serde_json::from_str(&text).unwrap_or(Value::Null) }
}

/// A chat request body with a system prompt and a user message.
pub fn chat(system: &str, user: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    body
}

/// The prompt tokens of a chat body, computed here by rendering ChatML by hand and encoding it
/// with the tokenizer directly (not through the engine's code path).
pub fn chat_tokens(body: &Value) -> Vec<i32> {
    let mut text = String::new();
    for m in body["messages"].as_array().expect("messages") {
        let (role, content) = (m["role"].as_str().unwrap(), m["content"].as_str().unwrap());
        text.push_str(&format!("{}{role}\n{content}{}\n", demo::IM_START, demo::IM_END));
    }
    text.push_str(&format!("{}assistant\n", demo::IM_START));
    let ids = model().encode(&text, false).expect("encodes");
    ids.into_iter().map(|id| i32::try_from(id).unwrap()).collect()
}

/// `usage.prompt_tokens_details.cached_tokens` of an answer.
pub fn cached(answer: &Answer) -> u64 {
    answer.body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {}", answer.body))
}

/// Polls until a check holds (the workspace test kit's).
pub use kvdir_testkit::eventually;

/// A long system prompt: the first `lines` lines of the demo corpus.
pub fn system_prompt(lines: usize) -> String {
    demo::CORPUS.lines().take(lines).collect::<Vec<_>>().join(" ")
}
