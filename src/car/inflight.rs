//! [`InFlight`]: the requests a forwarding router sent to each instance and that have not
//! produced their first byte yet. Engines report their queue only now and then; between two
//! reports, the router adds its own unanswered requests started since the latest report to the
//! reported `waiting_requests_num`, so a burst does not all land on the instance that looked
//! idle at the last report.
//!
//! A request counts from [`InFlight::start`] until [`InFlight::first_byte`] or
//! [`InFlight::finish`], and only while no newer load report arrived for its instance (a report
//! received after the start already includes it).
//!
//! Siblings: with predict-on-route on, a request's queue at an instance leaves out the
//! unanswered requests there with the same prompt ([`InFlight::unreported_besides`]; same
//! [`PromptId`]), and those that a load report already counted come off the reported queue
//! ([`InFlight::reported_siblings`]). A sibling queued behind its twin prefills almost nothing (the twin's blocks
//! are cached by then), so it does not wait for a prefill as a different request would; counting
//! it would spread a burst of identical prompts, which is what prediction is there to keep
//! together. Different prompts, even sharing a long system prompt, still count.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use super::names::{InstanceKey, NameMap};

/// Identifies one forwarded request.
pub type RequestId = u64;

/// Identifies a prompt by all of its tokens ([`prompt_id`]). Equal ids are siblings.
pub type PromptId = u128;

/// The id of the prompt `tokens`: XXH3-128 of their little-endian bytes. Prompts differing in
/// one token are not siblings, even in a partial last block.
pub fn prompt_id(tokens: &[i32]) -> PromptId {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxhash_rust::xxh3::xxh3_128(&bytes)
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The instance's report count when the request started.
    reports_at_start: u64,
    /// Whether the first byte came back (the request is past its prefill).
    answered: bool,
    /// Its prompt, when the caller named it.
    prompt: Option<PromptId>,
}

/// Per-instance requests in flight, by instance name or id (`K`).
#[derive(Debug)]
pub struct InFlight<K: ?Sized + InstanceKey = str> {
    next: RequestId,
    by_instance: NameMap<K::Owned, HashMap<RequestId, Entry>>,
}

impl<K: ?Sized + InstanceKey> Default for InFlight<K> {
    fn default() -> Self {
        InFlight { next: 0, by_instance: NameMap::default() }
    }
}

impl<K: ?Sized + InstanceKey + Eq + Hash> InFlight<K> {
    /// A request for `prompt` sent to `instance`, whose load reports numbered `reports` so far.
    pub fn start(&mut self, instance: &K, reports: u64, prompt: Option<PromptId>) -> RequestId {
        self.next += 1;
        let entry = Entry { reports_at_start: reports, answered: false, prompt };
        self.by_instance.entry(instance.owned()).or_default().insert(self.next, entry);
        self.next
    }

    /// The request's first byte came back.
    pub fn first_byte(&mut self, instance: &K, id: RequestId) {
        if let Some(e) = self.by_instance.get_mut(instance).and_then(|m| m.get_mut(&id)) {
            e.answered = true;
        }
    }

    /// The request ended (answered, failed or cancelled).
    pub fn finish(&mut self, instance: &K, id: RequestId) {
        if let Some(m) = self.by_instance.get_mut(instance) {
            m.remove(&id);
            if m.is_empty() {
                self.by_instance.remove(instance);
            }
        }
    }

    /// Unanswered requests to `instance` that its latest report (number `reports`) cannot
    /// include, because they started after it.
    pub fn unreported(&self, instance: &K, reports: u64) -> u64 {
        self.unreported_besides(instance, reports, None)
    }

    /// [`Self::unreported`] without the siblings of `prompt` (requests with the same prompt).
    pub fn unreported_besides(&self, instance: &K, reports: u64, prompt: Option<PromptId>) -> u64 {
        let counts = |e: &&Entry| {
            !e.answered && e.reports_at_start >= reports && (prompt.is_none() || e.prompt != prompt)
        };
        self.by_instance.get(instance).map_or(0, |m| m.values().filter(counts).count() as u64)
    }

    /// Unanswered siblings of `prompt` at `instance` started before its latest report (number
    /// `reports`), which that report counts as waiting; 0 without a prompt id.
    pub fn reported_siblings(&self, instance: &K, reports: u64, prompt: Option<PromptId>) -> u64 {
        let sibling =
            |e: &&Entry| !e.answered && e.reports_at_start < reports && e.prompt == prompt;
        match (prompt, self.by_instance.get(instance)) {
            (Some(_), Some(m)) => m.values().filter(sibling).count() as u64,
            _ => 0,
        }
    }

    /// The instances with an unanswered sibling of `prompt` (none without a prompt id): the
    /// only ones whose queue [`Self::unreported_besides`] and [`Self::reported_siblings`]
    /// count differently from [`Self::unreported`] for it.
    pub fn holding(&self, prompt: Option<PromptId>) -> impl Iterator<Item = &K> {
        let sibling = move |e: &Entry| !e.answered && prompt.is_some() && e.prompt == prompt;
        let holds = move |m: &HashMap<RequestId, Entry>| m.values().any(sibling);
        self.by_instance.iter().filter(move |(_, m)| holds(m)).map(|(name, _)| name.borrow())
    }

    /// Forgets every request to `instance` (removed: its key may be given to another).
    pub fn forget_instance(&mut self, instance: &K) {
        self.by_instance.remove(instance);
    }

    /// Requests to `instance` not finished yet, answered or not.
    pub fn open(&self, instance: &K) -> usize {
        self.by_instance.get(instance).map_or(0, HashMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_until_its_first_byte_or_a_newer_report() {
        let mut f = InFlight::default();
        let a = f.start("p1", 3, None);
        let b = f.start("p1", 3, None);
        let c = f.start("p2", 0, None);
        assert_eq!((f.unreported("p1", 3), f.unreported("p2", 0)), (2, 1));
        f.first_byte("p1", a);
        assert_eq!(f.unreported("p1", 3), 1, "answered requests are past their prefill");
        assert_eq!(f.unreported("p1", 4), 0, "a newer report includes b");
        assert_eq!(f.open("p1"), 2);
        f.finish("p1", a);
        f.finish("p1", b);
        f.finish("p2", c);
        assert_eq!((f.open("p1"), f.open("p2"), f.unreported("p1", 3)), (0, 0, 0));
        // Unknown ids and instances are ignored.
        f.finish("p3", 99);
        f.first_byte("p3", 99);
        assert!(f.by_instance.is_empty());
    }

    #[test]
    fn siblings_of_a_prompt_leave_its_queue_but_other_prompts_stay() {
        let mut f = InFlight::default();
        let twin = Some(prompt_id(&[1, 2, 3]));
        f.start("p1", 0, twin);
        f.start("p1", 0, twin);
        f.start("p1", 0, Some(prompt_id(&[1, 2, 4])));
        f.start("p1", 0, None);
        assert_eq!(f.unreported("p1", 0), 4);
        assert_eq!(f.unreported_besides("p1", 0, twin), 2, "the two twins are left out");
        assert_eq!(f.unreported_besides("p1", 0, Some(prompt_id(&[1, 2]))), 4, "another prompt");
        assert_eq!(f.unreported_besides("p1", 0, None), 4, "no prompt id, no siblings");
        assert_eq!(f.reported_siblings("p1", 0, twin), 0, "no report has counted them yet");
        assert_eq!(f.reported_siblings("p1", 1, twin), 2, "the next report counts both twins");
        assert_eq!(f.reported_siblings("p1", 1, None), 0);
    }
}
