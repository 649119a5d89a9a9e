//! The HTTP contract of the query endpoint (protocol.md section 6) over real HTTP: readiness,
//! the internal token, strict input with errors that say what is wrong, and the body limit.

use crate::common::*;
use kvdir::config::Flags;
use serde_json::json;

const QUERY: &str = "/v1/internal/kv-cache/query";

fn token_flags() -> Flags {
    Flags {
        internal_api_token: Some("s3cret".into()),
        max_request_bytes: 4096,
        max_query_tokens: 100,
        ..Flags::default()
    }
}

#[test]
fn every_configured_stream_is_listed_as_soon_as_the_port_opens() {
    let eng = engine("ready", 2, 0);
    let svc = service(streams_of(&eng), json!({}));
    let r = query(&svc, &[1, 2, 3]);
    assert_eq!(r.input_tokens, 3);
    let names: Vec<(String, u32)> =
        r.matches.iter().map(|m| (m.instance_name.clone(), m.dp_rank)).collect();
    assert_eq!(names, [("ready".to_string(), 0), ("ready".to_string(), 1)]);
    let health = http(svc.http_addr(), "GET", "/health", &[], b"");
    assert_eq!((health.status, health.json()["status"].as_str()), (200, Some("ok")));
}

#[test]
fn the_internal_token_is_required_when_configured() {
    let eng = engine("auth", 1, 0);
    let svc = service_with(streams_of(&eng), json!({}), token_flags());
    let body = br#"{"token_ids":[1]}"#;
    let none = http(svc.http_addr(), "POST", QUERY, &[], body);
    assert_eq!(none.status, 401);
    assert_eq!(none.json()["error"], "missing or wrong X-Internal-Token header");
    let wrong = http(svc.http_addr(), "POST", QUERY, &[("X-Internal-Token", "s3cre")], body);
    assert_eq!(wrong.status, 401);
    let ok = http(svc.http_addr(), "POST", QUERY, &[("X-Internal-Token", "s3cret")], body);
    assert_eq!(ok.status, 200, "{}", ok.body);
    let streams = http(svc.http_addr(), "GET", "/v1/internal/streams", &[], b"");
    assert_eq!(streams.status, 401, "the streams report is internal too");
}

#[test]
fn bad_input_is_a_400_that_names_the_problem() {
    let eng = engine("input", 1, 0);
    let svc = service_with(streams_of(&eng), json!({}), token_flags());
    let auth = [("X-Internal-Token", "s3cret")];
    let cases: &[(&str, &str)] = &[
        ("{}", "token_ids is missing"),
        (
            r#"{"token_ids": "1 2 3"}"#,
            "invalid type: string \"1 2 3\", expected token_ids as an array of integers",
        ),
        (r#"{"token_ids": [1, -4]}"#, "token_ids[1] = -4 is outside 0..=2147483647"),
        (r#"{"token_ids": [2147483648]}"#, "token_ids[0] = 2147483648 is outside 0..=2147483647"),
        (r#"{"token_ids": [1.5]}"#, "token_ids[0] = 1.5 is not an integer"),
        (r#"{"token_ids": ["hello"]}"#, "is a string; token ids are integers (tokenize first)"),
        ("not json", "expected ident"),
    ];
    for (body, expected) in cases {
        let r = http(svc.http_addr(), "POST", QUERY, &auth, body.as_bytes());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(expected), "{body}: {msg}");
    }
    let many = json!({ "token_ids": (0..101).collect::<Vec<i32>>() }).to_string();
    let r = http(svc.http_addr(), "POST", QUERY, &auth, many.as_bytes());
    assert_eq!(r.status, 400);
    assert!(r.body.contains("more than the --max_query_tokens limit 100"), "{}", r.body);
}

#[test]
fn a_body_over_the_limit_is_a_413() {
    let eng = engine("size", 1, 0);
    let svc = service_with(streams_of(&eng), json!({}), token_flags());
    let big = format!(r#"{{"token_ids": [{}1]}}"#, "1, ".repeat(2000));
    let r = http(svc.http_addr(), "POST", QUERY, &[("X-Internal-Token", "s3cret")], big.as_bytes());
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"], "request body exceeds --max_request_bytes = 4096");
    let missing = http(svc.http_addr(), "GET", "/v1/nothing", &[], b"");
    assert_eq!(missing.status, 404);
    assert!(missing.json()["error"].as_str().unwrap().contains("GET /v1/nothing"));
}

/// The stage names of an answer's `Server-Timing` header, in order (none without the header).
pub fn timing_stages(head: &str) -> Vec<String> {
    let line = head.lines().find(|l| l.to_ascii_lowercase().starts_with("server-timing:"));
    let value = line.map_or("", |l| &l["server-timing:".len()..]);
    let names = value.split(',').filter_map(|p| p.split(';').next());
    names.map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect()
}

#[test]
fn a_query_answer_says_where_its_time_went() {
    let eng = engine("timing", 1, 0);
    let svc = service(streams_of(&eng), json!({}));
    let body = br#"{"token_ids": [1, 2, 3]}"#;
    let r = http(svc.http_addr(), "POST", QUERY, &[], body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(timing_stages(&r.head), ["body", "parse", "read", "handler"], "{}", r.head);
    // With the client's send time, the wait for the handler comes first.
    let sent = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let start = format!("t={}", sent.as_micros());
    let r = http(svc.http_addr(), "POST", QUERY, &[("X-Request-Start", &start)], body);
    assert_eq!(timing_stages(&r.head), ["wait", "body", "parse", "read", "handler"]);
    let bad = http(svc.http_addr(), "POST", QUERY, &[], b"{}");
    assert_eq!((bad.status, timing_stages(&bad.head).len()), (400, 0), "errors are not timed");
}
