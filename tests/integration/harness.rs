//! The parts of the peer bench's `src/harness.rs` that `benches/peer_adapter.rs` uses, copied:
//! the adapter names them `crate::harness`, in the bench as here.

pub trait PrefixIndexUnderTest {
    fn name(&self) -> &str;
    fn store(&mut self, worker: u32, parent: Option<u64>, blocks: &[(u64, &[u32])]);
    fn remove(&mut self, worker: u32, hashes: &[u64]);
    fn query(&self, tokens: &[u32]) -> Vec<(u32, usize)>;
    fn flush(&mut self) {}
    fn hash_only(&self, _tokens: &[u32]) -> Option<usize> {
        None
    }
    fn rejected(&self) -> u64 {
        0
    }
    fn describe(&self) -> serde_json::Value;
}

#[derive(Clone, Debug)]
pub struct Setup {
    pub workers: u32,
    pub block_tokens: usize,
    #[allow(dead_code)]
    pub dynamo_event_threads: usize,
}
