//! CAR is *cache-aware routing*, as xLLM's `--load_balance_policy CAR` names it and kvdir's
//! protocol keeps it: send a request where most of its prompt is already cached, weighed
//! against the instance's queue. The module is named after it, kvdir's default policy, and
//! holds all of kvdir's routing.
//!
//! Routing decisions (protocol.md section 7): candidate selection and the CAR, RR and SLO_AWARE
//! policies, plus TTFT (estimated time to first token, [`estimate`], over the queued work of a
//! [`WorkLedger`]), as pure functions over a snapshot of instances, loads and per-DP cache hits.
//!
//! CAR, for prefill-side (P) candidates, smallest wins:
//! ```text
//! kv_hit_ratio = clamp((device_hit + host_weight * host_only_hit) / input_tokens, 0, 1)
//!                (the minimum over the instance's DP ranks; a missing, unsynchronized or
//!                 stale-identity rank makes it 0; hits are at most [`reusable_limit`]: the
//!                 whole blocks within the prompt's first input_tokens - 1 tokens)
//! predicted    = min over ranks of (exact + predicted tokens) / input_tokens - kv_hit_ratio
//!                (predict-on-route, [`Predictions`]; 0 when off or nothing is expected)
//! queue_cost   = waiting / max(waiting over P candidates)     (0 when every queue is empty)
//! score        = lambda * (1 - kv_hit_ratio - predict_weight * predicted)
//!                + (1 - lambda) * queue_cost
//! ```
//! and for decode-side (D) candidates `score = gpu_cache_usage_perc + waiting / max(waiting)`.
//! Equal scores rotate between calls. Without any D candidate only a DEFAULT instance may serve
//! alone. Where the engine accepts the DP rank with the request, kvdir also chooses the rank
//! ([`choose_rank`]), and the instance's `kv_hit_ratio` and predicted term are that rank's own
//! instead of the minimum over its ranks.
//!
//! [`InFlight`] counts a forwarding router's own unanswered requests between load reports.
//! [`Predictions`] holds the content keys of recently routed requests, expected on their
//! instances until the engines' events confirm them or a short TTL passes.
//! [`RecentRoutes`] keeps the last few decisions (token counts only) for the status page.
//! A large fleet's answer lists a few candidates and counts the rest ([`route_listed`],
//! `listing.rs`).
//! [`ApproxCache`] credits engines without KV events from kvdir's own routing (approximate).

mod approx;
mod inflight;
mod ledger;
mod listing;
mod names;
mod policy;
mod predict;
mod prune;
mod rank;
mod recent;
mod score;
mod ttft;
mod types;

pub use approx::{ApproxCache, ApproxEngine, ApproxSettings};
pub use inflight::{prompt_id, InFlight, PromptId, RequestId};
pub use ledger::{ewma, QueuedWork, RoutedWork, WorkLedger};
pub use listing::{RouteSummary, ROUTE_LIST};
pub use names::{InstanceId, InstanceKey, KeyMap, NameHasher, NameMap};
pub use policy::{kv_hit_ratio, route, route_listed, Rotation, RouteError};
pub use predict::{predicted_hit_ratio, PredictCounters, Predictions};
pub use prune::{route_pruned, Fleet};
pub use rank::{choose_rank, DpRouting, RankChoice, RankLoad, RankScore, MAX_SCORED_RANKS};
pub use recent::{RecentRoutes, RecentRoutesReport, RouteRecord};
pub use ttft::{add_later, estimate, RateSource, TtftParams, TtftTerms};
pub use types::{
    reusable_limit, CacheState, Candidate, CandidateReport, DpHit, Policy, RouteParams, Routed,
    Side,
};

#[cfg(test)]
mod tests;
