//! [`Directory`]: the service's KV-cache directory, what every read asks "who holds this
//! prompt?": the shared query indexes, one per `(block_size, hash_seed)`, the approximate
//! credit of engines without KV events, and the read path of the HTTP handlers and the router.
//!
//! A stream joins with [`Directory::add_stream`] and gets the [`StreamWriter`] its IndexActor
//! owns; dropping the writer removes all of the stream's bits and frees its slot in one publish.
//! Readers call [`Directory::read`] from any thread, with no lock on the index and no actor
//! mailbox: each thread keeps one `SharedHandle` per index (thread-local), hashes the query once
//! per index and walks it once for all of its streams.
//!
//! Invariants: an entry is listed exactly while its stream's slot is labelled in the published
//! view, and its hits, status and identity come from that same published copy, so a reused slot
//! never lends an old stream's bits or name to a new one; an unsynchronized stream gives zero.
//!
//! Engines without KV events have no stream: every read also lists them, one entry per DP
//! rank marked `approximate`, from [`Approximate`] (`approximate.rs`), which the router credits
//! with what it routes there.

mod approximate;

pub use approximate::Approximate;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use kvdir::index::{
    ContentKey, IndexConfig, SharedError, SharedHandle, SharedIndex, SlotRead, StreamLabel,
    StreamWriter, MAX_STREAMS,
};
use kvdir::query::{answer_json, MatchRef, QueryResponse, QueryScope, StreamMatch};
use kvdir::registry::Identity;

/// Milliseconds on a monotonic clock (since the first call in this process): the clock of
/// approximate credit and of the router's predictions, overload deadlines and queued work.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Ids of indexes, unique in the process (several services may share a thread in tests).
static NEXT_INDEX: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's reader handle of each index it has read, by index id.
    static HANDLES: RefCell<HashMap<u64, SharedHandle>> = RefCell::new(HashMap::new());
}

struct Group {
    id: u64,
    block_size: u32,
    hash_seed: u64,
    index: SharedIndex,
}

/// The directory of one service: its shared indexes and its approximate credit.
#[derive(Default)]
pub struct Directory {
    groups: RwLock<Vec<Group>>,
    /// Engines without KV events and their approximate credit.
    approximate: Approximate,
}

/// One stream's entry in an answer, with the process it was started for.
#[derive(Debug, Clone)]
pub struct StreamHit {
    /// What the query endpoint reports.
    pub matched: StreamMatch,
    /// The engine process (discovery only).
    pub identity: Option<Identity>,
    /// The stream's tenant (registered streams; empty otherwise).
    pub tenant: String,
    /// The query's content keys under this stream's index ([`Directory::read_keyed_in`]; empty
    /// from the other reads), shared by the streams of one index.
    pub keys: Arc<[ContentKey]>,
    /// Tokens per block of the stream's index (what one of `keys` covers).
    pub block_size: u32,
}

impl Directory {
    /// No stream yet; engines without KV events get approximate credit with `settings`.
    pub fn new(settings: kvdir::car::ApproxSettings) -> Self {
        Directory { groups: RwLock::default(), approximate: Approximate::new(settings) }
    }

    /// The engines without KV events and their approximate credit.
    pub fn approximate(&self) -> &Approximate {
        &self.approximate
    }

    /// A new stream `label` in an index of its block size and seed, with room for
    /// [`MAX_STREAMS`] streams each: when every index of that block size and seed is full,
    /// another one is made (a query walks each), so `max_streams` may exceed one index's
    /// slots. A slot is free again as soon as its writer is dropped. Its entry is visible,
    /// unsynchronized, when this returns.
    pub fn add_stream(
        &self,
        config: IndexConfig,
        label: StreamLabel,
    ) -> Result<StreamWriter, SharedError> {
        let (block_size, hash_seed) = (config.block_size, config.hash_seed);
        let same = |g: &&Group| (g.block_size, g.hash_seed) == (block_size, hash_seed);
        let try_each = |groups: &[Group]| {
            for g in groups.iter().filter(same) {
                match g.index.add_labeled_stream(config, label.clone()) {
                    Err(SharedError::Full { .. }) => continue,
                    added => return Some(added),
                }
            }
            None
        };
        // The read guard ends with this statement, before the write lock below.
        let first = try_each(&crate::sync::read(&self.groups));
        let added = match first {
            Some(added) => added,
            None => {
                let mut groups = self.groups.write().unwrap_or_else(|e| e.into_inner());
                match try_each(&groups) {
                    Some(added) => added,
                    None => {
                        let index = SharedIndex::new(block_size, hash_seed, MAX_STREAMS);
                        let id = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
                        let added = index.add_labeled_stream(config, label);
                        groups.push(Group { id, block_size, hash_seed, index });
                        added
                    }
                }
            }
        };
        let mut writer = added?;
        writer.publish();
        Ok(writer)
    }

    /// How much of `tokens` every stream holds, ordered by instance name then rank.
    pub fn read(&self, tokens: &[i32]) -> Vec<StreamHit> {
        self.read_in(tokens, &QueryScope::default())
    }

    /// [`Self::read`] for the streams `scope` admits, with the query's keys in its namespace.
    pub fn read_in(&self, tokens: &[i32], scope: &QueryScope) -> Vec<StreamHit> {
        self.read_scoped(tokens, scope, false)
    }

    /// [`Self::read_in`] with each hit carrying the query's keys (for predict-on-route).
    pub fn read_keyed_in(&self, tokens: &[i32], scope: &QueryScope) -> Vec<StreamHit> {
        self.read_scoped(tokens, scope, true)
    }

    fn read_scoped(&self, tokens: &[i32], scope: &QueryScope, keyed: bool) -> Vec<StreamHit> {
        let make = |s: SlotRead, hit, keys: &Arc<[ContentKey]>, block_size| StreamHit {
            matched: stream_match(&s, hit),
            identity: s.label.identity.clone(),
            tenant: s.label.tenant.clone(),
            keys: Arc::clone(keys),
            block_size,
        };
        self.read_each(tokens, scope, keyed, make, |h| {
            (&h.matched.instance_name, h.matched.dp_rank)
        })
    }

    /// One `make(stream, its (Device, Host-only) hit tokens, the query's keys in its index, the
    /// index's block size)` per stream `scope` admits, ordered by instance name then rank
    /// (`key` gives them back from what `make` made).
    fn read_each<T>(
        &self,
        tokens: &[i32],
        scope: &QueryScope,
        keyed: bool,
        mut make: impl FnMut(SlotRead, (u64, u64), &Arc<[ContentKey]>, u32) -> T,
        key: impl Fn(&T) -> (&String, u32),
    ) -> Vec<T> {
        let mut out: Vec<T> = self.approximate.each(tokens, scope, &mut make);
        // Approximate entries first: sorted below with the streams when there are any.
        let mut read = usize::from(!out.is_empty());
        let mut slots: Vec<SlotRead> = Vec::new();
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        for g in groups.iter().filter(|g| scope.block_size.is_none_or(|b| b == g.block_size)) {
            read += 1;
            let (matches, keys) = HANDLES.with(|h| {
                let mut h = h.borrow_mut();
                let handle = h.entry(g.id).or_insert_with(|| g.index.reader().handle());
                let matches = handle.query_streams_in(scope.namespace, tokens, &mut slots);
                let keys: Arc<[ContentKey]> =
                    if keyed { Arc::from(handle.all_keys(tokens)) } else { Arc::from([]) };
                (matches, keys)
            });
            slots.retain(|s| scope.admits(&s.label, g.block_size));
            out.extend(slots.drain(..).map(|s| {
                let hit = matches.tokens(s.slot);
                make(s, hit, &keys, g.block_size)
            }));
        }
        // Each index lists its streams in this order already (the usual case is one index).
        if read > 1 {
            out.sort_by(|a, b| key(a).cmp(&key(b)));
        }
        out
    }

    /// The query endpoint's answer for `tokens`.
    pub fn query(&self, tokens: &[i32]) -> QueryResponse {
        self.query_in(tokens, &QueryScope::default())
    }

    /// The query endpoint's answer for `tokens` within `scope`.
    pub fn query_in(&self, tokens: &[i32], scope: &QueryScope) -> QueryResponse {
        let make = |s: SlotRead, hit, _: &_, _| stream_match(&s, hit);
        let matches = self.read_each(tokens, scope, false, make, |m| (&m.instance_name, m.dp_rank));
        QueryResponse { input_tokens: tokens.len(), matches }
    }

    /// [`Self::query_in`]'s answer as JSON (`QueryResponse::to_json`), written from the
    /// published labels and statuses without copying them into a [`QueryResponse`] first.
    pub fn query_json_in(&self, tokens: &[i32], scope: &QueryScope) -> Vec<u8> {
        let read = self.read_each(
            tokens,
            scope,
            false,
            |s, hit, _, _| (s, hit),
            |(s, _)| (&s.label.instance_name, s.label.dp_rank),
        );
        answer_json(tokens.len(), read.iter().map(|(s, hit)| match_ref(s, *hit)))
    }
}

/// A stream's entry in the query endpoint's answer, borrowed from what the reader saw.
fn match_ref(s: &SlotRead, (device, host_only): (u64, u64)) -> MatchRef<'_> {
    MatchRef {
        instance_name: &s.label.instance_name,
        dp_rank: s.label.dp_rank,
        synchronized: s.status.synchronized,
        partial: s.status.partial,
        sequence: s.status.sequence,
        device_hit_tokens: device,
        host_only_hit_tokens: host_only,
        reusable_prefix_tokens: device + host_only,
        device_blocks: s.status.device_blocks,
        host_blocks: s.status.host_blocks,
        error: s.status.error.as_deref(),
        approximate: s.status.approximate,
    }
}

/// A stream's entry in the query endpoint's answer, owned.
fn stream_match(s: &SlotRead, hit: (u64, u64)) -> StreamMatch {
    match_ref(s, hit).into()
}

/// Forgets this thread's handles of indexes that no longer exist (a stopped service).
impl Drop for Directory {
    fn drop(&mut self) {
        let ids: Vec<u64> = match self.groups.get_mut() {
            Ok(g) => g.iter().map(|g| g.id).collect(),
            Err(_) => return,
        };
        let _ = HANDLES.try_with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                h.retain(|id, _| !ids.contains(id));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use kvdir::wire::{Batch, EngineHash, Tier};

    use super::*;

    fn label(instance_name: &str, dp_rank: u32) -> StreamLabel {
        StreamLabel { instance_name: instance_name.into(), dp_rank, ..StreamLabel::default() }
    }

    /// A full-state batch: the stream holds one block of `tokens`.
    fn holding(tokens: &[i32]) -> Batch {
        let mut b = Batch::default();
        b.push_cleared(None);
        let n = tokens.len();
        let size = n as u32;
        b.push_stored_with(&[EngineHash(7)], None, n, size, Tier::Device, |out| {
            out.copy_from_slice(tokens)
        });
        b
    }

    #[test]
    fn the_json_answer_is_the_query_answer_in_name_order_across_indexes() {
        let directory = Directory::default();
        let config = |block_size| IndexConfig { block_size, ..IndexConfig::default() };
        let mut b1 = directory.add_stream(config(2), label("b", 1)).unwrap();
        let mut a0 = directory.add_stream(config(4), label("a", 0)).unwrap();
        let mut a2 = directory.add_stream(config(2), label("a\"2", 2)).unwrap();
        b1.apply(1, &holding(&[1, 2])).unwrap();
        b1.publish();
        a0.apply(1, &holding(&[1, 2, 3, 4])).unwrap();
        a0.invalidate("a gap: expected sequence 2, got \"9\"");
        a0.publish();
        a2.publish();
        let tokens = [1, 2, 3, 4];
        let want = directory.query_in(&tokens, &QueryScope::default());
        let order: Vec<_> =
            want.matches.iter().map(|m| (m.instance_name.as_str(), m.dp_rank)).collect();
        assert_eq!(order, [("a", 0), ("a\"2", 2), ("b", 1)]);
        let hits: Vec<_> = want.matches.iter().map(|m| m.device_hit_tokens).collect();
        assert_eq!(hits, [0, 0, 2], "only b holds the query's first block and is synchronized");
        assert!(want.matches[0].error.is_some());
        let json = directory.query_json_in(&tokens, &QueryScope::default());
        assert_eq!(String::from_utf8(json).unwrap(), serde_json::to_string(&want).unwrap());
    }

    #[test]
    fn streams_beyond_one_indexs_slots_get_another_index_and_all_answer() {
        let directory = Directory::default();
        let config = IndexConfig { block_size: 2, ..IndexConfig::default() };
        let n = MAX_STREAMS + 2;
        let mut writers: Vec<_> = (0..n)
            .map(|i| directory.add_stream(config, label("s", i as u32)).expect("room for all"))
            .collect();
        let last = writers.last_mut().unwrap();
        last.apply(1, &holding(&[1, 2])).unwrap();
        last.publish();
        let r = directory.query(&[1, 2]);
        assert_eq!(r.matches.len(), n, "every stream is listed");
        let ranks: Vec<u32> = r.matches.iter().map(|m| m.dp_rank).collect();
        assert_eq!(ranks, (0..n as u32).collect::<Vec<_>>(), "in rank order across indexes");
        assert_eq!(r.matches[n - 1].device_hit_tokens, 2, "the overflow stream's blocks count");
        writers.clear();
        assert!(directory.query(&[1, 2]).matches.is_empty(), "dropped writers free their slots");
    }
}
