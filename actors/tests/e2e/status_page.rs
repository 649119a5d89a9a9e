//! The status page (`GET /`) as a user sees it: the `kvdir --demo` binary with an internal
//! token, and headless Chromium loading the page and dumping the DOM its script has drawn.
//!
//! Chromium's `--virtual-time-budget` runs the page's timers fast but waits for network
//! fetches, so one `--dump-dom` shows the page after a few refreshes without real waiting. The
//! test needs Debian's `chromium` at `/usr/bin/chromium` and fails (never skips) without it.
//! Nothing sleeps for synchronisation: the service's own report is polled until it is filled,
//! and a dump that is not yet filled is retried until a deadline.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{request, spawn, Patience};
use serde_json::Value;

const CHROMIUM: &str = "/usr/bin/chromium";
const TOKEN: &str = "status-page-test-token";
/// The demo's engines and their DP sizes (actors/src/demo.rs).
/// DP sizes of the demo's three engines (named `127.0.0.1:<port>`), in name order.
const DP_SIZES: usize = 4;
/// How long the demo may take to fill.
const DEADLINE: Duration = Duration::from_secs(60);
/// How long the page may take to show a filled service (it refreshes every second).
const PAGE_DEADLINE: Duration = Duration::from_secs(20);
/// How long one Chromium run may take.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(30);
/// Chromium runs that may crash or hang before one is taken as a failure.
const CHROMIUM_TRIES: u32 = 3;
/// Blocks one demo request can add to a stream: a 16-block system prompt and up to 8 more.
const ONE_REQUEST_BLOCKS: u64 = 24;

/// (instance, DP rank) -> sequence -> (Device blocks, Host blocks), as the service reported.
type Observed = HashMap<(String, u32), BTreeMap<u64, (u64, u64)>>;

/// What one stream row of the page shows.
#[derive(Debug)]
struct Row {
    key: (String, u32),
    sequence: u64,
    device: u64,
    host: u64,
}

#[test]
fn the_status_page_shows_live_streams_residency_and_decisions() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing; install Debian chromium: apt-get install chromium \
         (this test renders the status page in headless Chromium and never skips)"
    );
    let token_flag = format!("--internal_api_token={TOKEN}");
    let args = ["--demo", "--demo_seconds=300", "--http_server_port=0", "--server_host=127.0.0.1"];
    let kv =
        spawn(&[&args[..], &[token_flag.as_str()]].concat(), "kvdir demo listening on http://");
    let addr = kv.addr.clone();
    let instances = wait_until_filled(&addr);
    the_page_is_static_and_the_data_needs_the_token(&addr);
    the_recent_decisions_are_bounded_and_newest_first(&addr);

    // Without the token the page says how to give it.
    let url = format!("http://{addr}/");
    dump_until(&url, |dom| {
        let ok = dom.contains(r#"id="status" data-state="unauthorized""#)
            && dom.contains("Set #token=&lt;the token&gt; in the URL");
        if ok {
            Ok(())
        } else {
            Err("no 401 message on the page".into())
        }
    });

    // With it, the page shows what the service reports.
    let recorder = Recorder::start(&addr);
    let shown =
        dump_until(&format!("{url}#token={TOKEN}"), |dom| check_filled_page(dom, &instances));
    let observed = recorder.stop();
    assert_matches_the_service(shown, &observed);
    the_page_shows_the_cache_audit_of_a_front_door_answer(&addr);
}

/// One chat through the front door: the instance that served it shows the service's audit
/// counts of that answer.
fn the_page_shows_the_cache_audit_of_a_front_door_answer(addr: &str) {
    let chat = r#"{"model": "kvdir-demo", "messages": [{"role": "user", "content": "Hi"}]}"#;
    let reply = request(addr, "POST", "/v1/chat/completions", None, Some(chat));
    assert_eq!(reply.status, 200, "{}", reply.body);
    let (name, audit) = Patience::new(DEADLINE).eventually("a cache audit of the answer", || {
        let listed = get_json(addr, "GET", "/v1/internal/instances");
        let audits = listed["cache_audit"].as_object().cloned().unwrap_or_default();
        audits.into_iter().next().ok_or_else(|| listed.to_string())
    });
    let counts = ["exact", "under", "over"].map(|k| audit[k].as_u64().unwrap_or(99));
    assert_eq!(counts.iter().sum::<u64>(), 1, "one audited answer: {audit}");
    let expected = format!(
        r#"<div class="audit" data-exact="{}" data-under="{}" data-over="{}" data-not-reported="0""#,
        counts[0], counts[1], counts[2]
    );
    let url = format!("http://{addr}/#token={TOKEN}");
    dump_until(&url, |dom| {
        let section =
            element(dom, &format!(r#"<div class="instance" data-instance="{name}">"#), "<table")
                .ok_or(format!("no section for {name}"))?;
        if section.contains(&expected) && section.contains("cache audit") {
            Ok(())
        } else {
            Err(format!("{name}'s section lacks {expected}: {section}"))
        }
    });
}

/// Each row shows the service's own (Device, Host) at the sequence the row shows; a sequence
/// the recorder missed must lie within a request's worth of its neighbours.
fn assert_matches_the_service(shown: Vec<Row>, observed: &Observed) {
    for Row { key, sequence, device, host } in shown {
        let seen = &observed[&key];
        if let Some(&pair) = seen.get(&sequence) {
            assert_eq!((device, host), pair, "{key:?} at sequence {sequence}");
            continue;
        }
        let below = seen.range(..sequence).next_back().map(|(_, d)| d.0);
        let above = seen.range(sequence..).next().map(|(_, d)| d.0);
        let (Some(lo), Some(hi)) = (below, above) else {
            panic!("{key:?}: page sequence {sequence} outside the observed {seen:?}")
        };
        let range = lo.min(hi).saturating_sub(ONE_REQUEST_BLOCKS)..=lo.max(hi) + ONE_REQUEST_BLOCKS;
        assert!(
            range.contains(&device),
            "{key:?}: page shows {device} Device blocks at sequence {sequence}, \
             the service {lo} and {hi} around it"
        );
    }
}

/// Polls the service until every demo stream is synchronized with Device blocks and more
/// decisions were made than the ring keeps; returns each instance with its DP size.
fn wait_until_filled(addr: &str) -> Vec<(String, u32)> {
    let matches = Patience::new(DEADLINE).eventually("the demo filled", || {
        let query = get_json(addr, "POST", "/v1/internal/kv-cache/query");
        let recent = get_json(addr, "GET", "/v1/internal/route/recent");
        let matches = query["matches"].as_array().cloned().unwrap_or_default();
        let filled = matches.len() == 4
            && matches
                .iter()
                .all(|m| m["synchronized"] == true && m["device_blocks"].as_u64() > Some(0));
        match filled && recent["total"].as_u64() > Some(20) {
            true => Ok(matches),
            false => Err(format!("{query} {recent}")),
        }
    });
    let mut instances: Vec<(String, u32)> = Vec::new();
    for m in &matches {
        let name = m["instance_name"].as_str().unwrap_or_default().to_string();
        match instances.iter_mut().find(|(n, _)| *n == name) {
            Some((_, dp)) => *dp += 1,
            None => instances.push((name, 1)),
        }
    }
    let ranks: u32 = instances.iter().map(|i| i.1).sum();
    assert_eq!((instances.len(), ranks as usize), (3, DP_SIZES), "{matches:?}");
    instances
}

fn get_json(addr: &str, method: &str, path: &str) -> Value {
    let body = (method == "POST").then_some(r#"{"token_ids":[]}"#);
    let reply = request(addr, method, path, Some(TOKEN), body);
    assert_eq!(reply.status, 200, "{method} {path}: {}", reply.body);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", reply.body))
}

/// `/` is served without the token and fetches nothing from elsewhere; the data needs it.
fn the_page_is_static_and_the_data_needs_the_token(addr: &str) {
    let page = request(addr, "GET", "/", None, None);
    assert_eq!(page.status, 200, "{}", page.head);
    let head = page.head.to_ascii_lowercase();
    assert!(head.contains("content-type: text/html; charset=utf-8"), "{head}");
    assert!(head.contains("default-src 'none'") && head.contains("connect-src 'self'"), "{head}");
    let outside: Vec<String> = page
        .body
        .match_indices("http")
        .map(|(i, _)| page.body[i..].chars().take(30).collect())
        .collect();
    assert!(
        outside.iter().all(|u| u.starts_with("http://www.w3.org/2000/svg")),
        "the page must not load anything from elsewhere: {outside:?}"
    );
    for external in [" src=", "@import", "url(", "<link rel=\"stylesheet"] {
        assert!(!page.body.contains(external), "the page must embed everything: {external}");
    }
    for path in ["/v1/internal/route/recent", "/v1/internal/streams"] {
        let reply = request(addr, "GET", path, None, None);
        assert_eq!(reply.status, 401, "{path} without a token: {}", reply.body);
    }
}

/// The ring keeps the last 20 decisions, newest first, with token counts but not tokens.
fn the_recent_decisions_are_bounded_and_newest_first(addr: &str) {
    let recent = get_json(addr, "GET", "/v1/internal/route/recent");
    let routes = recent["routes"].as_array().expect("routes");
    let total = recent["total"].as_u64().expect("total");
    assert_eq!((recent["capacity"].as_u64(), routes.len()), (Some(20), 20), "{recent}");
    let ids: Vec<u64> = routes.iter().filter_map(|r| r["id"].as_u64()).collect();
    assert!(ids[0] <= total && ids.windows(2).all(|w| w[0] > w[1]), "not newest first: {ids:?}");
    let times: Vec<u64> = routes.iter().filter_map(|r| r["unix_ms"].as_u64()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    for r in routes {
        assert!(r["input_tokens"].as_u64() > Some(0) && r.get("token_ids").is_none(), "{r}");
        assert_eq!(r["routed"]["policy"], "CAR", "{r}");
    }
}

/// Checks a dumped DOM; returns what each stream row shows.
fn check_filled_page(dom: &str, instances: &[(String, u32)]) -> Result<Vec<Row>, String> {
    if !dom.contains(r#"id="status" data-state="live""#) {
        return Err("status is not live".into());
    }
    if !dom.contains("Overload admission: off (--overload_ttft_ms).") {
        return Err("the overload line is missing".into());
    }
    let mut shown = Vec::new();
    for (name, dp_size) in instances.iter().map(|(n, d)| (n.as_str(), *d)) {
        if !dom.contains(&format!(r#"<div class="instance" data-instance="{name}">"#)) {
            return Err(format!("no section for {name}"));
        }
        let rows =
            (0..dp_size).map(|rank| stream_row(dom, name, rank)).collect::<Result<Vec<_>, _>>()?;
        let bar = element(dom, &format!(r#"<g class="bar" data-instance="{name}""#), "</g>")
            .ok_or(format!("no residency bar for {name}"))?;
        let device: u64 = rows.iter().map(|r| r.device).sum();
        if attr_numbers(bar, "data-blocks").first() != Some(&device) {
            return Err(format!(
                "the residency bar of {name} does not show {device} Device blocks: {bar}"
            ));
        }
        shown.extend(rows);
    }
    let decisions = dom.matches(r#"<li class="decision""#).count();
    let first =
        element(dom, r#"<li class="decision""#, "</li>").ok_or("no routing decision listed")?;
    let explained = first.contains(r#"data-policy="CAR" data-prefill="127.0.0.1:"#)
        && first.contains(r#"data-chosen="true""#);
    if !explained || !(1..=20).contains(&decisions) {
        return Err(format!("{decisions} decisions; the newest: {first}"));
    }
    Ok(shown)
}

/// The row of a stream, which must show it synchronized and with Device blocks, after one
/// initial sync and no recovery (the demo has no faults; periodic resyncs count apart).
fn stream_row(dom: &str, name: &str, rank: u32) -> Result<Row, String> {
    let start = format!(r#"<tr class="stream" data-instance="{name}" data-dp-rank="{rank}""#);
    let row = element(dom, &start, "</tr>").ok_or(format!("no row for {name} DP {rank}"))?;
    let number = |class: &str| cell(row, class).and_then(|t| t.parse::<u64>().ok());
    let (Some(seq), Some(device), Some(host)) =
        (number("sequence"), number("device-blocks"), number("host-blocks"))
    else {
        return Err(format!("{name} DP {rank}: no numbers in {row}"));
    };
    let synced =
        row.contains(r#"data-synchronized="true""#) && cell(row, "sync") == Some("synchronized");
    if !synced || device == 0 {
        return Err(format!("{name} DP {rank} is not synchronized with Device blocks: {row}"));
    }
    let syncs = (number("initial-syncs"), number("resyncs").is_some(), number("recoveries"));
    if syncs != (Some(1), true, Some(0)) {
        return Err(format!("{name} DP {rank}: (initial syncs, resyncs, recoveries) {row}"));
    }
    Ok(Row { key: (name.to_string(), rank), sequence: seq, device, host })
}

/// The markup from `start` to the first `end` after it.
fn element<'a>(dom: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let at = dom.find(start)?;
    let len = dom[at..].find(end)? + end.len();
    Some(&dom[at..at + len])
}

/// The text of the `<td>` whose class list holds `class`.
fn cell<'a>(row: &'a str, class: &str) -> Option<&'a str> {
    row.split(r#"<td class=""#).skip(1).find_map(|td| {
        let (classes, rest) = td.split_once('"')?;
        let text = rest.strip_prefix('>')?.split('<').next()?;
        classes.split(' ').any(|c| c == class).then_some(text)
    })
}

fn attr_numbers(markup: &str, attr: &str) -> Vec<u64> {
    let pat = format!(r#"{attr}=""#);
    markup.split(&pat).skip(1).filter_map(|s| s.split('"').next()?.parse().ok()).collect()
}

/// Dumps the page until `check` passes; panics with the reason and the DOM at the deadline.
/// A Chromium run that crashes or hangs (it sometimes does on a loaded machine, before it has
/// loaded anything) is tried again, at most [`CHROMIUM_TRIES`] times in all.
fn dump_until<T>(url: &str, check: impl Fn(&str) -> Result<T, String>) -> T {
    let deadline = Instant::now() + PAGE_DEADLINE;
    let mut failures = 0;
    loop {
        let dom = match dump_dom(url) {
            Ok(dom) => dom,
            Err(e) => {
                failures += 1;
                assert!(failures < CHROMIUM_TRIES, "{e}");
                continue;
            }
        };
        match check(&dom) {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => {
                let dom: String = dom.chars().take(6000).collect();
                panic!("{url}: {e}\n--- the DOM Chromium dumped ---\n{dom}")
            }
            Err(_) => {}
        }
    }
}

/// One headless Chromium run with a fresh profile; the DOM after 3 s of virtual time, or why
/// Chromium gave none.
fn dump_dom(url: &str) -> Result<String, String> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let profile =
        std::env::temp_dir().join(format!("kvdir-chromium-{}-{nanos}", std::process::id()));
    let mut child = Command::new(CHROMIUM)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=3000", "--dump-dom", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {CHROMIUM}: {e}; apt-get install chromium"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let chromium_deadline = Instant::now() + CHROMIUM_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > chromium_deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20)); // poll interval, under the deadline
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let _ = std::fs::remove_dir_all(&profile);
    match status {
        Some(s) if s.success() => Ok(out),
        _ => Err(format!("chromium on {url} failed or hung ({status:?}):\n{err}")),
    }
}

/// Records every (sequence, Device, Host) the service reports while the page is dumped.
struct Recorder {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Observed>,
}

impl Recorder {
    fn start(addr: &str) -> Recorder {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, addr) = (Arc::clone(&stop), addr.to_string());
        let thread = std::thread::spawn(move || {
            let mut seen = Observed::new();
            while !flag.load(Ordering::Acquire) {
                let query = get_json(&addr, "POST", "/v1/internal/kv-cache/query");
                for m in query["matches"].as_array().into_iter().flatten() {
                    let key = (
                        m["instance_name"].as_str().unwrap_or("").to_string(),
                        m["dp_rank"].as_u64().unwrap_or(0) as u32,
                    );
                    let n = |f: &str| m[f].as_u64().unwrap_or(0);
                    seen.entry(key)
                        .or_default()
                        .insert(n("sequence"), (n("device_blocks"), n("host_blocks")));
                }
                std::thread::sleep(Duration::from_millis(20)); // sampling interval
            }
            seen
        });
        Recorder { stop, thread }
    }

    fn stop(self) -> Observed {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("the recorder panicked")
    }
}
