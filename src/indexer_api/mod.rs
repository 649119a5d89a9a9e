//! The KV indexer API of Mooncake Conductor (RFC #1403), without any HTTP: the bodies of
//! `POST /register` and `POST /unregister`, and the RFC shape of a `POST /query` answer.
//!
//! Mapping (`docs/http-api.md`, "Indexer API", says the same for users):
//! - `/register` is one stream: `instance_id` is the instance name, `dp_rank` the rank,
//!   `modelname` the stream's model, `additionalsalt` its salt (its blocks are keyed in that
//!   salt's namespace), `tenant_id` its tenant. `topic` and `hash_seed` are kvdir extensions.
//! - A `/query` answer is `{tenant: {instance_id: {longest_matched, GPU, CPU, DISK, DP}}}`.
//!   `DP` maps each rank to its reusable prefix (contiguous complete blocks on Device or
//!   Host). The instance's figures are those of its weakest rank (the engine, not the gateway,
//!   picks the rank, so that is the credit the gateway can count on): `longest_matched` is the
//!   minimum over ranks, `GPU` and `CPU` split that rank's prefix into Device and Host-only
//!   tokens, `DISK` is 0 (kvdir does not index disk). An unsynchronized rank gives 0.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::{check_endpoint, StreamSpec};
use crate::query::{StreamMatch, DEFAULT_TENANT};

/// Why an indexer API body was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IndexerError {
    /// The body is not the expected JSON or a field is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// Largest block size accepted, as in the config file.
const MAX_BLOCK_SIZE: u32 = 65_536;

/// The body of `POST /register`.
#[derive(Debug, Clone, Deserialize)]
pub struct RegisterBody {
    /// Live event endpoint (`tcp://host:port`, connectable).
    pub endpoint: String,
    /// Snapshot endpoint; kvdir needs it to (re)synchronize.
    pub replay_endpoint: Option<String>,
    /// The engine type (`vllm`, `sglang`, `xllm`, ...); informational.
    #[serde(rename = "type")]
    pub engine_type: Option<String>,
    /// The model the engine serves.
    pub modelname: Option<String>,
    /// Informational: events name their adapter per block.
    pub lora_name: Option<String>,
    /// The tenant; absent: `"default"`.
    pub tenant_id: Option<String>,
    /// The instance name.
    pub instance_id: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The DP rank.
    #[serde(default)]
    pub dp_rank: u32,
    /// The salt of every block the engine publishes.
    pub additionalsalt: Option<String>,
    /// kvdir extension: the exact publisher topic (default `""`).
    pub topic: Option<String>,
    /// kvdir extension: the content-key seed (default 1024).
    pub hash_seed: Option<u64>,
}

/// A validated registration: the stream and its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The stream to start.
    pub spec: StreamSpec,
    /// Its tenant (never empty).
    pub tenant: String,
}

fn invalid(msg: String) -> IndexerError {
    IndexerError::Invalid(msg)
}

/// Parses and validates a `/register` body.
pub fn parse_register(body: &[u8]) -> Result<Registration, IndexerError> {
    let b: RegisterBody = serde_json::from_slice(body).map_err(|e| {
        invalid(format!(
            "register body: {e}; expected {{\"endpoint\", \"replay_endpoint\", \"type\", \
             \"modelname\", \"instance_id\", \"block_size\", \"dp_rank\", ...}}"
        ))
    })?;
    if b.instance_id.trim().is_empty() {
        return Err(invalid("instance_id is empty; name the engine instance".into()));
    }
    if !(1..=MAX_BLOCK_SIZE).contains(&b.block_size) {
        return Err(invalid(format!(
            "block_size = {} is outside 1..={MAX_BLOCK_SIZE}; give the engine's block size",
            b.block_size
        )));
    }
    if b.dp_rank > 65_535 {
        return Err(invalid(format!("dp_rank = {} is outside 0..=65535", b.dp_rank)));
    }
    let replay = b.replay_endpoint.filter(|r| !r.is_empty()).ok_or_else(|| {
        invalid(
            "replay_endpoint is missing: kvdir synchronizes every stream from a snapshot; give \
             the engine's replay endpoint, such as tcp://127.0.0.1:38000"
                .into(),
        )
    })?;
    for (key, ep) in [("endpoint", &b.endpoint), ("replay_endpoint", &replay)] {
        check_endpoint(ep).map_err(|e| invalid(format!("{key} = {ep:?}: {e}")))?;
    }
    let spec = StreamSpec {
        instance_name: b.instance_id,
        dp_rank: b.dp_rank,
        block_size: b.block_size,
        endpoint: b.endpoint,
        replay_endpoint: replay,
        topic: b.topic.unwrap_or_default(),
        hash_seed: b.hash_seed.unwrap_or(1024),
        model: b.modelname.unwrap_or_default(),
        salt: b.additionalsalt.unwrap_or_default(),
        replay: crate::config::ReplayKind::Snapshot,
    };
    let tenant = b.tenant_id.filter(|t| !t.is_empty()).unwrap_or_else(|| DEFAULT_TENANT.into());
    Ok(Registration { spec, tenant })
}

/// The body of `POST /unregister`: every registered stream of `instance_id` (only rank
/// `dp_rank` when given).
#[derive(Debug, Clone, Deserialize)]
pub struct UnregisterBody {
    /// The instance name.
    pub instance_id: String,
    /// One rank only.
    pub dp_rank: Option<u32>,
}

/// Parses an `/unregister` body.
pub fn parse_unregister(body: &[u8]) -> Result<UnregisterBody, IndexerError> {
    serde_json::from_slice(body).map_err(|e| {
        invalid(format!("unregister body: {e}; expected {{\"instance_id\", \"dp_rank\"?}}"))
    })
}

/// One instance in a `/query` answer (RFC field names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceHits {
    /// Tokens the instance can reuse whichever rank serves the request.
    pub longest_matched: u64,
    /// Of those, tokens on Device.
    #[serde(rename = "GPU")]
    pub gpu: u64,
    /// Of those, tokens only on Host.
    #[serde(rename = "CPU")]
    pub cpu: u64,
    /// Always 0: kvdir does not index disk.
    #[serde(rename = "DISK")]
    pub disk: u64,
    /// Each rank's reusable prefix.
    #[serde(rename = "DP")]
    pub dp: BTreeMap<String, u64>,
}

/// `{tenant: {instance_id: InstanceHits}}`.
pub type RfcAnswer = BTreeMap<String, BTreeMap<String, InstanceHits>>;

/// The RFC answer for per-stream matches, each with its tenant.
pub fn rfc_answer<'a>(hits: impl IntoIterator<Item = (&'a str, &'a StreamMatch)>) -> RfcAnswer {
    let mut out = RfcAnswer::new();
    // Per instance: its ranks, and the weakest rank's (reusable, device, host-only) so far.
    let mut weakest: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    for (tenant, m) in hits {
        let tenant = if tenant.is_empty() { DEFAULT_TENANT } else { tenant };
        let reusable = if m.synchronized { m.reusable_prefix_tokens } else { 0 };
        let entry =
            out.entry(tenant.to_string()).or_default().entry(m.instance_name.clone()).or_default();
        entry.dp.insert(m.dp_rank.to_string(), reusable);
        let mine = (reusable, reusable.min(m.device_hit_tokens), 0);
        let mine = (mine.0, mine.1, mine.0 - mine.1);
        let key = (tenant.to_string(), m.instance_name.clone());
        let w = weakest.entry(key).or_insert(mine);
        if mine.0 < w.0 {
            *w = mine;
        }
    }
    for ((tenant, instance), (reusable, gpu, cpu)) in weakest {
        if let Some(e) = out.get_mut(&tenant).and_then(|t| t.get_mut(&instance)) {
            (e.longest_matched, e.gpu, e.cpu) = (reusable, gpu, cpu);
        }
    }
    out
}

#[cfg(test)]
mod tests;
