//! Walks of several shared indexes sharing one query's keys ([`PromptKeys`]): the same
//! answers as a walk of each index on its own, with each block hashed once, only as far as the
//! deepest walk.

use super::tests::{apply, chain, stream, B};
use super::*;
use crate::index::{KeyHasher, PromptKeys};
use crate::wire::{Namespace, Tier};

#[test]
fn indexes_sharing_the_keys_answer_as_alone_and_hash_each_block_once() {
    // Three indexes of one block size and seed, as a fleet of more than 128 streams has; the
    // deepest stream (40 blocks) is in the middle one.
    let lens: [&[u32]; 3] = [&[5, 17], &[40, 0], &[16]];
    let indexes: Vec<SharedIndex> = lens.iter().map(|_| SharedIndex::new(B, 1024, 8)).collect();
    let mut streams = Vec::new();
    for (index, lens) in indexes.iter().zip(lens) {
        for &n in lens.iter() {
            let mut s = stream(index);
            if n > 0 {
                apply(&mut s, &chain(n, Tier::Device).0);
            }
            streams.push(s);
        }
    }
    let tokens = chain(120, Tier::Device).1;
    let mut keys = PromptKeys::new(B, 1024);
    keys.start(Namespace::default());
    let mut hashed = Vec::new();
    for (index, lens) in indexes.iter().zip(lens) {
        let handle = index.reader().handle();
        let mut present = 0;
        let shared = handle.walk_with(&mut keys, &tokens, |_, view| present = view.order().len());
        let alone = index.reader().handle().query(&tokens);
        assert_eq!(shared, alone, "the same matches as the index's own walk");
        assert_eq!(present, lens.len(), "the view the walk read lists the index's streams");
        hashed.push(keys.keys().len());
    }
    assert!(hashed[0] < 40 && (40..120).contains(&hashed[1]), "{hashed:?}");
    assert_eq!(hashed[2], hashed[1], "the last index walked keys hashed already");
    let mut full = Vec::new();
    KeyHasher::new(B, 1024).prefix_keys(&tokens, &mut full);
    assert_eq!(keys.keys(), &full[..hashed[1]], "one chain of keys, a prefix of the prompt's");
}
