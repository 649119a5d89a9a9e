//! Approximate credit for engines without KV events: the glue between kvdir's pure
//! [`ApproxCache`] and the service.
//!
//! - **Who is approximate.** Discovery names the engines ([`Approximate::set_engines`], on every
//!   change of its instance set): listed or registered engines without `events`, and with
//!   `discovery.events = "none"` every instance found in etcd. An engine leaves the set, or
//!   comes back with another process, and its entries are gone.
//! - **Reads.** Every read of the [`Directory`](super::Directory) (the query endpoint, the
//!   indexer API, routes and the front door) also lists each approximate engine
//!   in scope, one entry per DP rank, with `approximate: true`, synchronized, its process as
//!   identity, and the longest prefix of the prompt's keys credited there ([`Approximate::each`]).
//! - **Writes.** When the router chooses an approximate engine to prefill a request, the
//!   request's keys (carried by its hits) are recorded there ([`Approximate::record`]); the
//!   router is given the directory when it is made.
//!
//! One mutex guards the cache; it is held for lookups and recordings (one probe per block),
//! never while hashing.

use std::sync::{Arc, Mutex};

use kvdir::car::{ApproxCache, ApproxEngine, ApproxSettings};
use kvdir::index::{ContentKey, SlotRead, StreamLabel, StreamStatus};
use kvdir::query::QueryScope;

use super::reader::Make;
use super::{now_ms, Handles, StreamHit};

/// The hash seed of an approximate engine's keys (every engine's default).
pub(super) const HASH_SEED: u64 = 1024;

/// The approximate engines and their credit, shared by readers and the router.
#[derive(Debug, Default)]
pub struct Approximate {
    cache: Mutex<ApproxCache>,
    /// The directory's instance handles (its entries' labels carry them).
    handles: Arc<Handles>,
}

impl Approximate {
    /// No engine yet, with `settings`, its entries numbered by `handles`.
    pub(super) fn new(settings: ApproxSettings, handles: Arc<Handles>) -> Self {
        Approximate { cache: Mutex::new(ApproxCache::new(settings)), handles }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ApproxCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `engines` the approximate engines (see [`ApproxCache::set_engines`]).
    pub fn set_engines(&self, engines: Vec<ApproxEngine>) {
        for name in self.lock().set_engines(engines) {
            tracing::info!(engine = %name, "approximate credit dropped: the engine left or restarted");
        }
    }

    /// Whether `name` is credited approximately, with the blocks it holds now.
    pub fn blocks(&self, name: &str) -> Option<usize> {
        self.lock().blocks(name).map(|(held, _)| held)
    }

    /// The settings.
    pub fn settings(&self) -> ApproxSettings {
        self.lock().settings()
    }

    /// The chosen `instance` prefills a request: if it is an approximate engine, the request's
    /// keys (those its hits carry) are assumed cached there from `now_ms`.
    pub fn record(&self, now_ms: u64, instance: &str, hits: &[StreamHit]) {
        let hit = hits.iter().find(|h| h.status.approximate && h.instance_name() == instance);
        if let Some(h) = hit {
            self.lock().record(now_ms, instance, &h.keys);
        }
    }

    /// DP ranks of the approximate engines `scope` admits.
    pub fn count_in(&self, scope: &QueryScope) -> usize {
        let cache = self.lock();
        let admitted = |e: &&ApproxEngine| scope.admits(&label(e, 0), e.block_size);
        cache.engines().filter(admitted).map(|e| e.dp_size.max(1) as usize).sum()
    }

    /// `make(entry, (Device, Host-only) hit tokens, the prompt's keys, block size)` for each
    /// DP rank of every approximate engine `scope` admits, in name then rank order; the entries
    /// `make` keeps (`Some`). `keys` gives the prompt's keys for a block size (under
    /// [`HASH_SEED`], in the scope's namespace).
    pub fn each<T>(
        &self,
        scope: &QueryScope,
        keys: &mut dyn FnMut(u32) -> Arc<[ContentKey]>,
        make: &mut Make<'_, Option<T>>,
    ) -> Vec<T> {
        let engines: Vec<ApproxEngine> = self.lock().engines().cloned().collect();
        let mut out = Vec::new();
        for e in engines {
            let handle = self.handles.of(&e.name);
            let labels: Vec<StreamLabel> = (0..e.dp_size.max(1))
                .map(|dp_rank| StreamLabel { instance_handle: handle, ..label(&e, dp_rank) })
                .filter(|l| scope.admits(l, e.block_size))
                .collect();
            if labels.is_empty() {
                continue;
            }
            let k = keys(e.block_size);
            let (blocks, held) = {
                let cache = self.lock();
                let held = cache.blocks(&e.name).map_or(0, |(held, _)| held);
                (cache.cached_blocks(now_ms(), &e.name, &k), held)
            };
            let tokens = blocks as u64 * u64::from(e.block_size);
            let status = Arc::new(StreamStatus {
                synchronized: true,
                device_blocks: held as u64,
                approximate: true,
                ..StreamStatus::default()
            });
            for label in labels {
                let slot =
                    SlotRead { slot: u8::MAX, label: Arc::new(label), status: status.clone() };
                out.extend(make(slot, (tokens, 0), &k, e.block_size));
            }
        }
        out
    }
}

/// The label of rank `dp_rank` of approximate engine `e`.
fn label(e: &ApproxEngine, dp_rank: u32) -> StreamLabel {
    StreamLabel {
        instance_name: e.name.clone(),
        dp_rank,
        identity: Some(e.process.clone()),
        model: e.model.clone(),
        tenant: String::new(),
        instance_handle: 0,
    }
}
