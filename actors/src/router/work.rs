//! Glue between the router and its [`WorkLedger`] (the TTFT policy's queued work, see
//! `kvdir::car::WorkLedger`): load reports reconcile it, each decision adds the chosen prefill
//! instance's share of work, and the front door's first bytes end requests and teach rates.
//! Kept under every policy, so every answer carries each candidate's estimated TTFT.

use kvdir::car::{InstanceId, RequestId, Routed, RoutedWork, WorkLedger};

use super::ids::Ids;
use super::InstanceInfo;

/// Applies the load reports of `instances` (a snapshot, with their `ids`) and forgets
/// instances not in it.
pub(crate) fn snapshot(ledger: &mut WorkLedger<InstanceId>, instances: &[InstanceInfo], ids: &Ids) {
    for (i, info) in instances.iter().enumerate() {
        report(ledger, info, ids.at(i));
    }
    ledger.retain(|&id| ids.position(id).is_some());
}

/// Applies `info`'s latest load report, if it has one the ledger has not seen (`id`: its id).
pub(crate) fn report(ledger: &mut WorkLedger<InstanceId>, info: &InstanceInfo, id: InstanceId) {
    if let Some(load) = info.candidate.load {
        ledger.report(&id, info.load_reports, load.waiting_requests_num);
    }
}

/// Adds the decision's request to its prefill instance (its id, and its load reports so far),
/// with the front door's id `key` when it forwards it.
pub(crate) fn record(
    ledger: &mut WorkLedger<InstanceId>,
    routed: &Routed,
    (instance, reports): (InstanceId, u64),
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
    ledger.routed(&instance, reports, crate::directory::now_ms(), work, key);
}
