//! The audit's counting and warning rules, and the usage tap on real-shaped answers.

use std::time::{Duration, Instant};

use super::*;
use crate::car::CacheState::{Approximate, Exact};

fn tokens(n: u64) -> Reported {
    Reported::Tokens(n)
}

#[test]
fn each_answer_counts_once_with_the_tokens_of_its_difference() {
    let mut audit = Audit::default();
    let now = Instant::now();
    for (credited, reported) in
        [(0, tokens(0)), (32, tokens(32)), (16, tokens(48)), (64, tokens(16))]
    {
        audit.record("a", (credited, Exact), reported, now);
    }
    audit.record("a", (16, Exact), Reported::Absent, now);
    let r = audit.report("a");
    let expected = AuditCounts {
        exact: 2,
        under: 1,
        over: 1,
        not_reported: 1,
        exact_tokens: 32,
        under_tokens: 32,
        over_tokens: 48,
    };
    assert_eq!(r.counts, expected);
    assert_eq!(audit.report("never-seen"), AuditReport::default());
    assert_eq!(Outcome::of(5, tokens(5)), Outcome::Exact);
}

#[test]
fn a_healthy_engine_raises_nothing() {
    let mut audit = Audit::default();
    let now = Instant::now();
    for i in 0..500 {
        // Mostly exact, now and then under (events that arrived late): no rule applies.
        let reported = if i % 10 == 0 { i + 16 } else { i };
        assert_eq!(audit.record("a", (i, Exact), tokens(reported), now), None);
    }
    let r = audit.report("a");
    assert_eq!((r.warning_kind, r.warning), (None, None));
    assert_eq!(r.counts.under, 50);
}

#[test]
fn zero_reuse_where_kvdir_credited_hits_warns_with_the_settings_to_check() {
    let mut audit = Audit::default();
    let now = Instant::now();
    let mut logged = Vec::new();
    for _ in 0..4 {
        logged.extend(audit.record("a", (64, Exact), tokens(0), now));
    }
    assert!(logged.is_empty(), "four answers are not yet repeatedly: {logged:?}");
    let w = audit.record("a", (64, Exact), tokens(0), now).expect("the fifth warns");
    assert_eq!(w.kind, WarningKind::ZeroReuse);
    for setting in
        ["block_size", "PYTHONHASHSEED", "hash_seed", "event endpoint", "5 of the last 5"]
    {
        assert!(w.message.contains(setting), "{setting} missing: {}", w.message);
    }
    assert_eq!(audit.report("a").warning_kind, Some(WarningKind::ZeroReuse));
    // Rate-limited: not again within `repeat`, again after it.
    assert_eq!(audit.record("a", (64, Exact), tokens(0), now + Duration::from_secs(59)), None);
    let later = audit.record("a", (64, Exact), tokens(0), now + Duration::from_secs(61));
    assert_eq!(later.map(|w| w.kind), Some(WarningKind::ZeroReuse));
    // Answers kvdir did not credit do not make it "repeatedly".
    let mut fresh = Audit::default();
    for _ in 0..50 {
        assert_eq!(fresh.record("b", (0, Exact), tokens(0), now), None);
    }
}

#[test]
fn an_engine_credited_approximately_is_pointed_at_the_approximate_settings_not_its_events() {
    let mut audit = Audit::default();
    let now = Instant::now();
    let warned: Vec<Warning> =
        (0..5).filter_map(|_| audit.record("a", (64, Approximate), tokens(0), now)).collect();
    let w = &warned[0];
    assert_eq!(w.kind, WarningKind::ZeroReuse);
    for setting in ["approximate_blocks_per_engine", "approximate_ttl_ms", "no KV events"] {
        assert!(w.message.contains(setting), "{setting} missing: {}", w.message);
    }
    assert!(!w.message.contains("PYTHONHASHSEED"), "no event settings: {}", w.message);
    let missed = (0..20).filter_map(|_| audit.record("b", (0, Approximate), tokens(48), now));
    let m = missed.last().expect("missed credit warns");
    assert_eq!(m.kind, WarningKind::MissedCredit);
    assert!(m.message.contains("raise approximate_ttl_ms"), "{}", m.message);
}

#[test]
fn stale_credit_above_the_share_after_the_minimum_sample_warns() {
    let rules = AuditRules::default();
    let mut audit = Audit::default();
    let now = Instant::now();
    // Two over-predictions in the first ten: a small sample, no warning.
    for i in 0..10 {
        let reported = if i < 2 { 8 } else { 32 };
        assert_eq!(audit.record("a", (32, Exact), tokens(reported), now), None);
    }
    let mut first = None;
    for i in 10..rules.min_sample {
        let reported = if i < 13 { 8 } else { 32 };
        first = first.or(audit.record("a", (32, Exact), tokens(reported), now));
    }
    let w = first.expect("5 of 20 over is above 10 %");
    assert_eq!(w.kind, WarningKind::StaleCredit);
    assert!(w.message.contains("5 of the last 20") && w.message.contains("removals"), "{w:?}");
    // The window forgets: a recovered engine clears the warning.
    for _ in 0..rules.window {
        audit.record("a", (32, Exact), tokens(32), now);
    }
    assert_eq!(audit.report("a").warning, None);
    assert_eq!(audit.report("a").counts.over, 5, "the counts since start stay");
}

#[test]
fn missed_credit_on_most_answers_warns_and_names_the_stream_state() {
    let mut audit = Audit::default();
    let now = Instant::now();
    let warned: Vec<Warning> =
        (0..20).filter_map(|_| audit.record("a", (0, Exact), tokens(48), now)).collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].kind, WarningKind::MissedCredit);
    assert!(warned[0].message.contains("unsynchronized"), "{}", warned[0].message);
}

#[test]
fn an_engine_without_cached_tokens_gets_one_hint_naming_the_flag() {
    let mut audit = Audit::default();
    let now = Instant::now();
    let hint = audit.record("a", (16, Exact), Reported::Absent, now).expect("a hint");
    assert_eq!(hint.kind, WarningKind::NotReported);
    assert!(hint.message.contains("--enable-prompt-tokens-details"), "{}", hint.message);
    let later = now + Duration::from_secs(3600);
    assert_eq!(audit.record("a", (16, Exact), Reported::Absent, later), None, "once per instance");
    assert_eq!(audit.report("a").warning_kind, Some(WarningKind::NotReported));
    assert_eq!(audit.report("a").counts.not_reported, 2);
}

fn sse_event(v: serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

fn token_chunk(text: &str) -> String {
    sse_event(serde_json::json!({"object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}], "usage": null}))
}

fn usage_chunk(cached: Option<u64>) -> String {
    let details = cached.map(|c| serde_json::json!({"cached_tokens": c}));
    sse_event(serde_json::json!({"object": "chat.completion.chunk", "choices": [],
        "usage": {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102,
                  "prompt_tokens_details": details}}))
}

/// Feeds `answer` cut every `step` bytes; what the client got and what the tap read.
fn through(tap: UsageTap, answer: &str, step: usize) -> (String, Reported) {
    let mut tap = tap;
    let mut client = Vec::new();
    for chunk in answer.as_bytes().chunks(step) {
        match tap.feed(chunk) {
            Pass::Whole => client.extend_from_slice(chunk),
            Pass::Part(p) => client.extend_from_slice(&p),
        }
    }
    let (flush, reported) = tap.finish();
    client.extend_from_slice(&flush);
    (String::from_utf8(client).unwrap(), reported)
}

#[test]
fn the_usage_chunk_is_read_and_stripped_however_the_stream_is_cut() {
    let body = [token_chunk("Hel"), token_chunk("lo"), usage_chunk(Some(48))].concat();
    let answer = format!("{body}data: [DONE]\n\n");
    let without = [token_chunk("Hel"), token_chunk("lo"), "data: [DONE]\n\n".into()].concat();
    for step in [1, 2, 3, 7, 50, 4096] {
        let (client, reported) = through(UsageTap::sse(true), &answer, step);
        assert_eq!((client.as_str(), reported), (without.as_str(), tokens(48)), "step {step}");
        let (client, reported) = through(UsageTap::sse(false), &answer, step);
        assert_eq!((client.as_str(), reported), (answer.as_str(), tokens(48)), "step {step}");
    }
    // CRLF framing, and a usage object without details.
    let crlf = answer.replace('\n', "\r\n");
    let (client, _) = through(UsageTap::sse(true), &crlf, 5);
    assert_eq!(client, without.replace('\n', "\r\n"));
    let bare = [token_chunk("x"), usage_chunk(None), "data: [DONE]\n\n".into()].concat();
    assert_eq!(through(UsageTap::sse(true), &bare, 9).1, Reported::Absent);
    // A stream that ends without a newline keeps its last bytes.
    let cut = format!("{}data: [DONE]", token_chunk("x"));
    assert_eq!(through(UsageTap::sse(true), &cut, 4).0, cut);
}

#[test]
fn a_chunk_of_whole_events_passes_as_it_is() {
    let mut tap = UsageTap::sse(true);
    assert_eq!(tap.feed(token_chunk("a").as_bytes()), Pass::Whole);
    assert_eq!(tap.feed(b"data: {\"partial"), Pass::Part(Vec::new()), "held to its newline");
    let rest = b"\": 1}\n\n";
    assert_eq!(tap.feed(rest), Pass::Part(b"data: {\"partial\": 1}\n\n".to_vec()));
}

#[test]
fn a_line_longer_than_the_limit_passes_uninspected() {
    let long = format!("data: {}\n\n", "x".repeat(MAX_LINE_BYTES + 10));
    let answer = format!("{long}{}", usage_chunk(Some(7)));
    let (client, reported) = through(UsageTap::sse(true), &answer, 4096);
    assert_eq!((client, reported), (long, tokens(7)));
}

#[test]
fn a_json_answer_reports_its_usage_whole_or_from_its_tail() {
    let answer = serde_json::json!({"choices": [{"message": {"content": "hi"}}],
        "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}})
    .to_string();
    assert_eq!(through(UsageTap::json(), &answer, 3), (answer.clone(), tokens(8)));
    let big = serde_json::json!({"choices": [{"message": {"content": "y".repeat(300_000)}}],
        "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
        "kv_transfer_params": null})
    .to_string();
    assert_eq!(through(UsageTap::json(), &big, 8192).1, tokens(4));
    let none = r#"{"choices": [], "usage": {"prompt_tokens": 9}}"#;
    assert_eq!(through(UsageTap::json(), none, 4).1, Reported::Absent);
}

#[test]
fn asking_for_usage_keeps_the_clients_body_and_adds_the_option() {
    let body = br#" {"model":"m","stream":true}"#;
    let asked = ask_for_usage(body, false).unwrap();
    assert_eq!(
        std::str::from_utf8(&asked).unwrap(),
        r#" {"stream_options":{"include_usage":true},"model":"m","stream":true}"#
    );
    let v: serde_json::Value = serde_json::from_slice(&asked).unwrap();
    assert_eq!(v["stream_options"]["include_usage"], true);
    let with = br#"{"model":"m","stream_options":{"include_usage":false,"x":1}}"#;
    let v: serde_json::Value = serde_json::from_slice(&ask_for_usage(with, true).unwrap()).unwrap();
    assert_eq!(v["stream_options"], serde_json::json!({"include_usage": true, "x": 1}));
    assert_eq!(
        ask_for_usage(b"{}", false).unwrap(),
        br#"{"stream_options":{"include_usage":true}}"#
    );
    assert_eq!(ask_for_usage(b"[1]", false), None);
}
