//! A request trace in the Mooncake format ([`Trace`]) and the prompts the replay builds from it.
//!
//! One JSON object per line: `timestamp` (ms from the start), `input_length`, `output_length`
//! and `hash_ids`, one id per [`TRACE_BLOCK`]-token block; equal ids mean the same prefix
//! block. Invariants of the prompts ([`TraceRequest::tokens`]):
//! - the first `input_length / 512` ids become complete blocks, each a deterministic function
//!   of its id alone, so equal ids give equal blocks in every request;
//! - the rest, up to `input_length` (the partial last block), are tokens unique to the request,
//!   so only complete blocks can ever be shared, as in an engine's prefix cache;
//! - every token is in `0..=2^31-1`, the range kvdir accepts.
//!
//! [`Trace::bound`] is the hit share one cache that never evicts would get: a request's blocks
//! hit up to the first block no earlier request had at that prefix. The references for finite
//! caches are in [`super::affinity`].

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::super::BenchError;

/// Tokens per trace block (the Mooncake traces' block size).
pub const TRACE_BLOCK: usize = 512;
/// Seed domains, so block tokens and tail tokens never come from the same generator.
const BLOCK_SEED: u64 = 0x6b76_6469_722d_626c;
const TAIL_SEED: u64 = 0x6b76_6469_722d_7461;

/// One request of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Position in the trace (0-based); makes the tail unique.
    pub index: usize,
    /// Arrival, ms from the start of the trace.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: usize,
    /// One id per 512-token block (the last may be partial).
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// The ids of the complete blocks: those whose 512 tokens fit in `input_length`.
    pub fn full_blocks(&self) -> &[u64] {
        let full = (self.input_length / TRACE_BLOCK).min(self.hash_ids.len());
        &self.hash_ids[..full]
    }

    /// The prompt: the complete blocks' tokens, then a tail unique to the request.
    pub fn tokens(&self) -> Vec<i32> {
        let mut tokens = Vec::with_capacity(self.input_length);
        for &id in self.full_blocks() {
            push_block_tokens(id, &mut tokens);
        }
        let index = self.index as u64;
        let tail = self.input_length - tokens.len();
        tokens.extend((0..tail).map(|j| token(TAIL_SEED ^ index.rotate_left(17), j)));
        tokens
    }
}

/// Appends the [`TRACE_BLOCK`] tokens of block `id` (the same in every request) to `out`.
pub fn push_block_tokens(id: u64, out: &mut Vec<i32>) {
    out.extend((0..TRACE_BLOCK).map(|j| token(BLOCK_SEED ^ id, j)));
}

fn token(seed: u64, j: usize) -> i32 {
    (xxh3_64_with_seed(&(j as u64).to_le_bytes(), seed) & 0x7fff_ffff) as i32
}

/// The requests to replay, in trace order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Requests, timestamps non-decreasing.
    pub requests: Vec<TraceRequest>,
}

/// What the one-cache bound counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// Hit tokens over input tokens.
    pub token_share: f64,
    /// Hit blocks over all blocks (`hash_ids`, partial ones included).
    pub block_share: f64,
}

impl Trace {
    /// Reads the first `limit` requests (all with `None`) of the file at `path`.
    pub fn read(path: &Path, limit: Option<usize>) -> Result<Trace, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io("read", path, e))?;
        let lines = text.lines().filter(|l| !l.trim().is_empty());
        let mut requests = Vec::new();
        for (index, line) in lines.take(limit.unwrap_or(usize::MAX)).enumerate() {
            let request = parse_line(index, line).map_err(|why| {
                BenchError::Trace(format!("{} line {}: {why}", path.display(), index + 1))
            })?;
            if requests.last().is_some_and(|p: &TraceRequest| p.timestamp_ms > request.timestamp_ms)
            {
                return Err(BenchError::Trace(format!(
                    "{} line {}: timestamp {} is before the previous request's; sort the trace",
                    path.display(),
                    index + 1,
                    request.timestamp_ms
                )));
            }
            requests.push(request);
        }
        if requests.is_empty() {
            return Err(BenchError::Trace(format!("{} holds no request", path.display())));
        }
        Ok(Trace { requests })
    }

    /// Input tokens of every request.
    pub fn input_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.input_length as u64).sum()
    }

    /// The hit share of one cache that never evicts.
    pub fn bound(&self) -> Bound {
        let mut seen: HashSet<u64> = HashSet::new();
        let (mut hit_blocks, mut blocks, mut hit_tokens) = (0u64, 0u64, 0u64);
        for r in &self.requests {
            let hits = r.full_blocks().iter().take_while(|id| seen.contains(id)).count();
            hit_blocks += hits as u64;
            hit_tokens += (hits * TRACE_BLOCK) as u64;
            blocks += r.hash_ids.len() as u64;
            seen.extend(r.full_blocks().iter().copied());
        }
        Bound {
            token_share: hit_tokens as f64 / self.input_tokens().max(1) as f64,
            block_share: hit_blocks as f64 / blocks.max(1) as f64,
        }
    }
}

fn parse_line(index: usize, line: &str) -> Result<TraceRequest, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let field = |name: &str| {
        v[name].as_u64().ok_or_else(|| format!("`{name}` is missing or not a whole number"))
    };
    let timestamp_ms = field("timestamp")?;
    let input_length = field("input_length")? as usize;
    let ids = v["hash_ids"].as_array().ok_or("`hash_ids` is missing or not a list")?;
    let hash_ids = ids
        .iter()
        .map(|id| id.as_u64().ok_or_else(|| format!("hash id {id} is not a whole number")))
        .collect::<Result<Vec<_>, _>>()?;
    if input_length == 0 {
        return Err("`input_length` is 0".to_string());
    }
    Ok(TraceRequest { index, timestamp_ms, input_length, hash_ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(index: usize, input_length: usize, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest { index, timestamp_ms: 0, input_length, hash_ids: hash_ids.to_vec() }
    }

    #[test]
    fn equal_ids_give_equal_blocks_and_the_partial_block_is_unique() {
        let a = request(0, 2 * 512 + 100, &[7, 8, 9]).tokens();
        let b = request(1, 2 * 512 + 100, &[7, 8, 9]).tokens();
        assert_eq!((a.len(), b.len()), (1124, 1124));
        assert_eq!(a[..1024], b[..1024], "ids 7 and 8 are complete blocks");
        assert_ne!(a[1024..], b[1024..], "the partial block 9 is a tail unique to the request");
        let c = request(2, 512, &[8]).tokens();
        assert_ne!(a[..512], c[..], "different ids, different blocks");
        assert!(a.iter().chain(&c).all(|t| *t >= 0));
    }

    #[test]
    fn the_bound_counts_prefix_hits_of_complete_blocks_until_the_first_miss() {
        let trace = Trace {
            requests: vec![
                request(0, 3 * 512, &[1, 2, 3]),
                request(1, 3 * 512, &[1, 2, 4]),
                request(2, 2 * 512 + 10, &[5, 2, 6]),
            ],
        };
        let bound = trace.bound();
        assert_eq!(bound.block_share, 2.0 / 9.0, "1 and 2 in the second request; 2 after 5 misses");
        assert_eq!(bound.token_share, 1024.0 / (9.0 * 512.0 + 10.0 - 512.0));
        let pooled = |blocks| super::super::affinity::pooled_lru(&trace, blocks).token_share;
        assert_eq!(pooled(100), bound.token_share, "nothing evicted");
        assert_eq!(pooled(3), bound.token_share, "4 evicts 3, which no one asks again");
        assert_eq!(pooled(2), bound.token_share, "3, the leaf, makes room; 1 2 stay");
        assert_eq!(pooled(1), 512.0 / (9.0 * 512.0 + 10.0 - 512.0), "only the root 1 stays");
    }

    #[test]
    fn the_generated_traces_parse_and_match_their_readmes() {
        // (file, requests, one-cache bound as a block share) as sim/data/*/README.md state them.
        let traces =
            [("agent/agent_trace.jsonl", 3704, 0.922), ("bfcl/bfcl_trace.jsonl", 7961, 0.873)];
        for (file, requests, bound) in traces {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/data").join(file);
            let trace = Trace::read(&path, None).unwrap();
            assert_eq!(trace.requests.len(), requests, "{file}");
            assert!(
                (trace.bound().block_share - bound).abs() < 0.0005,
                "{file}: {:?}",
                trace.bound()
            );
        }
    }

    #[test]
    fn bad_lines_are_named_with_their_number() {
        let dir = std::env::temp_dir().join(format!("kvdir-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        let good = r#"{"timestamp": 5, "input_length": 600, "hash_ids": [1, 2]}"#;
        std::fs::write(&path, format!("{good}\n{{\"timestamp\": 1}}\n")).unwrap();
        let trace = Trace::read(&path, Some(1)).expect("the first line alone is fine");
        assert_eq!(trace.requests[0].full_blocks(), [1]);
        let err = Trace::read(&path, None).unwrap_err().to_string();
        assert!(err.contains("t.jsonl line 2: `input_length` is missing"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
