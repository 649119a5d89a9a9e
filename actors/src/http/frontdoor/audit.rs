//! The front door's side of the cache-truth audit ([`kvdir::audit`]): it asks a streaming
//! engine for usage when the client did not ([`UsagePlan::prepare`]), reads each successful
//! answer's `usage.prompt_tokens_details.cached_tokens` as it streams through ([`tap`]), strips
//! the usage chunk the client did not ask for, and records the answer against the credit kvdir
//! gave the chosen instance ([`CacheAudit`]) when the answer is complete. A client that goes
//! away first, or an error status, is not audited.
//!
//! The rules and counts are in the core; this file holds the lock, logs the warnings the core
//! hands back (WARN, rate-limited there) and renders the `kvdir_frontend_cache_audit_*`
//! families.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use actix_web::web::Bytes;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use kvdir::audit::WarningKind;
use kvdir::audit::{ask_for_usage, Audit, AuditReport, Outcome, Pass, Reported, UsageTap};
use kvdir::car::CacheState;
use kvdir::metrics::{Exposition, Kind};

use super::request::OpenAiRequest;

/// Every instance's audit, shared by the answers in flight.
#[derive(Debug, Default)]
pub struct CacheAudit {
    audit: Mutex<Audit>,
}

impl CacheAudit {
    /// Records one complete answer; logs the warning the rules call for, if due.
    pub fn record(&self, instance: &str, credit: (u64, CacheState), reported: Reported) {
        let warning = {
            let mut audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
            audit.record(instance, credit, reported, Instant::now())
        };
        if let Some(w) = warning {
            tracing::warn!(instance, kind = w.kind.as_str(), "cache audit: {}", w.message);
        }
    }

    /// Every audited instance's report, by name (`cache_audit` in `/v1/internal/instances`).
    pub fn reports(&self) -> std::collections::BTreeMap<String, AuditReport> {
        let audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        audit.reports().map(|(n, r)| (n.to_string(), r)).collect()
    }

    /// Appends the audit's families to `e`.
    pub fn render(&self, e: &mut Exposition) {
        let reports = self.reports();
        let name = "kvdir_frontend_cache_audit_requests_total";
        let help = "Front door answers by instance and how the engine's cached tokens compared \
                    with kvdir's credit.";
        e.family(name, Kind::Counter, help);
        for (instance, r) in &reports {
            for outcome in Outcome::ALL {
                let labels = [("instance", instance.as_str()), ("outcome", outcome.as_str())];
                e.sample(name, &labels, r.counts.get(outcome).0 as f64);
            }
        }
        let name = "kvdir_frontend_cache_audit_tokens_total";
        let help = "Front door cached tokens by instance: exact = reused as credited, under = \
                    reused beyond kvdir's credit, over = credited and not reused.";
        e.family(name, Kind::Counter, help);
        for (instance, r) in &reports {
            for outcome in [Outcome::Exact, Outcome::Under, Outcome::Over] {
                let labels = [("instance", instance.as_str()), ("outcome", outcome.as_str())];
                e.sample(name, &labels, r.counts.get(outcome).1 as f64);
            }
        }
        let name = "kvdir_frontend_cache_audit_warning";
        e.family(name, Kind::Gauge, "1 while the cache audit's rule `kind` applies to instance.");
        for (instance, r) in &reports {
            for kind in WarningKind::ALL {
                let labels = [("instance", instance.as_str()), ("kind", kind.as_str())];
                e.sample(name, &labels, f64::from(u8::from(r.warning_kind == Some(kind))));
            }
        }
    }
}

/// How a request's answer is audited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsagePlan {
    /// kvdir added `stream_options.include_usage`: strip the usage chunk from the answer.
    pub strip: bool,
}

impl UsagePlan {
    /// The body to forward and the plan: a streaming request whose client did not ask for
    /// usage gets `stream_options.include_usage: true`; any other body goes unchanged.
    pub fn prepare(body: Vec<u8>, parsed: &OpenAiRequest) -> (Vec<u8>, UsagePlan) {
        if !parsed.stream || parsed.include_usage {
            return (body, UsagePlan::default());
        }
        match ask_for_usage(&body, parsed.has_stream_options) {
            Some(asked) => (asked, UsagePlan { strip: true }),
            None => (body, UsagePlan::default()),
        }
    }
}

/// The engine's answer with the audit in its path: `content_type` says SSE or JSON; `ok` is
/// false for an error status (then the body passes untouched and nothing is recorded).
pub struct Audited {
    /// The answer's bytes.
    pub inner: BoxStream<'static, reqwest::Result<Bytes>>,
    /// Whether the engine answered 2xx.
    pub ok: bool,
    /// The response's content type.
    pub sse: bool,
    /// What to strip.
    pub plan: UsagePlan,
    /// The chosen instance and the tokens kvdir credited it with, and how it knew them.
    pub instance: String,
    /// kvdir's exact credit on that instance.
    pub credit: (u64, CacheState),
    /// Where to record.
    pub audit: Arc<CacheAudit>,
}

/// The answer as the client gets it, audited on the way.
pub fn tap(a: Audited) -> BoxStream<'static, reqwest::Result<Bytes>> {
    if !a.ok {
        return a.inner;
    }
    let usage = if a.sse { UsageTap::sse(a.plan.strip) } else { UsageTap::json() };
    Tapped { a, usage: Some(usage), ended: false }.boxed()
}

struct Tapped {
    a: Audited,
    /// `None` after a broken chunk: the rest passes unaudited.
    usage: Option<UsageTap>,
    ended: bool,
}

impl Stream for Tapped {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            let next = match self.a.inner.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            };
            self.ended = next.is_none();
            let Some(usage) = self.usage.as_mut() else { return Poll::Ready(next) };
            match next {
                Some(Ok(chunk)) => match usage.feed(&chunk) {
                    Pass::Whole => return Poll::Ready(Some(Ok(chunk))),
                    Pass::Part(p) if p.is_empty() => continue,
                    Pass::Part(p) => return Poll::Ready(Some(Ok(Bytes::from(p)))),
                },
                Some(Err(e)) => {
                    self.usage = None;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    let Some(usage) = self.usage.take() else { return Poll::Ready(None) };
                    let (flush, reported) = usage.finish();
                    self.a.audit.record(&self.a.instance, self.a.credit, reported);
                    return Poll::Ready((!flush.is_empty()).then(|| Ok(Bytes::from(flush))));
                }
            }
        }
    }
}
