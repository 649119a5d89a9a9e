//! [`Directory`]: the service's KV-cache directory, what every read asks "who holds this
//! prompt?": the shared query indexes, one per `(block_size, hash_seed)` and 128 streams, the
//! approximate credit of engines without KV events, and the read path of the HTTP handlers and
//! the router.
//!
//! A stream joins with [`Directory::add_stream`] and gets the [`StreamWriter`] its IndexActor
//! owns; dropping the writer removes all of the stream's bits and frees its slot in one publish.
//! Readers call the directory from any thread, with no lock on the index and no actor
//! mailbox: each thread keeps one `SharedHandle` per index and the query's keys (thread-local,
//! `reader.rs`), hashes the query once whatever the number of indexes and walks each index
//! once for all of its streams.
//!
//! Answers do not grow with the fleet: past [`kvdir::query::LIST_THRESHOLD`] streams in scope, the query
//! endpoint lists only the streams holding a prefix of the query, longest first, and a summary
//! of the rest ([`Directory::query_json_in`]), and routing reads only those streams
//! ([`Directory::read_route`], `route_read.rs`), asking for an instance's other streams when
//! it needs them ([`Directory::streams_of`]). A request may ask for every stream
//! (`"list": "all"`).
//!
//! Invariants: an entry is listed exactly while its stream's slot is labelled in the published
//! view, and its hits, status and identity come from that same published copy, so a reused slot
//! never lends an old stream's bits or name to a new one; an unsynchronized stream gives zero.
//!
//! Engines without KV events have no stream: every read also lists them, one entry per DP
//! rank marked `approximate`, from [`Approximate`] (`approximate.rs`), which the router credits
//! with what it routes.

mod approximate;
mod handles;
mod reader;
mod route_read;

pub use approximate::Approximate;
pub use handles::Handles;
pub use reader::Counts;
pub use route_read::RouteRead;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use kvdir::index::{
    ContentKey, IndexConfig, SharedError, SharedIndex, SlotRead, StreamLabel, StreamStatus,
    StreamWriter, MAX_STREAMS,
};
use kvdir::query::{
    answer_json, longest_first, MatchRef, QueryResponse, QueryScope, QuerySummary, StreamMatch,
};

use reader::Reader;
use route_read::Roster;

/// Milliseconds on a monotonic clock (since the first call in this process): the clock of
/// approximate credit and of the router's predictions, overload deadlines and queued work.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Ids of indexes, unique in the process (several services may share a thread in tests).
static NEXT_INDEX: AtomicU64 = AtomicU64::new(0);

struct Group {
    id: u64,
    block_size: u32,
    hash_seed: u64,
    index: SharedIndex,
}

/// The directory of one service: its shared indexes and its approximate credit.
pub struct Directory {
    /// The indexes, in the order they were made (a position never changes).
    groups: RwLock<Vec<Group>>,
    /// Engines without KV events and their approximate credit.
    approximate: Approximate,
    /// Where each instance's streams were placed.
    roster: Mutex<Roster>,
    /// A number per instance name, which every entry's label carries.
    handles: Arc<Handles>,
}

impl Default for Directory {
    fn default() -> Self {
        Directory::new(kvdir::car::ApproxSettings::default())
    }
}

/// One stream's entry in a read: who it is, its status and its hit, as one published copy
/// of its index showed them (shared, not copied: a read of thousands of streams allocates
/// nothing per stream).
#[derive(Debug, Clone)]
pub struct StreamHit {
    /// Who the stream is: instance, rank, the engine process (discovery only), tenant.
    pub label: Arc<StreamLabel>,
    /// Its published status.
    pub status: Arc<StreamStatus>,
    /// Its Device and Host-only hit tokens.
    pub hit: (u64, u64),
    /// The query's content keys under this stream's index (keyed reads: routing; empty from
    /// the other reads), shared by the streams of every index of one block size and seed.
    pub keys: Arc<[ContentKey]>,
    /// Tokens per block of the stream's index (what one of `keys` covers).
    pub block_size: u32,
}

impl StreamHit {
    /// The entry of stream `s` with `hit` (Device, Host-only) tokens.
    fn new(s: SlotRead, hit: (u64, u64), keys: &Arc<[ContentKey]>, block_size: u32) -> Self {
        StreamHit { label: s.label, status: s.status, hit, keys: Arc::clone(keys), block_size }
    }

    /// The instance.
    pub fn instance_name(&self) -> &str {
        &self.label.instance_name
    }

    /// The DP rank.
    pub fn dp_rank(&self) -> u32 {
        self.label.dp_rank
    }

    /// Its instance name and rank.
    pub fn by_name(&self) -> (&String, u32) {
        (&self.label.instance_name, self.label.dp_rank)
    }

    /// Its instance's handle ([`Handles`]) and rank, the order of a routing read.
    pub fn by_handle(&self) -> (u32, u32) {
        (self.label.instance_handle, self.label.dp_rank)
    }

    /// Device plus Host-only hit tokens.
    pub fn tokens(&self) -> u64 {
        self.hit.0 + self.hit.1
    }

    /// What the query endpoint reports for it.
    pub fn matched(&self) -> StreamMatch {
        let s = SlotRead { slot: 0, label: self.label.clone(), status: self.status.clone() };
        stream_match(&s, self.hit)
    }
}

impl Directory {
    /// No stream yet; engines without KV events get approximate credit with `settings`.
    pub fn new(settings: kvdir::car::ApproxSettings) -> Self {
        let handles = Arc::<Handles>::default();
        Directory {
            groups: RwLock::default(),
            approximate: Approximate::new(settings, Arc::clone(&handles)),
            roster: Mutex::default(),
            handles,
        }
    }

    /// The handle of instance `name` ([`Handles`]), which its entries' labels carry; given
    /// now if the name has none (the router numbers its instances before their streams come).
    pub fn instance_handle(&self, name: &str) -> u32 {
        self.handles.of(name)
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
        let name = label.instance_name.clone();
        let label = StreamLabel { instance_handle: self.handles.of(&name), ..label };
        let try_each = |groups: &[Group]| {
            for (i, g) in groups.iter().enumerate() {
                if (g.block_size, g.hash_seed) != (block_size, hash_seed) {
                    continue;
                }
                match g.index.add_labeled_stream(config, label.clone()) {
                    Err(SharedError::Full { .. }) => continue,
                    added => return Some((i, added)),
                }
            }
            None
        };
        // The read guard ends with this statement, before the write lock below.
        let first = try_each(&crate::sync::read(&self.groups));
        let (group, added) = match first {
            Some(added) => added,
            None => {
                let mut groups = crate::sync::write(&self.groups);
                match try_each(&groups) {
                    Some(added) => added,
                    None => {
                        let index = SharedIndex::new(block_size, hash_seed, MAX_STREAMS);
                        let id = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
                        let added = index.add_labeled_stream(config, label);
                        groups.push(Group { id, block_size, hash_seed, index });
                        (groups.len() - 1, added)
                    }
                }
            }
        };
        let mut writer = added?;
        writer.publish();
        self.place(&name, group, writer.slot());
        Ok(writer)
    }

    /// Records that `instance` has a stream in `slot` of index `group`; now and then forgets
    /// the places that are no longer its.
    fn place(&self, instance: &str, group: usize, slot: u8) {
        let mut roster = crate::sync::lock(&self.roster);
        roster.add(instance, group, slot);
        let groups = crate::sync::read(&self.groups);
        if roster.entries() > 2 * groups.len() * MAX_STREAMS + 64 {
            Reader::with(Default::default(), |r| {
                roster.prune(|name, g, slot| {
                    let Some(g) = groups.get(g) else { return false };
                    r.view(g, |v| v.stream(slot).is_some_and(|(l, _)| l.instance_name == name))
                });
            });
        }
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
        let mut make =
            |s, hit, keys: &Arc<[ContentKey]>, block_size| StreamHit::new(s, hit, keys, block_size);
        Reader::with(scope.namespace, |r| {
            self.read_each(r, tokens, scope, keyed, &mut make, StreamHit::by_name)
        })
    }

    /// The query endpoint's answer for `tokens`, every stream listed.
    pub fn query(&self, tokens: &[i32]) -> QueryResponse {
        self.query_in(tokens, &QueryScope::default())
    }

    /// The query endpoint's answer for `tokens` within `scope`, every stream listed.
    pub fn query_in(&self, tokens: &[i32], scope: &QueryScope) -> QueryResponse {
        let mut make = |s: SlotRead, hit, _: &_, _| stream_match(&s, hit);
        let matches = Reader::with(scope.namespace, |r| {
            self.read_each(r, tokens, scope, false, &mut make, match_key)
        });
        QueryResponse { input_tokens: tokens.len(), matches, summary: None }
    }

    /// The query endpoint's answer as JSON (`QueryResponse::to_json`), written from the
    /// published labels and statuses without copying them into a [`QueryResponse`] first:
    /// every stream in `scope` up to [`kvdir::query::LIST_THRESHOLD`] of them (or with `"list": "all"`),
    /// past it the streams holding a prefix, longest first, and a [`QuerySummary`].
    pub fn query_json_in(&self, tokens: &[i32], scope: &QueryScope) -> Vec<u8> {
        let mut make = |s: SlotRead, hit, _: &_, _| (s, hit);
        Reader::with(scope.namespace, |r| {
            if !scope.list.is_compact(self.entries_in(r, scope)) {
                let read = self.read_each(r, tokens, scope, false, &mut make, slot_key);
                let matches = read.iter().map(|(s, hit)| match_ref(s, *hit));
                return answer_json(tokens.len(), matches, None);
            }
            let (mut read, counts, runs) = self.read_credit(r, tokens, scope, false, &mut make);
            let unlisted = longest_first(&mut read, &runs, |(s, (d, h))| {
                (d + h, s.label.instance_name.as_str(), s.label.dp_rank)
            });
            let summary = QuerySummary {
                streams: counts.streams,
                with_credit: counts.with_credit,
                unlisted_with_credit: unlisted,
                zero_credit: counts.streams - counts.with_credit,
                unsynchronized: counts.unsynchronized,
            };
            let matches = read.iter().map(|(s, hit)| match_ref(s, *hit));
            answer_json(tokens.len(), matches, Some(&summary))
        })
    }
}

/// The instance name and rank of an entry.
fn match_key(m: &StreamMatch) -> (&String, u32) {
    (&m.instance_name, m.dp_rank)
}

/// The instance name and rank of a read's stream.
fn slot_key((s, _): &(SlotRead, (u64, u64))) -> (&String, u32) {
    (&s.label.instance_name, s.label.dp_rank)
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
        Reader::forget(&ids);
    }
}

#[cfg(test)]
mod tests;
