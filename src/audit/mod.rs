//! The cache-truth audit: for every request the front door forwards, the prompt tokens kvdir
//! credited the chosen instance with (its exact credit,
//! [`crate::car::CandidateReport::cached_tokens`]) against what the engine says it reused (`usage.prompt_tokens_details.cached_tokens`, read by
//! [`UsageTap`]).
//!
//! Each answer has one [`Outcome`]: `exact` (the same), `under` (the engine reused more than
//! kvdir credited: credit missed), `over` (kvdir credited more than the engine reused: stale
//! credit) or `not_reported` (a complete answer without `cached_tokens`). [`Audit`] keeps, per
//! instance, the counts and tokens of each since start, and the last [`AuditRules::window`]
//! reported answers, which the warning rules read:
//!
//! - [`WarningKind::ZeroReuse`]: the engine reported 0 on at least `min_zero` answers kvdir had
//!   credited, and on more than half of them (a block size, hash or event endpoint mismatch);
//! - [`WarningKind::StaleCredit`]: over-predictions are more than `stale_share` of the window
//!   (at least `min_sample` answers);
//! - [`WarningKind::MissedCredit`]: under-predictions are at least `missed_share` of the window
//!   (kvdir gives little or nothing where the engine reuses: an unsynchronized stream);
//! - [`WarningKind::NotReported`]: the latest complete answer had no `cached_tokens`.
//!
//! Invariants: an instance holds at most one current warning, the first of that list that
//! applies; [`Audit::record`] returns a warning to log at most once per `repeat` per instance
//! and kind, and `NotReported` once per instance ever. Time is passed in; nothing here sleeps.

mod usage;

#[cfg(test)]
mod tests;

pub use usage::{ask_for_usage, Pass, Reported, UsageTap, MAX_LINE_BYTES};

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::car::CacheState;

/// How one answer's reported cached tokens compare with kvdir's credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The engine reused exactly what kvdir credited.
    Exact,
    /// The engine reused more than kvdir credited.
    Under,
    /// kvdir credited more than the engine reused (stale credit).
    Over,
    /// The answer had no `usage.prompt_tokens_details.cached_tokens`.
    NotReported,
}

impl Outcome {
    /// Every outcome, in the order metrics list them.
    pub const ALL: [Outcome; 4] =
        [Outcome::Exact, Outcome::Under, Outcome::Over, Outcome::NotReported];

    /// The outcome of an answer reporting `reported` for a credit of `credited` tokens.
    pub fn of(credited: u64, reported: Reported) -> Outcome {
        match reported {
            Reported::Absent => Outcome::NotReported,
            Reported::Tokens(r) if r == credited => Outcome::Exact,
            Reported::Tokens(r) if r > credited => Outcome::Under,
            Reported::Tokens(_) => Outcome::Over,
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Exact => "exact",
            Outcome::Under => "under",
            Outcome::Over => "over",
            Outcome::NotReported => "not_reported",
        }
    }
}

/// An instance's audited answers since start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCounts {
    /// Answers whose reported cached tokens equal kvdir's credit.
    pub exact: u64,
    /// Answers where the engine reused more than kvdir credited.
    pub under: u64,
    /// Answers where kvdir credited more than the engine reused.
    pub over: u64,
    /// Complete answers without `cached_tokens`.
    pub not_reported: u64,
    /// Cached tokens of the exact answers.
    pub exact_tokens: u64,
    /// Tokens the engine reused beyond kvdir's credit, summed over the under answers.
    pub under_tokens: u64,
    /// Tokens kvdir credited beyond what the engine reused, summed over the over answers.
    pub over_tokens: u64,
}

impl AuditCounts {
    /// The answers and tokens of `outcome` (tokens are 0 for `not_reported`).
    pub fn get(&self, outcome: Outcome) -> (u64, u64) {
        match outcome {
            Outcome::Exact => (self.exact, self.exact_tokens),
            Outcome::Under => (self.under, self.under_tokens),
            Outcome::Over => (self.over, self.over_tokens),
            Outcome::NotReported => (self.not_reported, 0),
        }
    }

    fn add(&mut self, credited: u64, reported: Reported) -> Outcome {
        let outcome = Outcome::of(credited, reported);
        let r = match reported {
            Reported::Tokens(r) => r,
            Reported::Absent => 0,
        };
        let mut untracked = 0;
        let (answers, tokens, n) = match outcome {
            Outcome::Exact => (&mut self.exact, &mut self.exact_tokens, r),
            Outcome::Under => (&mut self.under, &mut self.under_tokens, r - credited),
            Outcome::Over => (&mut self.over, &mut self.over_tokens, credited - r),
            Outcome::NotReported => (&mut self.not_reported, &mut untracked, 0),
        };
        *answers += 1;
        *tokens += n;
        outcome
    }
}

/// Why an instance's audit calls for an operator's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// The engine reports 0 cached tokens where kvdir credited hits, repeatedly.
    ZeroReuse,
    /// kvdir credits more than the engine reuses too often.
    StaleCredit,
    /// The engine reuses more than kvdir credits most of the time.
    MissedCredit,
    /// The engine does not report cached tokens.
    NotReported,
}

impl WarningKind {
    /// Every kind, most specific first (the order in which they are checked).
    pub const ALL: [WarningKind; 4] = [
        WarningKind::ZeroReuse,
        WarningKind::StaleCredit,
        WarningKind::MissedCredit,
        WarningKind::NotReported,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::ZeroReuse => "zero_reuse",
            WarningKind::StaleCredit => "stale_credit",
            WarningKind::MissedCredit => "missed_credit",
            WarningKind::NotReported => "not_reported",
        }
    }

    /// The likely causes and the settings to check, for an instance credited from its KV events,
    /// or from kvdir's own routing when `approximate` (an engine without KV events).
    pub fn cause(self, approximate: bool) -> &'static str {
        match (self, approximate) {
            (WarningKind::ZeroReuse | WarningKind::StaleCredit, true) => {
                "kvdir credits this engine approximately (it publishes no KV events) and assumes \
                 it keeps more than it does: set approximate_blocks_per_engine to at most the \
                 engine's cache size in blocks, lower approximate_ttl_ms, or give the engine a \
                 KV event endpoint for exact credit"
            }
            (WarningKind::MissedCredit, true) => {
                "kvdir credits this engine approximately (it publishes no KV events) and sees \
                 only what it routed there itself: other routers or clients also send it \
                 prompts, or it keeps blocks longer than approximate_ttl_ms; raise \
                 approximate_ttl_ms, or give the engine a KV event endpoint for exact credit"
            }
            (kind, _) => kind.exact_cause(),
        }
    }

    fn exact_cause(self) -> &'static str {
        match self {
            WarningKind::ZeroReuse => {
                "its cache does not hold what its KV events announce: check that kvdir's \
                 block_size equals the engine's (vLLM --block-size), that the engine hashes as \
                 kvdir expects (the stream's hash_seed; vLLM: the same PYTHONHASHSEED and \
                 --prefix-caching-hash-algo everywhere), that prefix caching is on, and that the \
                 event endpoint configured for this instance is this engine's own"
            }
            WarningKind::StaleCredit => {
                "kvdir credits blocks the engine no longer holds: its removals do not reach \
                 kvdir (check the event endpoint and /v1/internal/streams for gaps and dropped \
                 messages), or block_size or the hash settings (hash_seed, PYTHONHASHSEED) \
                 differ from the engine's"
            }
            WarningKind::MissedCredit => {
                "kvdir's view of this engine lacks blocks it holds: check /v1/internal/streams \
                 for an unsynchronized stream (its error names the cause, for example a \
                 block_size that differs from the engine's), that the engine publishes KV \
                 events to the configured endpoint, and that kvdir renders the same chat \
                 template as the engine"
            }
            WarningKind::NotReported => {
                "the engine's answers carry no usage.prompt_tokens_details.cached_tokens, so \
                 kvdir cannot check its credit: start vLLM with --enable-prompt-tokens-details \
                 (SGLang: --enable-cache-report)"
            }
        }
    }
}

/// The thresholds of the warning rules.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRules {
    /// Reported answers kept per instance for the rules.
    pub window: usize,
    /// Reported answers in the window before the share rules apply.
    pub min_sample: usize,
    /// `StaleCredit` when over-predictions are more than this share of the window.
    pub stale_share: f64,
    /// `MissedCredit` when under-predictions are at least this share of the window.
    pub missed_share: f64,
    /// `ZeroReuse` needs at least this many credited answers that reported 0.
    pub min_zero: usize,
    /// The same warning is logged again for an instance only after this long.
    pub repeat: Duration,
}

impl Default for AuditRules {
    /// A window of 100, at least 20 answers, stale credit above 10 %, missed credit from 50 %,
    /// 5 zero answers, a warning per instance and kind at most once a minute.
    fn default() -> Self {
        AuditRules {
            window: 100,
            min_sample: 20,
            stale_share: 0.10,
            missed_share: 0.50,
            min_zero: 5,
            repeat: Duration::from_secs(60),
        }
    }
}

/// A warning to log now.
#[derive(Debug, Clone, PartialEq)]
pub struct Warning {
    /// Which rule.
    pub kind: WarningKind,
    /// What was seen, with the likely cause.
    pub message: String,
}

/// What `GET /v1/internal/instances` shows of one instance's audit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditReport {
    /// The counts since start.
    #[serde(flatten)]
    pub counts: AuditCounts,
    /// The rule that applies now, if any.
    pub warning_kind: Option<WarningKind>,
    /// What it saw and the likely cause.
    pub warning: Option<String>,
}

/// One instance's audit.
#[derive(Debug, Clone, Default)]
struct InstanceAudit {
    counts: AuditCounts,
    /// `(credited, reported)` of the latest reported answers, oldest first.
    window: VecDeque<(u64, u64)>,
    /// Whether the latest complete answer reported nothing.
    last_absent: bool,
    /// Whether the latest answer's credit was approximate (an engine without KV events).
    approximate: bool,
    logged: BTreeMap<WarningKind, Instant>,
}

impl InstanceAudit {
    fn record(&mut self, rules: &AuditRules, credit: (u64, CacheState), reported: Reported) {
        let credited = credit.0;
        self.approximate = credit.1 == CacheState::Approximate;
        self.counts.add(credited, reported);
        self.last_absent = reported == Reported::Absent;
        if let Reported::Tokens(r) = reported {
            if self.window.len() == rules.window.max(1) {
                self.window.pop_front();
            }
            self.window.push_back((credited, r));
        }
    }

    /// The first rule that applies now, with its message.
    fn warning(&self, rules: &AuditRules) -> Option<Warning> {
        let n = self.window.len();
        let count = |f: fn(&(u64, u64)) -> bool| self.window.iter().filter(|s| f(s)).count();
        let credited = count(|(c, _)| *c > 0);
        let zero = count(|(c, r)| *c > 0 && *r == 0);
        let (over, under) = (count(|(c, r)| c > r), count(|(c, r)| r > c));
        let share = |k: usize| k as f64 / n.max(1) as f64;
        let sampled = n >= rules.min_sample.max(1);
        let (kind, seen) = if zero >= rules.min_zero.max(1) && zero * 2 > credited {
            let seen = format!(
                "the engine reported 0 cached tokens on {zero} of the last {credited} answers \
                 kvdir credited with cached tokens"
            );
            (WarningKind::ZeroReuse, seen)
        } else if sampled && share(over) > rules.stale_share {
            let seen = format!(
                "kvdir credited more cached tokens than the engine reused on {over} of the last \
                 {n} answers"
            );
            (WarningKind::StaleCredit, seen)
        } else if sampled && share(under) >= rules.missed_share {
            let seen = format!(
                "the engine reused more cached tokens than kvdir credited on {under} of the last \
                 {n} answers"
            );
            (WarningKind::MissedCredit, seen)
        } else if self.last_absent {
            (WarningKind::NotReported, "not reported".to_string())
        } else {
            return None;
        };
        let message = match kind {
            WarningKind::NotReported => kind.cause(self.approximate).to_string(),
            _ => format!("{seen}; {}", kind.cause(self.approximate)),
        };
        Some(Warning { kind, message })
    }

    /// Whether a warning of `kind` is due in the log at `now`; marks it logged.
    fn due(&mut self, rules: &AuditRules, kind: WarningKind, now: Instant) -> bool {
        let due = match self.logged.get(&kind) {
            None => true,
            Some(_) if kind == WarningKind::NotReported => false,
            Some(at) => now.saturating_duration_since(*at) >= rules.repeat,
        };
        if due {
            self.logged.insert(kind, now);
        }
        due
    }
}

/// Every instance's audit.
#[derive(Debug, Clone, Default)]
pub struct Audit {
    rules: AuditRules,
    instances: BTreeMap<String, InstanceAudit>,
}

impl Audit {
    /// An audit with `rules`.
    pub fn new(rules: AuditRules) -> Audit {
        Audit { rules, instances: BTreeMap::new() }
    }

    /// Records one complete answer of `instance`, credited `credit` (its tokens and how kvdir
    /// knew them, [`CacheState`]), that reported `reported`; the warning to log now, if one
    /// applies and is due.
    pub fn record(
        &mut self,
        instance: &str,
        credit: (u64, CacheState),
        reported: Reported,
        now: Instant,
    ) -> Option<Warning> {
        let rules = &self.rules;
        let audit = match self.instances.get_mut(instance) {
            Some(a) => a,
            None => self.instances.entry(instance.to_string()).or_default(),
        };
        audit.record(rules, credit, reported);
        let warning = audit.warning(rules)?;
        audit.due(rules, warning.kind, now).then_some(warning)
    }

    /// What `instance`'s audit shows now (all zero when it was never audited).
    pub fn report(&self, instance: &str) -> AuditReport {
        let Some(a) = self.instances.get(instance) else { return AuditReport::default() };
        let warning = a.warning(&self.rules);
        AuditReport {
            counts: a.counts.clone(),
            warning_kind: warning.as_ref().map(|w| w.kind),
            warning: warning.map(|w| w.message),
        }
    }

    /// Every audited instance's report, by name.
    pub fn reports(&self) -> impl Iterator<Item = (&str, AuditReport)> + '_ {
        self.instances.keys().map(|name| (name.as_str(), self.report(name)))
    }
}
