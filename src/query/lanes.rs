//! A long `token_ids` list read in up to [`LANES`] interleaved lanes.
//!
//! The scan of `fast.rs` reads one element after another, and each element's start waits for
//! the length of the one before it (a load, a few word operations, a count of trailing zeros):
//! about 8 ns an id, whatever the core could do beside it, so a 256-block prompt (32,768 ids)
//! took about 0.26 ms to read, a fifth of a route's work in kvdir. Here the list is cut at
//! commas into [`LANES`] parts of about equal bytes, and one loop takes an element from each
//! part in turn: the parts' chains are independent, so the core works on them at once.
//!
//! Each lane reads its elements as the one-lane scan does (the one-word step where it can,
//! else byte by byte). A lane ends exactly at the comma that starts the next one (it must be
//! that lane's last separator); a cut that is not a separator of the list (a comma after the
//! list, in a malformed body) makes the read give `None`, so serde reads the body instead,
//! exactly as before.

use super::fast::Scan;

/// Lanes read at once.
pub(super) const LANES: usize = 4;

/// Bytes of list below which one lane reads it (cutting costs more than it saves).
pub(super) const MIN_BYTES: usize = 512;

/// One lane: its cursor, where its part ends and its ids.
struct Lane<'a> {
    s: Scan<'a>,
    /// The position of the comma after this lane's part (`None` for the last lane).
    cut: Option<usize>,
    ids: Vec<i32>,
    /// The last lane has read `]`.
    closed: bool,
}

impl Lane<'_> {
    /// Whether this lane has read its part.
    fn done(&self) -> bool {
        match self.cut {
            Some(cut) => self.s.i > cut,
            None => self.closed,
        }
    }

    /// Takes one element of the lane (the one-word step, or the byte-wise one); `None` if the
    /// body is not plain, or a lane before the last reads `]` (an element that takes in a
    /// lane's cut has that comma as its separator: digits and whitespace are no commas).
    #[inline(always)]
    fn step(&mut self) -> Option<()> {
        let (id, last) = self.s.element()?;
        self.ids.push(id);
        self.closed = last;
        (self.cut.is_none() || !last).then_some(())
    }
}

/// The ids of the list that starts at `s.i` (after `[` and whitespace, not empty) up to and
/// including its `]`, read in lanes; `s` is left after the `]`. `None` for anything the
/// byte-wise scan would refuse, a list longer than `max_tokens`, or a list that a cut shows is
/// not plain.
pub(super) fn ids_in_lanes(s: &mut Scan<'_>, max_tokens: usize) -> Option<Vec<i32>> {
    let body = s.b;
    let start = s.i;
    let part = (body.len() - start) / LANES;
    let mut lanes: Vec<Lane<'_>> = Vec::with_capacity(LANES);
    let mut at = start;
    let lane = |i: usize, cut: Option<usize>| {
        let ids = Vec::with_capacity(part / 4);
        Lane { s: Scan { b: body, i }, cut, ids, closed: false }
    };
    for k in 1..LANES {
        // Each cut after the one before, so that every lane has its own part; where no comma
        // is left, the lanes so far and the last one share the list.
        let from = (start + k * part).max(at);
        let Some(found) = body.get(from..).and_then(|b| b.iter().position(|&c| c == b',')) else {
            break;
        };
        lanes.push(lane(at, Some(from + found)));
        at = from + found + 1;
    }
    lanes.push(lane(at, None));
    interleave(&mut lanes)?;
    let total: usize = lanes.iter().map(|l| l.ids.len()).sum();
    if total > max_tokens {
        return None;
    }
    let mut out = Vec::with_capacity(total);
    lanes.iter().for_each(|l| out.extend_from_slice(&l.ids));
    s.i = lanes.last()?.s.i;
    Some(out)
}

/// Takes one element from each lane not done in turn, until every lane is done.
#[inline(always)]
fn interleave(lanes: &mut [Lane<'_>]) -> Option<()> {
    loop {
        let mut stepped = false;
        for lane in lanes.iter_mut() {
            if !lane.done() {
                lane.step()?;
                stepped = true;
            }
        }
        if !stepped {
            return Some(());
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::fast::plain_token_ids;
    use super::super::parse_scoped_query;
    use super::*;

    /// A plain body of `ids`, each element written as `{a}{id}{b}`.
    fn plain(ids: &[i32], a: &str, b: &str) -> String {
        let list: Vec<String> = ids.iter().map(|v| format!("{a}{v}{b}")).collect();
        format!("{{\"token_ids\": [{}]}}", list.join(","))
    }

    #[test]
    fn a_long_list_is_read_in_lanes_with_every_id_in_order() {
        let ids: Vec<i32> = (0..32_768).map(|i| i * 7_919 % 150_000).collect();
        for (a, b) in [("", ""), ("", " "), (" ", ""), ("\n", " \t")] {
            let body = plain(&ids, a, b);
            assert!(body.len() > LANES * MIN_BYTES);
            assert_eq!(plain_token_ids(body.as_bytes(), ids.len()).as_ref(), Some(&ids));
            assert_eq!(plain_token_ids(body.as_bytes(), ids.len() - 1), None, "over the limit");
        }
        // Long numbers, leading elements the one-word step declines, then short ones.
        let mixed: Vec<i32> =
            (0..2_000).map(|i| if i % 97 < 3 { i32::MAX - i } else { i }).collect();
        assert_eq!(plain_token_ids(plain(&mixed, "", "").as_bytes(), 2_000), Some(mixed));
    }

    #[test]
    fn a_cut_outside_the_list_leaves_the_body_to_serde() {
        let ids: Vec<i32> = (0..300).collect();
        let list: Vec<String> = ids.iter().map(i32::to_string).collect();
        let pad = " ".repeat(4 * MIN_BYTES);
        // Every cut falls in the padding after the list, before a comma of another key.
        let body = format!("{{\"token_ids\": [{}]{pad}, \"model\": \"m\"}}", list.join(","));
        assert_eq!(plain_token_ids(body.as_bytes(), 1 << 20), None);
        let (tokens, scope) = parse_scoped_query(body.as_bytes(), 1 << 20).unwrap();
        assert_eq!((tokens, scope.model.as_str()), (ids, "m"));
        // A comma-free tail: the last cut finds no comma.
        let body = format!("{{\"token_ids\": [{}]{pad}}}", list.join(","));
        assert_eq!(plain_token_ids(body.as_bytes(), 1 << 20).map(|t| t.len()), Some(300));
    }

    fn whitespace() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop_oneof![Just(' '), Just('\n'), Just('\t')], 0..3)
            .prop_map(|v| v.into_iter().collect())
    }

    fn long_body() -> impl Strategy<Value = String> {
        let id = prop_oneof![0..10, 0..200_000, 999_990..1_000_010, 0..=i32::MAX];
        let ids = proptest::collection::vec(id, 100..600);
        (ids, whitespace(), whitespace()).prop_map(|(t, a, b)| plain(&t, &a, &b))
    }

    proptest! {
        /// A long plain body is read in lanes, with serde's answer.
        #[test]
        fn lanes_agree_with_serde_on_long_plain_bodies(body in long_body()) {
            let full = parse_scoped_query(body.as_bytes(), 1 << 20).map(|(t, _)| t);
            let fast = plain_token_ids(body.as_bytes(), 1 << 20);
            prop_assert!(fast.is_some());
            prop_assert_eq!(fast, full.ok());
        }

        /// Whatever a damaged long body is, the lanes decline it or agree with serde.
        #[test]
        fn lanes_never_contradict_serde(
            body in long_body(),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), prop_oneof![
                Just(b'-'), Just(b'.'), Just(b'0'), Just(b'"'), Just(b','), Just(b']'),
                Just(b'}'), Just(b' '), any::<u8>()]), 1..4),
        ) {
            let mut bytes = body.into_bytes();
            for (at, byte) in damage {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            if let Some(tokens) = plain_token_ids(&bytes, 1 << 20) {
                let (full, scope) = parse_scoped_query(&bytes, 1 << 20).expect("serde accepts it");
                prop_assert_eq!(tokens, full);
                prop_assert_eq!(scope, Default::default());
            }
        }
    }
}
