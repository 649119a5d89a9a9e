//! `kvdir-bench chat`: the OpenAI front door under a shared-prefix chat load, for issue #13's
//! benchmarks (proxy overhead by prompt size, kvdir CPU per request, CAR vs RR on TTFT and
//! cached-token share).
//!
//! A run ([`run`]), through the load tool's modules:
//! 1. writes the demo model (`kvdir_text::demo::write_model`) into a temporary directory;
//! 2. starts `--engines` simulated OpenAI engines serving it ([`super::fleet`], etcd port rule);
//! 3. unless `--direct`: starts the kvdir binary with the front door over the same model, the
//!    policy and a discovery config ([`super::kvdir`]), registers the engines in etcd under a
//!    private namespace and waits until every stream is synchronized and every instance has a
//!    load report ([`super::probe`]);
//! 4. sends the chat workload from `--clients` threads ([`load`]) to kvdir's
//!    `POST /v1/chat/completions`, or with `--direct` round-robin to the engines;
//! 5. reads kvdir's CPU time, tokenization histogram and RSS around the client phase and
//!    reports ([`report`]).
//!
//! Everything stops with the run: kvdir is killed, engines and registrations dropped, the model
//! directory removed. Errors are [`BenchError`]s.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvdir_text::TextModel;

use super::fleet::Fleet;
use super::http::Conn;
use super::kvdir::{cpu_seconds, metric, temp_dir, Kvdir, Rss};
use super::probe::Probe;
use super::{loadavg, BenchError, BenchOptions};
use kvdir_sim::OpenAiConfig;

pub mod flags;
pub mod load;
pub mod report;
pub mod siblings;

pub use flags::{chat_help, parse_chat_args, ChatCommand, ChatOptions, USER_TURN_TOKENS};
use load::{run_clients, Targets};
pub use load::{ChatStats, Workload};
pub use report::ChatReport;

/// Upper bound of one probe or metrics request.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The tokenization histogram of kvdir's front door.
const TOKENIZATION: &str = "kvdir_frontend_tokenization_seconds";

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the chat load described by `o` and returns its report.
pub fn run(o: &ChatOptions) -> Result<ChatReport, BenchError> {
    let loadavg_start = loadavg();
    let temp = TempDir(temp_dir());
    let dir = temp.0.join("model");
    let model = load_model(&dir)?;
    let openai = OpenAiConfig {
        prefill_us_per_token: o.prefill_us_per_token,
        decode_us_per_token: o.decode_us_per_token,
        serial_prefill: o.serial_prefill,
        max_tokens: o.max_tokens,
        ..OpenAiConfig::new(Arc::clone(&model), &o.served_model_name)
    };
    let b = o.bench_options(&dir);
    let mut fleet = Fleet::start_serving(&b, Some(&openai))?;
    let work = Workload::new(o, &model);
    let mut report = match o.direct {
        true => direct(o, &fleet, &work)?,
        false => {
            let mut kvdir = Kvdir::start(&b, &fleet.kvdir_config(&b))?;
            through_kvdir(o, &b, &mut fleet, &kvdir, &work).map_err(|e| kvdir.explain(e))?
        }
    };
    report.loadavg.0 = loadavg_start;
    Ok(report)
}

fn load_model(dir: &Path) -> Result<Arc<TextModel>, BenchError> {
    let failed = |e: kvdir_text::TextError| {
        BenchError::Kvdir(format!("the demo model in {}: {e}; check the temp dir", dir.display()))
    };
    kvdir_text::demo::write_model(dir).map_err(failed)?;
    Ok(Arc::new(TextModel::load(dir, None).map_err(failed)?))
}

/// The baseline: the requests round-robin straight to the engines.
fn direct(o: &ChatOptions, fleet: &Fleet, work: &Workload) -> Result<ChatReport, BenchError> {
    let addrs = fleet.engines.iter().map(|e| e.instance_name()).collect();
    let stats = run_clients(o, work, &Targets { addrs, direct: true })?;
    Ok(new_report(o, "direct to the engines (no kvdir)".to_string(), stats))
}

fn through_kvdir(
    o: &ChatOptions,
    b: &BenchOptions,
    fleet: &mut Fleet,
    kvdir: &Kvdir,
    work: &Workload,
) -> Result<ChatReport, BenchError> {
    fleet.register(b, &kvdir.addr)?;
    let conn = Conn::new(&kvdir.addr, o.kvdir.internal_api_token.clone(), PROBE_TIMEOUT);
    let mut probe = Probe::new(conn, fleet.streams());
    probe.wait_synchronized(true, o.kvdir.sync_timeout)?;
    let tokenization_before = tokenization(probe.conn());
    let cpu_before = kvdir.pid.and_then(cpu_seconds);
    let targets = Targets { addrs: vec![kvdir.addr.clone()], direct: false };
    let stats = run_clients(o, work, &targets)?;
    let cpu = kvdir.pid.and_then(cpu_seconds).zip(cpu_before).map(|(a, b)| a - b);
    let tokenization_after = tokenization(probe.conn());
    let pid = kvdir.pid.map_or(String::new(), |p| format!(" pid {p}"));
    let mut report = new_report(o, format!("through kvdir{pid} at {}", kvdir.addr), stats);
    report.kvdir_cpu = cpu;
    report.tokenization = tokenization_after
        .zip(tokenization_before)
        .map(|((s1, c1), (s0, c0))| (s1 - s0, c1.saturating_sub(c0)));
    report.rss = Some(Rss::read(kvdir.pid, probe.conn()));
    Ok(report)
}

/// `(sum seconds, count)` of kvdir's tokenization histogram; `None` when unreadable.
fn tokenization(conn: &mut Conn) -> Option<(f64, u64)> {
    let reply = conn.get("/metrics").ok().filter(|r| r.status == 200)?;
    let text = String::from_utf8_lossy(&reply.body);
    let sum = metric(&text, &format!("{TOKENIZATION}_sum"))?;
    let count = metric(&text, &format!("{TOKENIZATION}_count"))?;
    Some((sum, count as u64))
}

fn new_report(o: &ChatOptions, path: String, stats: ChatStats) -> ChatReport {
    let policy = match o.direct {
        true => String::new(),
        false => format!(", policy {}", super::replay::flags::policy_name(o.policy)),
    };
    let siblings = match o.siblings {
        1 => String::new(),
        k => format!(", {k} siblings per prompt sent at once"),
    };
    let rate = match o.rate > 0.0 {
        true => format!(", open loop at {} requests/s", o.rate),
        false => String::new(),
    };
    let serial = if o.serial_prefill { " (serial)" } else { "" };
    let setup = format!(
        "{} engines x {} DP, block {}, prefill {} µs/token{serial}, decode {} µs/token x {} tokens; {} \
         clients{rate}, {} requests max, {} system prompts{siblings}, {}; {path}{policy}",
        o.engines,
        o.dp_size,
        o.block_size,
        o.prefill_us_per_token,
        o.decode_us_per_token,
        o.max_tokens,
        o.clients,
        o.requests,
        o.system_prompts,
        if o.stream { "streaming" } else { "not streaming" },
    );
    ChatReport {
        setup,
        target_prompt_tokens: o.system_prompt_tokens + USER_TURN_TOKENS,
        stats,
        kvdir_cpu: None,
        tokenization: None,
        rss: None,
        loadavg: (String::new(), loadavg()),
        siblings: o.siblings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `--direct` run of 8 short requests to 2 engines, plus `flags`.
    fn direct_run(flags: &[&str]) -> ChatReport {
        let common = [
            "--etcd_addr=127.0.0.1:1",
            "--direct",
            "--engines=2",
            "--requests=8",
            "--prompt_tokens=300",
            "--decode_us_per_token=0",
            "--max_tokens=2",
        ];
        let args = common.iter().chain(flags).map(|a| a.to_string());
        let Ok(ChatCommand::Run(o)) = parse_chat_args(args) else { panic!("valid flags") };
        run(&o).expect("the run completes")
    }

    /// `--direct` needs no kvdir and no etcd traffic: the requests go round-robin to real
    /// engines over HTTP, and with as many engines as system prompts each engine sees one
    /// system prompt again and again, so it comes back cached.
    #[test]
    fn direct_requests_are_counted_and_repeated_system_prompts_come_back_cached() {
        let report = direct_run(&["--system_prompts=2", "--clients=2"]);
        let text = report.text();
        assert_eq!((report.served(), report.errors()), (8, 0), "{text}");
        assert_eq!(report.stats.instances.len(), 2, "{text}");
        assert!(report.stats.prompt_tokens >= 8 * 150, "{text}");
        assert!(report.stats.cached_tokens > 0, "{text}");
        assert_eq!((report.kvdir_cpu, report.tokenization), (None, None), "{text}");
        assert!(text.contains("not in the path (--direct)"), "{text}");
    }

    /// `--siblings`: groups of identical prompts sent at once, counted per group. Direct, the
    /// copies go round-robin, so each group of 4 splits 2 + 2 over the 2 engines.
    #[test]
    fn sibling_groups_are_sent_together_and_counted_by_their_most_used_instance() {
        let report = direct_run(&["--siblings=4", "--clients=1"]);
        let text = report.text();
        assert_eq!((report.served(), report.errors()), (8, 0), "{text}");
        let s = &report.stats;
        assert_eq!((s.sibling_groups, s.siblings_together), (2, 4), "{text}");
        assert_eq!(report.siblings_together_share(), Some(0.5));
        assert!(text.contains("siblings: 50.0% on their group's most used instance"), "{text}");
        assert_eq!(report.json()["siblings"]["groups"], 2);
    }
}
