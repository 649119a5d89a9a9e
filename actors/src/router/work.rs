//! Glue between the router and its [`WorkLedger`] (the TTFT policy's queued work, see
//! `kvdir::car::WorkLedger`): load reports reconcile it, each decision adds the chosen prefill
//! instance's share of work, and the front door's first bytes end requests and teach rates.
//! Kept under every policy, so every answer carries each candidate's estimated TTFT.

use kvdir::car::{NameMap, RequestId, Routed, RoutedWork, WorkLedger};

use super::InstanceInfo;

/// Applies the load reports of `instances` (a snapshot, indexed by name in `positions`) and
/// forgets instances not in it.
pub(crate) fn snapshot(
    ledger: &mut WorkLedger,
    instances: &[InstanceInfo],
    positions: &NameMap<String, usize>,
) {
    for info in instances {
        report(ledger, info);
    }
    // By name through the index: a scan of the snapshot per instance cost 1,024 x 1,024
    // string compares every refresh at 1,024 instances.
    ledger.retain(|name| positions.contains_key(name));
}

/// Applies `info`'s latest load report, if it has one the ledger has not seen.
pub(crate) fn report(ledger: &mut WorkLedger, info: &InstanceInfo) {
    if let Some(load) = info.candidate.load {
        ledger.report(&info.candidate.name, info.load_reports, load.waiting_requests_num);
    }
}

/// Adds the decision's request to its prefill instance (whose load reports numbered
/// `reports`), with the front door's id `key` when it forwards it.
pub(crate) fn record(
    ledger: &mut WorkLedger,
    routed: &Routed,
    reports: u64,
    key: Option<RequestId>,
) {
    let chosen = routed.candidates.iter().find(|c| c.name == routed.prefill);
    let Some(terms) = chosen.and_then(|c| c.ttft) else { return };
    let work = RoutedWork {
        input: routed.input_tokens as f64,
        uncached: terms.own_uncached_tokens,
        ahead_tokens: terms.ahead_per_rank(),
        fixed_ms: terms.fixed_ms(),
    };
    ledger.routed(&routed.prefill, reports, crate::directory::now_ms(), work, key);
}
