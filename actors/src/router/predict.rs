//! Predict-on-route glue between a request's per-stream hits ([`StreamHit`], read with
//! [`crate::directory::Directory::read_route`], so each carries the request's content keys)
//! and the router's [`Predictions`].
//!
//! Per decision, with prediction on (`--car_predict_ttl_ms` > 0, policy CAR):
//! 1. [`confirm`]: the keys the exact directory credits on any rank of an instance (the
//!    longest exact prefix over its synchronized ranks) are dropped from its predictions;
//! 2. [`predicted_tokens`]: each instance's longest expected prefix becomes each rank's
//!    `predicted_hit_tokens` beyond that rank's exact hit (a large fleet's read lists only the
//!    streams with credit: the instance's keys are then those of its block size);
//! 3. [`record`]: the chosen prefill instance gets the request's keys beyond what it already
//!    holds exactly, for the TTL.

use kvdir::car::{InstanceId, Predictions};

use crate::directory::{RouteRead, StreamHit};

/// The longest prefix, in blocks, that some synchronized rank of these hits holds exactly.
fn exact_blocks(hits: &[StreamHit]) -> usize {
    hits.iter()
        .filter(|h| h.status.synchronized)
        .map(|h| (h.tokens() / u64::from(h.block_size.max(1))) as usize)
        .max()
        .unwrap_or(0)
}

/// Drops the predictions that the exact directory now credits, instance by instance: each
/// instance with predictions, whose entries in the read `entries` gives (a few dozen
/// instances, where the read may list thousands).
pub(crate) fn confirm<'a>(
    predictions: &mut Predictions<InstanceId>,
    entries: impl Fn(InstanceId) -> &'a [StreamHit],
) {
    let predicted: Vec<InstanceId> = predictions.instances().copied().collect();
    for instance in predicted {
        let group = entries(instance);
        let Some(first) = group.first() else { continue };
        let held = exact_blocks(group).min(first.keys.len());
        if held > 0 {
            predictions.confirm(&instance, &first.keys[..held]);
        }
    }
}

/// The tokens of the request expected on `instance` (its longest predicted prefix): under the
/// keys of its `listed` entries, or, when the read lists none of its streams, under the keys
/// of each block size read (keys of another block size never match what was recorded).
pub(crate) fn predicted_tokens(
    predictions: &Predictions<InstanceId>,
    now_ms: u64,
    instance: &InstanceId,
    listed: &[StreamHit],
    read: &RouteRead,
) -> u64 {
    let blocks = |keys: &[_], block_size: u32| {
        predictions.predicted_blocks(now_ms, instance, keys) as u64 * u64::from(block_size)
    };
    match listed.first() {
        Some(first) => blocks(&first.keys, first.block_size),
        None => read.keys().map(|(block_size, k)| blocks(k, block_size)).max().unwrap_or(0),
    }
}

/// Records the request's keys on `instance`, beyond what it already holds exactly (`hits`:
/// its streams).
pub(crate) fn record(
    predictions: &mut Predictions<InstanceId>,
    now_ms: u64,
    instance: &InstanceId,
    hits: &[StreamHit],
) {
    let group = hits;
    let Some(first) = group.first() else { return };
    let held = exact_blocks(group).min(first.keys.len());
    predictions.record(now_ms, instance, &first.keys[held..]);
}
