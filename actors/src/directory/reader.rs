//! The directory's read side: every read walks each shared index once, with one hashing pass
//! per query whatever the number of indexes.
//!
//! Each thread keeps a [`Reader`] (thread-local): a reader handle per index and the query's
//! keys per `(block_size, hash_seed)` ([`PromptKeys`]). A query starts the keys once; each
//! index's walk reads the keys hashed so far and hashes further blocks only as far as one of
//! its streams may still match, so a fleet of 32 indexes hashes each block at most once (it
//! hashed the prompt 32 times before). Reads that carry the keys (routing) and the engines
//! without KV events take the completed keys, shared as one `Arc` per block size and seed.
//!
//! Two shapes of read:
//! - [`Directory::read_each`]: one entry per stream in scope, by name then rank (the query
//!   answer of a small fleet, the indexer API, routing of a small fleet);
//! - [`Directory::read_credit`]: only the streams holding a prefix of the query, and the
//!   counts of the rest ([`Counts`]): what a large fleet's answers and routing read, without
//!   touching the streams that hold nothing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use kvdir::index::{ContentKey, Namespace, PromptKeys, SharedHandle, SharedMatches, SlotRead};
use kvdir::index::{TokenId, ViewRead};
use kvdir::query::QueryScope;

use super::{approximate::HASH_SEED, Directory, Group};

thread_local! {
    /// This thread's reader.
    static READER: RefCell<Reader> = RefCell::new(Reader::default());
}

/// One query's keys for one `(block_size, hash_seed)`.
struct QueryKeys {
    keys: PromptKeys,
    /// Started for the current query.
    started: bool,
    /// The completed keys, once a read asked for them in this query.
    full: Option<Arc<[ContentKey]>>,
}

/// See the module documentation.
#[derive(Default)]
pub(super) struct Reader {
    /// This thread's handle of each index it has read, by index id.
    handles: HashMap<u64, SharedHandle>,
    keys: Vec<QueryKeys>,
    ns: Namespace,
}

impl Reader {
    /// Runs `f` with this thread's reader, a new query in namespace `ns` begun.
    pub(super) fn with<R>(ns: Namespace, f: impl FnOnce(&mut Reader) -> R) -> R {
        READER.with(|r| {
            let mut r = r.borrow_mut();
            r.ns = ns;
            r.keys.iter_mut().for_each(|k| (k.started, k.full) = (false, None));
            f(&mut r)
        })
    }

    /// Forgets the handles of indexes `ids` (a stopped service), if this thread is not reading.
    pub(super) fn forget(ids: &[u64]) {
        let _ = READER.try_with(|r| {
            if let Ok(mut r) = r.try_borrow_mut() {
                r.handles.retain(|id, _| !ids.contains(id));
            }
        });
    }

    fn keys_of(keys: &mut Vec<QueryKeys>, ns: Namespace, settings: (u32, u64)) -> &mut QueryKeys {
        let i = match keys.iter().position(|k| k.keys.settings() == settings) {
            Some(i) => i,
            None => {
                let (block_size, seed) = settings;
                let new = QueryKeys {
                    keys: PromptKeys::new(block_size, seed),
                    started: false,
                    full: None,
                };
                keys.push(new);
                keys.len() - 1
            }
        };
        let k = &mut keys[i];
        if !k.started {
            k.keys.start(ns);
            k.started = true;
        }
        k
    }

    /// Every key of `tokens` under `(block_size, seed)`, hashing only those not hashed yet in
    /// this query.
    pub(super) fn full_keys<T: TokenId>(
        &mut self,
        settings: (u32, u64),
        tokens: &[T],
    ) -> Arc<[ContentKey]> {
        let k = Self::keys_of(&mut self.keys, self.ns, settings);
        if k.full.is_none() {
            k.full = Some(Arc::from(k.keys.complete(tokens)));
        }
        Arc::clone(k.full.as_ref().expect("set above"))
    }

    /// The keys a read's entries in index `g` carry: the query's complete keys when the read
    /// is `keyed`, else `none`.
    fn entry_keys<T: TokenId>(
        &mut self,
        g: &Group,
        tokens: &[T],
        keyed: bool,
        none: &Arc<[ContentKey]>,
    ) -> Arc<[ContentKey]> {
        match keyed {
            true => self.full_keys((g.block_size, g.hash_seed), tokens),
            false => Arc::clone(none),
        }
    }

    /// Walks index `g` for `tokens` with the query's shared keys; `f` reads the matches'
    /// streams under the same published copy.
    fn walk<T: TokenId>(
        &mut self,
        g: &Group,
        tokens: &[T],
        f: impl FnOnce(&SharedMatches, ViewRead<'_>),
    ) -> SharedMatches {
        let handle = self.handles.entry(g.id).or_insert_with(|| g.index.reader().handle());
        let k = Self::keys_of(&mut self.keys, self.ns, (g.block_size, g.hash_seed));
        handle.walk_with(&mut k.keys, tokens, f)
    }

    /// The completed keys of this query, by `(block_size, hash_seed)`.
    pub(super) fn completed(&self) -> Vec<SettingKeys> {
        let full = self.keys.iter().filter(|k| k.started);
        full.filter_map(|k| Some((k.keys.settings(), Arc::clone(k.full.as_ref()?)))).collect()
    }

    /// `f` over index `g`'s published streams, without a walk.
    pub(super) fn view<R>(&mut self, g: &Group, f: impl FnOnce(ViewRead<'_>) -> R) -> R {
        let handle = self.handles.entry(g.id).or_insert_with(|| g.index.reader().handle());
        handle.view_with(f)
    }
}

/// The streams in a read's scope that [`Directory::read_credit`] did not list, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Streams in scope (an engine without KV events once per DP rank).
    pub streams: u64,
    /// Of those, holding a prefix of the query.
    pub with_credit: u64,
    /// Of those, unsynchronized.
    pub unsynchronized: u64,
}

/// A prompt's keys under one `(block_size, hash_seed)`.
pub(super) type SettingKeys = ((u32, u64), Arc<[ContentKey]>);

/// What a read gives `make` for each stream: the stream, its (Device, Host-only) hit tokens,
/// the query's keys in its index (empty unless the read is keyed) and its block size.
pub(super) type Make<'a, T> = dyn FnMut(SlotRead, (u64, u64), &Arc<[ContentKey]>, u32) -> T + 'a;

impl Directory {
    /// The entries in `scope`: streams and engines without KV events (one per DP rank).
    pub(super) fn entries_in(&self, r: &mut Reader, scope: &QueryScope) -> usize {
        let groups = crate::sync::read(&self.groups);
        let mut n = self.approximate.count_in(scope);
        for g in groups.iter().filter(|g| scope.admits_block_size(g.block_size)) {
            n += r.view(g, |v| match scope.admits_every_label() {
                true => v.order().len(),
                false => v
                    .order()
                    .iter()
                    .filter_map(|&slot| v.stream(slot))
                    .filter(|(label, _)| scope.admits(label, g.block_size))
                    .count(),
            });
        }
        n
    }

    /// One `make(...)` ([`Make`]) per stream `scope` admits, ordered by instance name then
    /// rank (`key` gives them back from what `make` made); with `keyed`, each gets the
    /// query's complete keys in its index.
    pub(super) fn read_each<T>(
        &self,
        r: &mut Reader,
        tokens: &[i32],
        scope: &QueryScope,
        keyed: bool,
        make: &mut Make<'_, T>,
        key: impl Fn(&T) -> (&String, u32),
    ) -> Vec<T> {
        let groups = crate::sync::read(&self.groups);
        {
            let mut out: Vec<T> = {
                let mut keys = |b| r.full_keys((b, HASH_SEED), tokens);
                self.approximate
                    .each(scope, &mut keys, &mut |s, hit, k, b| Some(make(s, hit, k, b)))
            };
            // Approximate entries first: sorted below with the streams when there are any.
            let mut read = usize::from(!out.is_empty());
            let none: Arc<[ContentKey]> = Arc::from([]);
            for g in groups.iter().filter(|g| scope.admits_block_size(g.block_size)) {
                read += 1;
                let keys = r.entry_keys(g, tokens, keyed, &none);
                r.walk(g, tokens, |m, view| {
                    for &slot in view.order() {
                        let Some((label, status)) = view.stream(slot) else { continue };
                        if scope.admits(label, g.block_size) {
                            let s = SlotRead { slot, label: label.clone(), status: status.clone() };
                            out.push(make(s, m.tokens(slot), &keys, g.block_size));
                        }
                    }
                });
            }
            // Each index lists its streams in this order already (the usual case is one index).
            if read > 1 {
                out.sort_by(|a, b| key(a).cmp(&key(b)));
            }
            out
        }
    }

    /// One `make(...)` ([`Make`]) per stream `scope` admits that holds a prefix of `tokens`,
    /// by name then rank within each index (the indexes one after the other: where each run
    /// ends is the last of the answer), and the [`Counts`] of every stream in scope. Streams
    /// without credit cost a count, not an entry.
    pub(super) fn read_credit<T>(
        &self,
        r: &mut Reader,
        tokens: &[i32],
        scope: &QueryScope,
        keyed: bool,
        make: &mut Make<'_, T>,
    ) -> (Vec<T>, Counts, Vec<usize>) {
        let groups = crate::sync::read(&self.groups);
        let mut counts = Counts::default();
        let mut runs = Vec::with_capacity(groups.len() + 1);
        let out = {
            let mut out: Vec<T> = {
                let mut keys = |b| r.full_keys((b, HASH_SEED), tokens);
                self.approximate.each(scope, &mut keys, &mut |s, hit, k, b| {
                    counts.streams += 1;
                    let credit = hit.0 + hit.1 > 0;
                    counts.with_credit += u64::from(credit);
                    credit.then(|| make(s, hit, k, b))
                })
            };
            runs.push(out.len());
            let none: Arc<[ContentKey]> = Arc::from([]);
            for g in groups.iter().filter(|g| scope.admits_block_size(g.block_size)) {
                let keys = r.entry_keys(g, tokens, keyed, &none);
                let every = scope.admits_every_label();
                r.walk(g, tokens, |m, view| {
                    count(view, scope, g.block_size, &mut counts);
                    // In name order (the view's), so that the entries of one index are sorted.
                    let hit = view.order().iter().filter(|&&slot| m.hit & (1u128 << slot) != 0);
                    for &slot in hit {
                        let Some((label, status)) = view.stream(slot) else { continue };
                        if every || scope.admits(label, g.block_size) {
                            counts.with_credit += 1;
                            let s = SlotRead { slot, label: label.clone(), status: status.clone() };
                            out.push(make(s, m.tokens(slot), &keys, g.block_size));
                        }
                    }
                });
                runs.push(out.len());
            }
            out
        };
        (out, counts, runs)
    }
}

/// Adds the streams of one view in `scope` to `counts` (all but those with credit).
fn count(view: ViewRead<'_>, scope: &QueryScope, block_size: u32, counts: &mut Counts) {
    if scope.admits_every_label() {
        let present = view.order().len() as u64;
        let synchronized = u64::from(view.synchronized().count_ones());
        counts.streams += present;
        counts.unsynchronized += present.saturating_sub(synchronized);
        return;
    }
    for &slot in view.order() {
        if let Some((label, status)) = view.stream(slot) {
            if scope.admits(label, block_size) {
                counts.streams += 1;
                counts.unsynchronized += u64::from(!status.synchronized);
            }
        }
    }
}
