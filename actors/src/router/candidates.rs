//! The candidates of one decision: the instance snapshot with each instance's per-DP hits from
//! the request's [`RouteRead`], and, after a compact decision, the listed candidates' other
//! ranks.
//!
//! A large fleet's read lists only the streams holding a prefix of the prompt
//! (`directory/route_read.rs`). A rank it does not list has no exact credit, which scores the
//! same as a rank listed with zero, so the decision needs nothing more, except where
//! predict-on-route expects the prompt on an instance: each of its ranks must then be
//! synchronized and of the instance's process to be credited, so its other streams are read
//! ([`Directory::streams_of`](crate::directory::Directory::streams_of)) before scoring. The
//! candidates a compact answer lists get theirs after the decision, so that their `dp_hits`
//! and the chosen instance's stream state (the front door's headers) are whole.

use std::borrow::Cow;
use std::ops::Range;

use kvdir::car::{
    reusable_limit, Candidate, DpHit, DpRouting, Fleet, PromptId, QueuedWork, Routed, Side,
};

use super::{predict, InstanceInfo, Router};
use crate::directory::{RouteRead, StreamHit};

impl Router {
    /// The instance snapshot with each instance's per-DP hits and, in its queue, the front
    /// door's requests started since its latest load report; siblings of `prompt` (given only
    /// when predicting) are left out of both. A rank gives credit only when its stream was
    /// started for the instance's current process; streams without an identity (static
    /// configuration) give none. Each rank's `predicted_hit_tokens` is the instance's
    /// predicted prefix beyond it. Every hit is at most what the engine reuses of a prompt of
    /// `input_tokens` ([`reusable_limit`]: never its last token, whole blocks only). They are
    /// written over `out`'s, reusing their buffers.
    /// `listed`: [`Self::listed`].
    pub(super) fn candidates(
        &self,
        read: &RouteRead,
        listed: &[Option<usize>],
        request: (usize, Option<PromptId>, u64),
        out: &mut Vec<Candidate>,
    ) {
        out.truncate(self.instances.len());
        let ranges = self.ranges(read, listed);
        for (k, (info, range)) in self.instances.iter().zip(ranges).enumerate() {
            match out.get_mut(k) {
                Some(c) => c.clone_from(&info.candidate),
                None => out.push(info.candidate.clone()),
            }
            self.fill(k, &read.hits[range], read, request, &mut out[k]);
        }
    }

    /// Gives `c`, a copy of the candidate of the instance at position `k`, its queue, queued
    /// work and hits for the request ([`Self::candidates`]); `listed`: its entries in `read`.
    fn fill(
        &self,
        k: usize,
        listed: &[StreamHit],
        read: &RouteRead,
        (input_tokens, prompt, now_ms): (usize, Option<PromptId>, u64),
        c: &mut Candidate,
    ) {
        let (info, id) = (&self.instances[k], self.ids.at(k));
        c.queued = self.ledger.queued(&id);
        if let Some(load) = &mut c.load {
            let reports = info.load_reports;
            let counted = self.inflight.reported_siblings(&id, reports, prompt);
            load.waiting_requests_num = load.waiting_requests_num.saturating_sub(counted)
                + self.inflight.unreported_besides(&id, reports, prompt);
        }
        let predicted = predict::predicted_tokens(&self.predictions, now_ms, &id, listed, read);
        let whole = listed.len() >= c.dp_size.max(1) as usize;
        let hits = match predicted > 0 && !read.complete && !whole {
            true => self.instance_hits(read, &c.name),
            false => Cow::Borrowed(listed),
        };
        c.hits.extend(hits.iter().map(|h| dp_hit(info, h, input_tokens, predicted)));
    }

    /// The candidates of the instances a compact decision must build
    /// ([`kvdir::car::route_pruned`]), in position order, leaving out `excluded` (positions):
    /// those `read` lists on every rank or that have kvdir choose their rank, those with
    /// predictions on the prompt's keys, and those with siblings of `prompt` in flight. Every
    /// other instance is credited nothing ([`Plain`]).
    pub(super) fn credited(
        &self,
        read: &RouteRead,
        listed: &[Option<usize>],
        request: (usize, Option<PromptId>, u64),
        excluded: &[usize],
    ) -> Vec<(usize, Candidate)> {
        // Each instance's entries by position: no name compared or looked up again.
        let ranges = self.ranges(read, listed);
        let entries = |i: usize| &read.hits[ranges[i].clone()];
        let whole = |&i: &usize| {
            let c = &self.instances[i].candidate;
            ranges[i].len() >= c.dp_size.max(1) as usize || c.dp_routing != DpRouting::Engine
        };
        let listed = listed.iter().flatten().copied().filter(whole);
        let (_, prompt, now_ms) = request;
        let predicted = self.predictions.instances().filter_map(|&id| {
            let i = self.ids.position(id)?;
            (predict::predicted_tokens(&self.predictions, now_ms, &id, entries(i), read) > 0)
                .then_some(i)
        });
        let holding = self.inflight.holding(prompt).filter_map(|&id| self.ids.position(id));
        let others = predicted.chain(holding);
        let mut at: Vec<usize> = listed.chain(others).collect();
        at.sort_unstable();
        at.dedup();
        at.retain(|i| !excluded.contains(i));
        at.into_iter().map(|i| (i, self.built(i, entries(i), read, request))).collect()
    }

    /// Instance `i`'s candidate for the request ([`Self::candidates`]), `listed`: its entries
    /// in `read`.
    fn built(
        &self,
        i: usize,
        listed: &[StreamHit],
        read: &RouteRead,
        request: (usize, Option<PromptId>, u64),
    ) -> Candidate {
        let mut c = self.instances[i].candidate.clone();
        self.fill(i, listed, read, request, &mut c);
        c
    }

    /// The position of each instance `read` lists ([`RouteRead::instances`]), if known: by
    /// its handle, no name hashed or compared, once per decision for the passes over the read.
    pub(super) fn listed(&self, read: &RouteRead) -> Vec<Option<usize>> {
        let handle = |r: &Range<usize>| read.hits[r.start].label.instance_handle as usize;
        let position = |r| self.by_handle.get(handle(r)).copied().filter(|&p| p != usize::MAX);
        read.instances().iter().map(position).collect()
    }

    /// Each known instance's entries in `read` (`listed`: [`Self::listed`]).
    fn ranges(&self, read: &RouteRead, listed: &[Option<usize>]) -> Vec<Range<usize>> {
        let mut ranges: Vec<Range<usize>> = vec![0..0; self.instances.len()];
        for (range, &i) in read.instances().iter().zip(listed) {
            if let Some(i) = i {
                ranges[i] = range.clone();
            }
        }
        ranges
    }

    /// Every stream of `instance` in `read`'s scope, by rank: the read's entries and, when the
    /// read lists only the streams with credit, the others from the directory.
    pub(super) fn instance_hits<'a>(
        &self,
        read: &'a RouteRead,
        instance: &str,
    ) -> Cow<'a, [StreamHit]> {
        let at = self.positions.get(instance);
        let listed = at.map_or(&[][..], |&i| read.of(self.handles[i]));
        if read.complete {
            return Cow::Borrowed(listed);
        }
        let mut all: Vec<StreamHit> = listed.to_vec();
        all.extend(self.directory.streams_of(instance, read));
        all.sort_by_key(StreamHit::dp_rank);
        Cow::Owned(all)
    }

    /// Gives each prefill candidate a compact answer lists its ranks without credit too.
    pub(super) fn complete_reports(&self, r: &mut Routed, read: &RouteRead, input_tokens: usize) {
        for report in r.candidates.iter_mut().filter(|c| c.side == Side::Prefill) {
            let Some(&i) = self.positions.get(&report.name) else { continue };
            let info = &self.instances[i];
            let missing = self.directory.streams_of(&report.name, read);
            if missing.is_empty() {
                continue;
            }
            let known = |rank| report.dp_hits.iter().any(|h| h.dp_rank == rank);
            let more: Vec<DpHit> = missing
                .iter()
                .filter(|h| !known(h.dp_rank()))
                .map(|h| dp_hit(info, h, input_tokens, 0))
                .collect();
            report.dp_hits.extend(more);
            report.dp_hits.sort_by_key(|h| h.dp_rank);
        }
    }
}

/// Stream `h`'s hit on `info`'s instance for a prompt of `input_tokens`, within what the
/// engine reuses, with the instance's `predicted` tokens beyond it.
fn dp_hit(info: &InstanceInfo, h: &StreamHit, input_tokens: usize, predicted: u64) -> DpHit {
    let limit = reusable_limit(input_tokens, h.block_size);
    let identity = h.label.identity.as_ref();
    let hit = DpHit {
        dp_rank: h.dp_rank(),
        synchronized: h.status.synchronized,
        partial: h.status.partial,
        identity_matches: identity.is_some_and(|id| id.same_process(&info.identity)),
        device_hit_tokens: h.hit.0,
        host_only_hit_tokens: h.hit.1,
        predicted_hit_tokens: 0,
        approximate: h.status.approximate,
    }
    .within(limit);
    let exact = hit.device_hit_tokens + hit.host_only_hit_tokens;
    DpHit { predicted_hit_tokens: predicted.min(limit).saturating_sub(exact), ..hit }
}

/// The router's instances as a compact decision reads those it does not build
/// ([`kvdir::car::Fleet`]) for one request: no siblings of the prompt in flight there, so the
/// queue is the reported one plus the front door's requests started since; and the rank the
/// client pinned, if any.
pub(super) struct Plain<'a>(
    pub &'a Router,
    pub &'a RouteRead,
    pub (usize, Option<PromptId>, u64),
    pub Option<u32>,
);

impl Fleet for Plain<'_> {
    fn len(&self) -> usize {
        self.0.instances.len()
    }

    fn base(&self, i: usize) -> &Candidate {
        &self.0.instances[i].candidate
    }

    fn waiting(&self, i: usize) -> u64 {
        let info = &self.0.instances[i];
        let reported = info.candidate.load.map_or(0, |l| l.waiting_requests_num);
        reported + self.0.inflight.unreported(&self.0.ids.at(i), info.load_reports)
    }

    fn queued(&self, i: usize) -> QueuedWork {
        self.0.ledger.queued(&self.0.ids.at(i))
    }

    fn plain(&self, i: usize) -> Candidate {
        let listed = self.1.of(self.0.handles[i]);
        let mut c = self.0.built(i, listed, self.1, self.2);
        super::pin(std::iter::once(&mut c), self.3);
        c
    }

    fn pinned(&self) -> Option<u32> {
        self.3
    }
}
