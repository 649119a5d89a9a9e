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
/// out. `key` gives an entry's `(reusable_prefix_tokens, instance_name, dp_rank)`. The longest
/// are selected before they are sorted: a thousand entries are not sorted for 128.
pub fn longest_first<T>(entries: &mut Vec<T>, key: impl Fn(&T) -> (u64, &str, u32)) -> u64 {
    let order = |a: &T, b: &T| {
        let (ta, na, ra) = key(a);
        let (tb, nb, rb) = key(b);
        tb.cmp(&ta).then_with(|| na.cmp(nb)).then(ra.cmp(&rb))
    };
    let left_out = entries.len().saturating_sub(LIST_THRESHOLD);
    if left_out > 0 {
        entries.select_nth_unstable_by(LIST_THRESHOLD - 1, order);
        entries.truncate(LIST_THRESHOLD);
    }
    entries.sort_by(order);
    left_out as u64
}

#[cfg(test)]
mod tests {
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
        let left_out = longest_first(&mut e, |(t, n, r)| (*t, n.as_str(), *r));
        assert_eq!(e[..], sorted[..LIST_THRESHOLD], "the first of the whole order");
        assert_eq!((e.len(), left_out), (LIST_THRESHOLD, 200 - LIST_THRESHOLD as u64));
        assert!(e.windows(2).all(|w| w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 <= w[1].1)));
        assert_eq!(e[0], (6, "e0".to_string(), 6), "longest, then name, then rank");
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
