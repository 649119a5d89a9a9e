//! Predict-on-route glue between a request's per-stream hits ([`StreamHit`], read with
//! [`crate::directory::Directory::read_keyed_in`], so each carries the request's content keys) and
//! the router's [`Predictions`].
//!
//! Per decision, with prediction on (`--car_predict_ttl_ms` > 0, policy CAR):
//! 1. [`confirm`]: the keys the exact directory credits on any rank of an instance (the
//!    longest exact prefix over its synchronized ranks) are dropped from its predictions;
//! 2. [`predicted_tokens`]: each instance's longest expected prefix becomes each rank's
//!    `predicted_hit_tokens` beyond that rank's exact hit;
//! 3. [`record`]: the chosen prefill instance gets the request's keys beyond what it already
//!    holds exactly, for the TTL.

use kvdir::car::Predictions;

use crate::directory::StreamHit;

/// The hits of `instance` (hits are sorted by instance, then rank).
fn of<'a>(hits: &'a [StreamHit], instance: &str) -> &'a [StreamHit] {
    let start = hits.partition_point(|h| h.matched.instance_name.as_str() < instance);
    let end = hits.partition_point(|h| h.matched.instance_name.as_str() <= instance);
    &hits[start..end]
}

/// The longest prefix, in blocks, that some synchronized rank of these hits holds exactly.
fn exact_blocks(hits: &[StreamHit]) -> usize {
    hits.iter()
        .filter(|h| h.matched.synchronized)
        .map(|h| {
            let tokens = h.matched.device_hit_tokens + h.matched.host_only_hit_tokens;
            (tokens / u64::from(h.block_size.max(1))) as usize
        })
        .max()
        .unwrap_or(0)
}

/// Drops the predictions that the exact directory now credits, instance by instance.
pub(crate) fn confirm(predictions: &mut Predictions, hits: &[StreamHit]) {
    let mut rest = hits;
    while let Some(first) = rest.first() {
        let group = of(rest, &first.matched.instance_name);
        let held = exact_blocks(group).min(first.keys.len());
        if held > 0 {
            predictions.confirm(&first.matched.instance_name, &first.keys[..held]);
        }
        rest = &rest[group.len()..];
    }
}

/// The tokens of the request expected on `instance` (its longest predicted prefix).
pub(crate) fn predicted_tokens(
    predictions: &Predictions,
    now_ms: u64,
    instance: &str,
    hits: &[StreamHit],
) -> u64 {
    let Some(first) = of(hits, instance).first() else { return 0 };
    let blocks = predictions.predicted_blocks(now_ms, instance, &first.keys);
    blocks as u64 * u64::from(first.block_size)
}

/// Records the request's keys on `instance`, beyond what it already holds exactly.
pub(crate) fn record(
    predictions: &mut Predictions,
    now_ms: u64,
    instance: &str,
    hits: &[StreamHit],
) {
    let group = of(hits, instance);
    let Some(first) = group.first() else { return };
    let held = exact_blocks(group).min(first.keys.len());
    predictions.record(now_ms, instance, &first.keys[held..]);
}
