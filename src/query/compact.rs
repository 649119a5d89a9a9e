//! The compact answer: what a query of a large fleet lists, so that its size does not grow with
//! the fleet.
//!
//! A query of up to [`LIST_THRESHOLD`] streams (in its scope, engines without KV events
//! counted per DP rank) lists every one, as it always did. Past it, the answer lists only the
//! streams that hold a prefix of the query, longest first, at most [`LIST_THRESHOLD`] of them,
//! and a [`QuerySummary`] of the rest: what routing needs to know of them, how many there are
//! with zero credit and how many of those are unsynchronized. A request asks for either shape
//! with `"list": "all"` or `"list": "compact"` ([`ListMode`]).

use serde::{Deserialize, Serialize};

/// Streams a query lists in full; past it, the compact answer lists at most as many.
pub const LIST_THRESHOLD: usize = 128;

/// How a query answer lists the streams (`"list"` in the body).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListMode {
    /// Every stream up to [`LIST_THRESHOLD`] of them, compact past it.
    #[default]
    Auto,
    /// Every stream, whatever their number.
    All,
    /// The compact answer, whatever the number of streams.
    Compact,
}

impl ListMode {
    /// Whether an answer over `entries` streams is compact.
    pub fn is_compact(self, entries: usize) -> bool {
        match self {
            ListMode::Auto => entries > LIST_THRESHOLD,
            ListMode::All => false,
            ListMode::Compact => true,
        }
    }
}

/// The streams of a compact answer, listed or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuerySummary {
    /// Streams in the query's scope (an engine without KV events counts once per DP rank).
    pub streams: u64,
    /// Streams holding a prefix of the query (`reusable_prefix_tokens` > 0).
    pub with_credit: u64,
    /// Streams holding a prefix that are not listed: more than [`LIST_THRESHOLD`] hold one.
    pub unlisted_with_credit: u64,
    /// Streams with zero credit: holding none of the query, or unsynchronized.
    pub zero_credit: u64,
    /// Of those, the unsynchronized streams.
    pub unsynchronized: u64,
}

impl QuerySummary {
    /// The summary's JSON, the bytes `serde_json` gives for it.
    pub(super) fn write_json(&self, out: &mut Vec<u8>) {
        let fields = [
            (&b"{\"streams\":"[..], self.streams),
            (b",\"with_credit\":", self.with_credit),
            (b",\"unlisted_with_credit\":", self.unlisted_with_credit),
            (b",\"zero_credit\":", self.zero_credit),
            (b",\"unsynchronized\":", self.unsynchronized),
        ];
        for (key, v) in fields {
            out.extend_from_slice(key);
            out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        }
        out.push(b'}');
    }
}

/// Orders a compact answer's entries, those with credit, longest prefix first (then by
/// instance name and rank), and keeps at most [`LIST_THRESHOLD`]; returns how many were left
/// out. `key` gives an entry's `(reusable_prefix_tokens, instance_name, dp_rank)`; the entries
/// come in runs already ordered by name and rank (one per index), `runs` giving where each
/// ends.
///
/// Every prompt of a fleet shares its first blocks, so thousands of entries tie on tokens and
/// the order fell to comparing their names: a fifth of a query's time (issue 36), most of it
/// waiting for each name's bytes. So the cut is found on the tokens alone, the entries above it
/// (fewer than the list) are sorted, and those at it are merged from the runs' heads: the
/// names read are those of the entries listed and one per run, not every one.
pub fn longest_first<T>(
    entries: &mut Vec<T>,
    runs: &[usize],
    key: impl Fn(&T) -> (u64, &str, u32),
) -> u64 {
    let order = |a: &T, b: &T| {
        let (ta, na, ra) = key(a);
        let (tb, nb, rb) = key(b);
        tb.cmp(&ta).then_with(|| na.cmp(nb)).then(ra.cmp(&rb))
    };
    let left_out = entries.len().saturating_sub(LIST_THRESHOLD);
    if left_out == 0 {
        entries.sort_by(order);
        return 0;
    }
    let tokens: Vec<u64> = entries.iter().map(|e| key(e).0).collect();
    let mut sorted = tokens.clone();
    let (_, &mut cut, _) = sorted.select_nth_unstable_by(LIST_THRESHOLD - 1, |a, b| b.cmp(a));
    let mut picked: Vec<usize> = (0..entries.len()).filter(|&i| tokens[i] > cut).collect();
    picked.sort_by(|&a, &b| order(&entries[a], &entries[b]));
    let name_rank = |i: usize| {
        let (_, name, rank) = key(&entries[i]);
        (name, rank)
    };
    merge_ties(runs, |i| tokens[i] == cut, name_rank, LIST_THRESHOLD, &mut picked);
    // Each entry's place in the answer, past the end when it is left out.
    let mut place = vec![usize::MAX; entries.len()];
    picked.iter().enumerate().for_each(|(k, &i)| place[i] = k);
    let mut listed: Vec<Option<T>> = (0..picked.len()).map(|_| None).collect();
    for (i, e) in entries.drain(..).enumerate() {
        if let Some(slot) = listed.get_mut(place[i]) {
            *slot = Some(e);
        }
    }
    entries.extend(listed.into_iter().flatten());
    left_out as u64
}

/// Appends to `picked`, until it holds `limit`, the entries that are `tie`, smallest
/// `name_rank` first, taken from the heads of `runs` (each ordered by `name_rank` already).
fn merge_ties<'a>(
    runs: &[usize],
    tie: impl Fn(usize) -> bool,
    name_rank: impl Fn(usize) -> (&'a str, u32),
    limit: usize,
    picked: &mut Vec<usize>,
) {
    use std::cmp::Reverse;
    // The next tie of the run ending at `end`, from `i`.
    let next = |mut i: usize, end: usize| {
        while i < end && !tie(i) {
            i += 1;
        }
        (i < end).then_some(i)
    };
    let mut heads = std::collections::BinaryHeap::new();
    let starts = std::iter::once(0).chain(runs.iter().copied());
    for (start, &end) in starts.zip(runs) {
        if let Some(i) = next(start, end) {
            heads.push(Reverse((name_rank(i), i, end)));
        }
    }
    while picked.len() < limit {
        let Some(Reverse((_, i, end))) = heads.pop() else { break };
        picked.push(i);
        if let Some(i) = next(i + 1, end) {
            heads.push(Reverse((name_rank(i), i, end)));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn auto_lists_everything_up_to_the_threshold() {
        assert!(!ListMode::Auto.is_compact(LIST_THRESHOLD));
        assert!(ListMode::Auto.is_compact(LIST_THRESHOLD + 1));
        assert!(!ListMode::All.is_compact(1_000_000));
        assert!(ListMode::Compact.is_compact(0));
        let parsed: ListMode = serde_json::from_str("\"compact\"").unwrap();
        assert_eq!(parsed, ListMode::Compact);
        let err = serde_json::from_str::<ListMode>("\"some\"").unwrap_err().to_string();
        assert!(err.contains("`all`") && err.contains("some"), "{err}");
    }

    #[test]
    fn the_longest_prefixes_come_first_and_the_list_is_bounded() {
        let mut e: Vec<(u64, String, u32)> =
            (0..200).map(|i| (i % 7, format!("e{}", i % 3), i as u32)).collect();
        let mut sorted = e.clone();
        sorted.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        // Three runs, each by name and rank.
        e.sort_by(|a, b| (a.2 % 3).cmp(&(b.2 % 3)).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let left_out = longest_first(&mut e, &[67, 134, 200], |(t, n, r)| (*t, n.as_str(), *r));
        assert_eq!(e[..], sorted[..LIST_THRESHOLD], "the first of the whole order");
        assert_eq!((e.len(), left_out), (LIST_THRESHOLD, 200 - LIST_THRESHOLD as u64));
        assert!(e.windows(2).all(|w| w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 <= w[1].1)));
        assert_eq!(e[0], (6, "e0".to_string(), 6), "longest, then name, then rank");
    }

    /// Names of a few shapes: with a long shared prefix, one the prefix of another, with NUL
    /// bytes and multi-byte characters.
    fn name() -> impl Strategy<Value = String> {
        let tail = proptest::collection::vec(
            prop_oneof![Just('a'), Just('b'), Just('\0'), Just('é'), Just('z')],
            0..24,
        );
        (prop_oneof![Just(""), Just("vllm-prefill-worker-"), Just("vllm-prefill")], tail)
            .prop_map(|(head, tail)| format!("{head}{}", tail.into_iter().collect::<String>()))
    }

    proptest! {
        /// Whatever the runs and the ties: the first of the whole order, longest, then name,
        /// then rank.
        #[test]
        fn the_order_is_that_of_the_strings(
            runs in proptest::collection::vec(
                proptest::collection::vec((0..3u64, name(), 0..3u32), 0..80), 0..6),
        ) {
            let mut all: Vec<(u64, String, u32)> = Vec::new();
            let mut ends = Vec::new();
            for mut run in runs {
                run.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.cmp(&b.2)));
                run.dedup_by(|a, b| (&a.1, a.2) == (&b.1, b.2));
                all.extend(run);
                ends.push(all.len());
            }
            let mut want = all.clone();
            want.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            let n = all.len();
            let left_out = longest_first(&mut all, &ends, |(t, n, r)| (*t, n.as_str(), *r));
            prop_assert_eq!(left_out as usize, n.saturating_sub(LIST_THRESHOLD));
            let listed = want.len().min(LIST_THRESHOLD);
            // Equal (name, rank) in two runs: the same key twice, in either order.
            let key = |e: &(u64, String, u32)| (e.0, e.1.clone(), e.2);
            let got: Vec<_> = all.iter().map(key).collect();
            let want: Vec<_> = want[..listed].iter().map(key).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn the_summary_writes_serde_json_bytes() {
        let s = QuerySummary {
            streams: 4096,
            with_credit: 3,
            unlisted_with_credit: 0,
            zero_credit: 4093,
            unsynchronized: 2,
        };
        let mut out = Vec::new();
        s.write_json(&mut out);
        assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
    }
}
