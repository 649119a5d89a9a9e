//! The types routing reads and writes: the policy and its settings, the candidates with
//! their per-DP hits, and a decision with every candidate's explanation.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ledger::QueuedWork;
use super::listing::RouteSummary;
use super::rank::{DpRouting, RankLoad, RankScore};
use super::ttft::{TtftParams, TtftTerms};
use crate::registry::{InstanceState, InstanceType, LoadMetrics};

/// A load-balancing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Policy {
    /// Round robin over the P list and over the D list, each with its own counter.
    Rr,
    /// From TTFT/TPOT profiling data:
    /// P: `predicted_ttft = ttft(input_tokens) * (1 + waiting)`, where `ttft(n)` interpolates the
    /// `[prompt_len, ms]` samples linearly (beyond the last sample, proportionally);
    /// D: `predicted_tpot` = the `[avg_len, batch, ms]` sample nearest to
    /// `(input_tokens, waiting + 1)`, scaled by `(waiting + 1) / batch`.
    /// The smallest prediction wins; `meets_slo` says whether a prediction is within
    /// `--target_ttft` (P) or `--target_tpot` (D). The targets never change the choice (the
    /// smallest prediction meets its target whenever any candidate does); they classify it,
    /// and the reason says when no candidate meets the target. Instances without profiling
    /// data come last. (xllm-service also counts its own in-flight requests, which kvdir, a
    /// router that does not forward the requests, cannot see.)
    SloAware,
    /// Cache-aware routing, see the module docs.
    Car,
    /// Work-based: the smallest estimated time to first token plus the delay the request's
    /// own prefill adds to the requests expected behind it ([`super::TtftTerms`]); decode side
    /// as CAR.
    Ttft,
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "RR" => Ok(Policy::Rr),
            "SLO_AWARE" => Ok(Policy::SloAware),
            "CAR" => Ok(Policy::Car),
            "TTFT" => Ok(Policy::Ttft),
            _ => Err(format!("--load_balance_policy={s:?} is not one of RR, SLO_AWARE, CAR, TTFT")),
        }
    }
}

/// Policy settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteParams {
    /// The policy.
    pub policy: Policy,
    /// `--car_prefill_lambda` in 0..=1.
    pub lambda: f64,
    /// `--car_host_hit_weight` in 0..=1.
    pub host_weight: f64,
    /// `--target_ttft` in ms.
    pub target_ttft_ms: f64,
    /// `--target_tpot` in ms.
    pub target_tpot_ms: f64,
    /// False when the directory is disabled: every hit ratio is 0.
    pub directory_enabled: bool,
    /// `--car_predict_ttl_ms`: how long a routed request's keys are expected on its instance
    /// (predict-on-route, [`super::Predictions`]); 0 turns prediction off.
    pub predict_ttl_ms: u64,
    /// `--car_predict_weight` in 0..=1: CAR weight of the predicted term against exact hits.
    pub predict_weight: f64,
    /// The TTFT policy's settings.
    pub ttft: TtftParams,
}

impl Default for RouteParams {
    fn default() -> Self {
        RouteParams {
            policy: Policy::Car,
            lambda: 0.5,
            host_weight: 0.5,
            target_ttft_ms: 1000.0,
            target_tpot_ms: 50.0,
            directory_enabled: true,
            predict_ttl_ms: 2000,
            predict_weight: 0.5,
            ttft: TtftParams::default(),
        }
    }
}

/// One DP rank's cache hit for the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DpHit {
    /// The rank.
    pub dp_rank: u32,
    /// Whether the stream is synchronized.
    pub synchronized: bool,
    /// Whether the stream was started for the instance's current process.
    pub identity_matches: bool,
    /// Whether the stream knows only the blocks learned since a truncated history replay.
    #[serde(default)]
    pub partial: bool,
    /// Device hit tokens.
    pub device_hit_tokens: u64,
    /// Host-only hit tokens.
    pub host_only_hit_tokens: u64,
    /// Tokens expected beyond the exact hit because kvdir recently routed a request with this
    /// prefix to the instance (predict-on-route); never part of the exact hit.
    #[serde(default)]
    pub predicted_hit_tokens: u64,
    /// The engine publishes no KV events: the hit is kvdir's assumption from its own routing
    /// ([`super::ApproxCache`]), not what the engine reported.
    #[serde(default)]
    pub approximate: bool,
}

impl DpHit {
    /// This hit as the engine can use it for a prompt whose reusable prefix is at most `limit`
    /// tokens ([`reusable_limit`]): Device tokens first, then Host-only ones, within the limit.
    pub fn within(mut self, limit: u64) -> Self {
        self.device_hit_tokens = self.device_hit_tokens.min(limit);
        self.host_only_hit_tokens = self.host_only_hit_tokens.min(limit - self.device_hit_tokens);
        self
    }
}

/// How far the chosen instance's streams can be trusted for a prompt (the front door's
/// `x-kvdir-stream-state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// Every rank is synchronized from a complete history or snapshot.
    Exact,
    /// Every rank is synchronized, some only with what they learned since a truncated history.
    Partial,
    /// Some rank gives no credit (not synchronized, another process, or no stream).
    Unsynchronized,
    /// The engine publishes no KV events: its credit is kvdir's assumption from its own
    /// routing ([`super::ApproxCache`]).
    Approximate,
}

impl CacheState {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheState::Exact => "exact",
            CacheState::Partial => "partial",
            CacheState::Unsynchronized => "unsynchronized",
            CacheState::Approximate => "approximate",
        }
    }
}

impl CandidateReport {
    /// The prompt tokens the instance is credited with reusing, as CAR credits them (Device
    /// plus Host-only hits within the reusable limit: of the chosen rank when kvdir chose one,
    /// else the minimum over its DP ranks; 0 when a rank it counts gives no credit), and the
    /// state of those streams.
    pub fn cached_tokens(&self) -> (u64, CacheState) {
        let trusted = |h: &DpHit| h.synchronized && h.identity_matches;
        let counted: Vec<&DpHit> = match self.dp_rank {
            Some(r) => self.dp_hits.iter().filter(|h| h.dp_rank == r).collect(),
            None => self.dp_hits.iter().collect(),
        };
        if counted.is_empty() || !counted.iter().all(|h| trusted(h)) {
            return (0, CacheState::Unsynchronized);
        }
        let tokens = counted.iter().map(|h| h.device_hit_tokens + h.host_only_hit_tokens);
        let any = |f: fn(&DpHit) -> bool| counted.iter().any(|h| f(h));
        let state = match (any(|h| h.approximate), any(|h| h.partial)) {
            (true, _) => CacheState::Approximate,
            (false, true) => CacheState::Partial,
            (false, false) => CacheState::Exact,
        };
        (tokens.min().unwrap_or(0), state)
    }
}

/// The most tokens of a prompt of `input_tokens` tokens that an engine with blocks of
/// `block_size` tokens reuses: the whole blocks within its first `input_tokens - 1` tokens.
/// Every engine computes at least the prompt's last token (its logits give the first output
/// token) and reuses whole blocks only, so a fully cached prompt of an exact multiple of the
/// block size is credited one block less (vLLM: `max_cache_hit_length = num_tokens - 1`;
/// SGLang: `max_prefix_len = input_len - 1`, matched in whole pages; xLLM: a whole-prompt
/// match keeps `((n - 1) / block_size) * block_size` tokens).
pub fn reusable_limit(input_tokens: usize, block_size: u32) -> u64 {
    let block = u64::from(block_size.max(1));
    (input_tokens as u64).saturating_sub(1) / block * block
}

/// One instance as routing sees it.
#[derive(Debug, PartialEq)]
pub struct Candidate {
    /// Instance name.
    pub name: String,
    /// Registered role.
    pub kind: InstanceType,
    /// For MIX: acting as prefill now.
    pub mix_acting_prefill: bool,
    /// Instance state.
    pub state: InstanceState,
    /// Latest load report.
    pub load: Option<LoadMetrics>,
    /// DP ranks.
    pub dp_size: u32,
    /// `[prompt_len, ms]`.
    pub ttft_profile: Vec<(f64, f64)>,
    /// `[avg_len, batch, ms]`.
    pub tpot_profile: Vec<(f64, f64, f64)>,
    /// Per-DP hits of the request (prefill side only).
    pub hits: Vec<DpHit>,
    /// The work queued at it ([`super::WorkLedger`]), for the TTFT estimate.
    pub queued: QueuedWork,
    /// Who picks its DP rank ([`super::choose_rank`]).
    pub dp_routing: DpRouting,
    /// Its load per DP rank, where the engine reports one (empty otherwise).
    pub rank_loads: Vec<RankLoad>,
}

/// `clone_from` reuses the target's buffers: a router that rebuilds a thousand candidates per
/// request from its instance snapshot allocates nothing once they are made.
impl Clone for Candidate {
    fn clone(&self) -> Self {
        let mut c = Candidate {
            name: String::new(),
            kind: self.kind,
            mix_acting_prefill: false,
            state: self.state,
            load: None,
            dp_size: 0,
            ttft_profile: Vec::new(),
            tpot_profile: Vec::new(),
            hits: Vec::new(),
            queued: QueuedWork::default(),
            dp_routing: self.dp_routing,
            rank_loads: Vec::new(),
        };
        c.clone_from(self);
        c
    }

    fn clone_from(&mut self, source: &Self) {
        // Every field by name, so that a new one cannot be forgotten here.
        let Candidate {
            name,
            kind,
            mix_acting_prefill,
            state,
            load,
            dp_size,
            ttft_profile,
            tpot_profile,
            hits,
            queued,
            dp_routing,
            rank_loads,
        } = source;
        self.name.clone_from(name);
        (self.kind, self.mix_acting_prefill, self.state) = (*kind, *mix_acting_prefill, *state);
        (self.load, self.dp_size, self.queued) = (*load, *dp_size, *queued);
        self.ttft_profile.clone_from(ttft_profile);
        self.tpot_profile.clone_from(tpot_profile);
        self.hits.clone_from(hits);
        self.dp_routing = *dp_routing;
        self.rank_loads.clone_from(rank_loads);
    }
}

/// Which list a candidate is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// Prefill (DEFAULT, PREFILL, MIX acting as prefill).
    Prefill,
    /// Decode (DECODE, MIX acting as decode).
    Decode,
}

/// Why each instance was or was not chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateReport {
    /// Instance name.
    pub name: String,
    /// Registered role.
    pub role: InstanceType,
    /// The list it is on.
    pub side: Side,
    /// CAR hit ratio (P only; reported under every policy, used by CAR). From the engines' KV
    /// events only, except for an engine without events, whose `dp_hits` say `approximate`:
    /// there it is kvdir's approximate credit, all there is for that engine.
    pub kv_hit_ratio: Option<f64>,
    /// CAR predicted term (P only): the share of the prompt expected on the instance beyond
    /// `kv_hit_ratio` from its recent routes ([`super::predicted_hit_ratio`]); CAR weighs it by
    /// `--car_predict_weight`.
    #[serde(default)]
    pub predicted_hit_ratio: Option<f64>,
    /// Per-DP hits (P only).
    pub dp_hits: Vec<DpHit>,
    /// CAR queue cost.
    pub queue_cost: Option<f64>,
    /// Policy score or prediction; smaller wins.
    pub score: Option<f64>,
    /// SLO_AWARE only: whether the prediction is within `--target_ttft` (P) or
    /// `--target_tpot` (D); absent without a prediction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meets_slo: Option<bool>,
    /// Estimated time to first token, ms (P only, every policy; the TTFT policy's score).
    #[serde(default)]
    pub estimated_ttft_ms: Option<f64>,
    /// The estimate's terms (P only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft: Option<TtftTerms>,
    /// The DP rank kvdir chose on it (P only), where the engine accepts one; absent where the
    /// engine picks its rank (its credit is then the minimum over its ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// Every scored rank, where kvdir chose one ([`super::choose_rank`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_scores: Vec<RankScore>,
    /// Whether it was chosen.
    pub chosen: bool,
    /// Why it was or was not chosen.
    pub reason: String,
}

/// A routing decision with its explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Routed {
    /// The policy used.
    pub policy: Policy,
    /// Tokens in the request.
    pub input_tokens: usize,
    /// The chosen prefill (or DEFAULT) instance.
    pub prefill: String,
    /// The DP rank chosen on it, where its engine accepts one (the front door sends it in
    /// `X-data-parallel-rank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// The chosen decode instance, if any.
    pub decode: Option<String>,
    /// Every known instance; in a compact answer the chosen ones, then the best-scored others
    /// (`listing.rs`).
    pub candidates: Vec<CandidateReport>,
    /// A compact answer's count of every candidate (absent when all are listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<RouteSummary>,
}

#[cfg(test)]
impl Candidate {
    /// For tests: an idle, active DEFAULT instance with `hit` Device tokens exactly on each of
    /// its `dp` synchronized ranks, nothing queued.
    pub(crate) fn test_idle(name: &str, dp: u32, hit: u64) -> Candidate {
        let rank = |dp_rank| DpHit {
            dp_rank,
            synchronized: true,
            identity_matches: true,
            partial: false,
            device_hit_tokens: hit,
            host_only_hit_tokens: 0,
            predicted_hit_tokens: 0,
            approximate: false,
        };
        Candidate {
            name: name.into(),
            kind: InstanceType::Default,
            mix_acting_prefill: false,
            state: InstanceState::Active,
            load: Some(LoadMetrics {
                waiting_requests_num: 0,
                gpu_cache_usage_perc: 0.0,
                prefill_tokens_per_s: None,
            }),
            dp_size: dp,
            ttft_profile: Vec::new(),
            tpot_profile: Vec::new(),
            hits: (0..dp).map(rank).collect(),
            queued: Default::default(),
            dp_routing: DpRouting::Engine,
            rank_loads: Vec::new(),
        }
    }
}
