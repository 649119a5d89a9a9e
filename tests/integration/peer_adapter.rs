//! Compiles `benches/peer_adapter.rs` (the peer bench's kvdir adapter) against a copy of the
//! bench's `PrefixIndexUnderTest` trait, and checks its answers on a small workload: workers
//! sharing a prefix, one holding a longer chain, removals, and both publish variants.

#[path = "../../benches/peer_adapter.rs"]
mod adapter;

use crate::harness::{PrefixIndexUnderTest, Setup};
use adapter::Kvdir;

const BT: usize = 4;

fn block(id: u32) -> Vec<u32> {
    (0..BT as u32).map(|i| id * 100 + i).collect()
}

fn tokens(ids: &[u32]) -> Vec<u32> {
    ids.iter().flat_map(|&id| block(id)).collect()
}

fn sorted(mut v: Vec<(u32, usize)>) -> Vec<(u32, usize)> {
    v.sort_unstable();
    v
}

fn check(publish_each: bool) {
    let setup = Setup { workers: 128, block_tokens: BT, dynamo_event_threads: 1 };
    let mut idx = Kvdir::new(&setup, publish_each);
    let (b1, b2, b3) = (block(1), block(2), block(3));
    for w in 0..128 {
        idx.store(w, None, &[(11, &b1), (12, &b2)]);
    }
    idx.store(5, Some(12), &[(13, &b3)]);
    idx.flush();
    let all: Vec<_> = (0..128).map(|w| (w, if w == 5 { 3 } else { 2 })).collect();
    assert_eq!(sorted(idx.query(&tokens(&[1, 2, 3, 9]))), all);
    assert_eq!(idx.hash_only(&tokens(&[1, 2, 3, 9])), Some(4));
    idx.remove(5, &[12, 13]);
    idx.remove(7, &[11]);
    idx.flush();
    let got = sorted(idx.query(&tokens(&[1, 2, 3])));
    assert_eq!(got.len(), 127);
    assert!(got.contains(&(5, 1)) && !got.iter().any(|&(w, _)| w == 7), "{got:?}");
    assert!(sorted(idx.query(&tokens(&[2]))).is_empty());
    idx.store(9, Some(999), &[(14, &b3)]);
    assert_eq!(idx.rejected(), 1, "an unknown parent is rejected");
    assert!(idx.name().starts_with("kvdir") && idx.describe()["crate"] == "kvdir");
}

#[test]
fn the_peer_adapter_answers_like_the_reference_in_both_publish_modes() {
    check(true);
    check(false);
}
