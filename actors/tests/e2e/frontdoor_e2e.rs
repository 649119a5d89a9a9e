//! The OpenAI front door over real HTTP: its errors are OpenAI's error JSON with the right
//! status, its key is separate from the internal token, and without a tokenizer it says how to
//! turn it on while the internal API keeps working.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;
use kvdir::config::{Flags, FrontDoorFlags};
use reqwest::blocking::Client;
use serde_json::{json, Value};

/// A demo model directory named `name` (a BPE trained by kvdir-text, ChatML template), inside
/// a temporary directory that is removed when the returned guard drops.
fn demo_model(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join(name);
    kvdir_text::demo::write_model(&dir).expect("the demo model is written");
    (tmp, dir)
}

/// kvdir with no directory and no registry (no instances at all).
fn bare(flags: Flags) -> kvdir_service::Service {
    let flags = Flags { http_server_port: 0, etcd_addr: NO_ETCD.into(), ..flags };
    kvdir_service::Service::start(flags, None).expect("kvdir starts")
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// Status and JSON body of a POST to the front door.
fn post(base: &str, path: &str, key: Option<&str>, body: &[u8]) -> (u16, Value) {
    let mut req = client().post(format!("{base}{path}")).body(body.to_vec());
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let r = req.send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// `(type, code, param)` of an OpenAI error body.
fn error_of(body: &Value) -> (String, String, Value) {
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (s(&e["type"]), s(&e["code"]), e["param"].clone())
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let (_tmp, model) = demo_model("errors");
    let front = FrontDoorFlags {
        tokenizer_path: Some(model.clone()),
        api_key: Some("sk-test".into()),
        ..FrontDoorFlags::default()
    };
    let flags = Flags { front, max_request_bytes: 4096, ..Flags::default() };
    let svc = bare(flags);
    let base = format!("http://{}", svc.http_addr());
    let served = model.file_name().unwrap().to_string_lossy().to_string();
    let chat =
        json!({"model": served, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let path = "/v1/chat/completions";

    let (status, body) = post(&base, path, None, chat.as_bytes());
    assert_eq!((status, error_of(&body).0.as_str()), (401, "authentication_error"), "{body}");
    let (status, _) = post(&base, path, Some("sk-wrong"), chat.as_bytes());
    assert_eq!(status, 401);
    let key = Some("sk-test");

    let (status, body) = post(&base, path, key, b"{\"model\": ");
    assert_eq!((status, error_of(&body).0.as_str()), (400, "invalid_request_error"), "{body}");
    let (status, body) = post(&base, path, key, json!({"model": served}).to_string().as_bytes());
    assert_eq!((status, error_of(&body).2), (400, json!("messages")), "{body}");
    let big = json!({"model": served, "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let (status, body) = post(&base, path, key, big.to_string().as_bytes());
    assert_eq!((status, error_of(&body).1.as_str()), (413, "request_too_large"), "{body}");
    let other = json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = post(&base, path, key, other.to_string().as_bytes());
    assert_eq!((status, error_of(&body).1.as_str()), (404, "model_not_found"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&served), "{body}");

    // A valid request with no instance to send it to.
    let (status, body) = post(&base, path, key, chat.as_bytes());
    assert_eq!((status, error_of(&body).1.as_str()), (503, "no_instance"), "{body}");
    let prompt = json!({"model": served, "prompt": "once upon a time"}).to_string();
    let (status, _) = post(&base, "/v1/completions", key, prompt.as_bytes());
    assert_eq!(status, 503);

    // The model list, behind the same key; the internal API is not behind it.
    let models = client().get(format!("{base}/v1/models")).bearer_auth("sk-test").send().unwrap();
    let models: Value = serde_json::from_str(&models.text().unwrap()).unwrap();
    assert_eq!(models["data"][0]["id"], json!(served));
    assert_eq!(client().get(format!("{base}/v1/models")).send().unwrap().status().as_u16(), 401);
    assert_eq!(http(svc.http_addr(), "GET", "/v1/internal/streams", &[], b"").status, 200);

    // Every error is counted by status.
    let metrics = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    for status in ["401", "400", "413", "404", "503"] {
        let line = format!("kvdir_frontend_requests_total{{instance=\"\",status=\"{status}\"}}");
        assert!(metrics.contains(&line), "{line} missing from\n{metrics}");
    }
}

#[test]
fn without_a_tokenizer_the_front_door_says_how_to_turn_it_on() {
    let svc = bare(Flags::default());
    let base = format!("http://{}", svc.http_addr());
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (status, body) = post(&base, "/v1/chat/completions", None, chat.as_bytes());
    assert_eq!((status, error_of(&body).1.as_str()), (503, "front_door_not_configured"));
    assert!(body["error"]["message"].as_str().unwrap().contains("--tokenizer_path"), "{body}");
    let q = json!({"token_ids": [1, 2, 3]}).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], q.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_tokenizer_that_does_not_load_stops_the_start_with_its_path() {
    let front = FrontDoorFlags {
        tokenizer_path: Some(PathBuf::from("/nonexistent/model-dir")),
        ..FrontDoorFlags::default()
    };
    let flags = Flags { front, http_server_port: 0, etcd_addr: NO_ETCD.into(), ..Flags::default() };
    let err = kvdir_service::Service::start(flags, None).err().expect("the start fails");
    let text = err.to_string();
    assert!(text.contains("--tokenizer_path") && text.contains("/nonexistent/model-dir"), "{text}");
}
