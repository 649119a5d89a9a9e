//! What routing reads of the directory for one request ([`RouteRead`]), and the streams of one
//! instance on demand ([`Directory::streams_of`]).
//!
//! A small fleet's read lists every stream in scope, as it always did. A large one's (past
//! [`kvdir::query::LIST_THRESHOLD`] streams) lists only the streams holding a prefix of the prompt: routing
//! needs nothing else of the others to decide, since a rank without credit adds nothing to any
//! score. Two things do need an instance's other ranks: the predicted credit of an instance
//! kvdir recently routed the prompt to (each rank must be synchronized and of the instance's
//! process), and the answer's report on a listed instance (its `dp_hits`, and the state the
//! front door's headers give). For those few instances the router asks
//! [`Directory::streams_of`], which finds them through the [`Roster`]: instance name -> the
//! slots its streams were given, checked against the published labels on every read.
//!
//! Invariant: the read's entries are ordered by instance handle ([`super::Handles`], a number
//! per name that the labels carry), then rank: each instance's entries are together and found
//! by its handle, with no name compared.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use kvdir::index::{ContentKey, SlotRead};
use kvdir::query::QueryScope;

use super::reader::{Counts, Reader, SettingKeys};
use super::{approximate::HASH_SEED, Directory, StreamHit};

/// Every stream's hits for one request, as routing reads them.
#[derive(Debug, Clone)]
pub struct RouteRead {
    /// The entries, ordered by instance handle then rank: every stream in scope when
    /// `complete`, else only the streams holding a prefix of the prompt.
    pub hits: Vec<StreamHit>,
    /// Whether `hits` lists every stream in scope.
    pub complete: bool,
    /// The streams in scope, counted.
    pub counts: Counts,
    /// The prompt's keys under each `(block_size, hash_seed)` read.
    keys: Vec<SettingKeys>,
    /// The request's scope.
    scope: QueryScope,
    /// Where each instance's entries are in `hits`, in order.
    instances: Vec<Range<usize>>,
}

impl RouteRead {
    /// The entries of the instance whose handle is `handle` ([`super::Handles`]).
    pub fn of(&self, handle: u32) -> &[StreamHit] {
        let start = self.hits.partition_point(|h| h.label.instance_handle < handle);
        let end = self.hits.partition_point(|h| h.label.instance_handle <= handle);
        &self.hits[start..end]
    }

    /// Where each instance's entries are in `hits`, in order: found once per read, for the
    /// router's passes over the instances (each compared every neighbour's name before).
    pub fn instances(&self) -> &[Range<usize>] {
        &self.instances
    }

    /// The prompt's keys under every block size and seed read.
    pub fn keys(&self) -> impl Iterator<Item = (u32, &Arc<[ContentKey]>)> {
        self.keys.iter().map(|((block_size, _), k)| (*block_size, k))
    }

    /// A read of these entries alone (tests and benchmarks), ordered as a read is.
    pub fn of_hits(mut hits: Vec<StreamHit>) -> Self {
        hits.sort_by_key(StreamHit::by_handle);
        let counts = Counts { streams: hits.len() as u64, ..Counts::default() };
        let instances = instance_ranges(&hits);
        let scope = QueryScope::default();
        RouteRead { hits, complete: true, counts, keys: Vec::new(), scope, instances }
    }
}

/// Where each instance's entries are in `hits` (ordered by instance handle).
fn instance_ranges(hits: &[StreamHit]) -> Vec<Range<usize>> {
    let mut at = 0;
    let group = hits.chunk_by(|a, b| a.label.instance_handle == b.label.instance_handle);
    group
        .map(|g| {
            at += g.len();
            at - g.len()..at
        })
        .collect()
}

/// Where each instance's streams were placed: its name -> (index position, slot). Entries
/// are added when a stream joins and checked against the published label when read, so a
/// slot freed and reused by another instance is skipped; [`Roster::prune`] drops them.
#[derive(Debug, Default)]
pub(super) struct Roster {
    by_instance: HashMap<String, Vec<(usize, u8)>>,
    entries: usize,
}

impl Roster {
    /// Stream `slot` of index `group` belongs to `instance` (once per place).
    pub fn add(&mut self, instance: &str, group: usize, slot: u8) {
        let places = self.by_instance.entry(instance.to_string()).or_default();
        if !places.contains(&(group, slot)) {
            places.push((group, slot));
            self.entries += 1;
        }
    }

    /// The places given to `instance`'s streams, current or not.
    pub fn of(&self, instance: &str) -> &[(usize, u8)] {
        self.by_instance.get(instance).map_or(&[], Vec::as_slice)
    }

    /// Places recorded, current or not.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Keeps the places `current` says an instance's stream still holds.
    pub fn prune(&mut self, mut current: impl FnMut(&str, usize, u8) -> bool) {
        self.by_instance.retain(|name, places| {
            places.retain(|&(g, s)| current(name, g, s));
            !places.is_empty()
        });
        self.entries = self.by_instance.values().map(Vec::len).sum();
    }
}

impl Directory {
    /// What routing reads for `tokens` within `scope` (see the module documentation): every
    /// stream up to `LIST_THRESHOLD` of them or with `"list": "all"`, past it the streams
    /// holding a prefix; the keys of the prompt, complete, in every index read.
    pub fn read_route(&self, tokens: &[i32], scope: &QueryScope) -> RouteRead {
        let mut make =
            |s, hit, keys: &Arc<[ContentKey]>, block_size| StreamHit::new(s, hit, keys, block_size);
        Reader::with(scope.namespace, |r| {
            let complete = !scope.list.is_compact(self.entries_in(r, scope));
            let (mut hits, counts) = match complete {
                true => {
                    let hits =
                        self.read_each(r, tokens, scope, true, &mut make, StreamHit::by_name);
                    let streams = hits.len() as u64;
                    (hits, Counts { streams, ..Counts::default() })
                }
                false => {
                    let (hits, counts, _) = self.read_credit(r, tokens, scope, true, &mut make);
                    (hits, counts)
                }
            };
            hits.sort_by_key(StreamHit::by_handle);
            let keys = r.completed();
            let instances = instance_ranges(&hits);
            RouteRead { hits, complete, counts, keys, scope: scope.clone(), instances }
        })
    }

    /// The streams of `instance` in `read`'s scope that `read` does not list (they hold no
    /// prefix of its prompt), with zero hits and the prompt's keys in their index, ordered by
    /// rank; engines without KV events included.
    pub fn streams_of(&self, instance: &str, read: &RouteRead) -> Vec<StreamHit> {
        let listed = self.handles.get(instance).map_or(&[][..], |h| read.of(h));
        let new = |h: &StreamHit| !listed.iter().any(|l| l.dp_rank() == h.dp_rank());
        let keys = |settings: (u32, u64)| {
            let found = read.keys.iter().find(|(s, _)| *s == settings);
            found.map_or_else(|| Arc::from([]), |(_, k)| Arc::clone(k))
        };
        let only = QueryScope { instance: Some(instance.to_string()), ..read.scope.clone() };
        let mut out: Vec<StreamHit> =
            self.approximate.each(&only, &mut |b| keys((b, HASH_SEED)), &mut |s, _, k, b| {
                Some(StreamHit::new(s, (0, 0), k, b)).filter(|h| new(h))
            });
        let places: Vec<(usize, u8)> = crate::sync::lock(&self.roster).of(instance).to_vec();
        let groups = crate::sync::read(&self.groups);
        Reader::with(read.scope.namespace, |r| {
            for (g, slot) in places {
                let Some(g) = groups.get(g) else { continue };
                r.view(g, |v| {
                    let Some((label, status)) = v.stream(slot) else { return };
                    if label.instance_name == instance && only.admits(label, g.block_size) {
                        let s = SlotRead { slot, label: label.clone(), status: status.clone() };
                        let k = keys((g.block_size, g.hash_seed));
                        out.push(StreamHit::new(s, (0, 0), &k, g.block_size));
                    }
                });
            }
        });
        out.retain(|h| new(h));
        out.sort_by_key(StreamHit::dp_rank);
        out.dedup_by_key(|h| h.dp_rank());
        out
    }
}
