//! A seeded, deterministic synthetic workload with shared prefixes: a few "system prompts"
//! shared by many sessions, and multi-turn sessions whose every turn extends the previous
//! request (user turn, then the model's answer, become part of the next prompt). Equal seeds give
//! equal request streams, so tests, benches and the demo can reproduce a run.
//!
//! The generator never decides where a request goes; callers route by [`Request::session`]
//! (sticky sessions make cache hits) or however they like.

use std::ops::RangeInclusive;

/// Shape of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadConfig {
    /// Seed of the generator.
    pub seed: u64,
    /// Distinct system prompts shared across sessions.
    pub system_prompts: usize,
    /// Tokens per system prompt.
    pub system_prompt_tokens: usize,
    /// Concurrent sessions (conversations).
    pub sessions: usize,
    /// Tokens added per user turn, and again per answer.
    pub turn_tokens: RangeInclusive<usize>,
    /// Turns after which a session starts a new conversation.
    pub max_turns: usize,
    /// Token ids are drawn from `0..vocab_size`.
    pub vocab_size: i32,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            seed: 42,
            system_prompts: 4,
            system_prompt_tokens: 1024,
            sessions: 64,
            turn_tokens: 32..=512,
            max_turns: 8,
            vocab_size: 32_000,
        }
    }
}

/// One request: the full prompt of one turn of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The session (0..sessions), a natural routing key.
    pub session: usize,
    /// The turn within the session's current conversation, from 0.
    pub turn: usize,
    /// The prompt's token ids.
    pub tokens: Vec<i32>,
}

#[derive(Debug)]
struct Session {
    history: Vec<i32>,
    turn: usize,
}

/// The request generator.
#[derive(Debug)]
pub struct Workload {
    config: WorkloadConfig,
    rng: SplitMix64,
    prompts: Vec<Vec<i32>>,
    sessions: Vec<Session>,
}

impl Workload {
    /// A generator; zero counts are raised to 1 so it always produces requests.
    pub fn new(mut config: WorkloadConfig) -> Self {
        config.system_prompts = config.system_prompts.max(1);
        config.sessions = config.sessions.max(1);
        config.max_turns = config.max_turns.max(1);
        config.vocab_size = config.vocab_size.max(1);
        let mut rng = SplitMix64(config.seed);
        let prompts = (0..config.system_prompts)
            .map(|_| random_tokens(&mut rng, config.system_prompt_tokens, config.vocab_size))
            .collect();
        let mut w = Workload { config, rng, prompts, sessions: Vec::new() };
        w.sessions = (0..w.config.sessions).map(|_| w.new_conversation()).collect();
        w
    }

    /// The configuration in use.
    pub fn config(&self) -> &WorkloadConfig {
        &self.config
    }

    /// The tokens of system prompt `i` (modulo the number of prompts).
    pub fn system_prompt(&self, i: usize) -> &[i32] {
        &self.prompts[i % self.prompts.len()]
    }

    /// The next request: a random session's next turn.
    pub fn next_request(&mut self) -> Request {
        let s = self.rng.below(self.config.sessions);
        if self.sessions[s].turn >= self.config.max_turns {
            self.sessions[s] = self.new_conversation();
        }
        let user = self.turn_tokens();
        let answer = self.turn_tokens();
        let session = &mut self.sessions[s];
        session.history.extend_from_slice(&user);
        let request = Request { session: s, turn: session.turn, tokens: session.history.clone() };
        session.history.extend_from_slice(&answer);
        session.turn += 1;
        request
    }

    fn new_conversation(&mut self) -> Session {
        let p = self.rng.below(self.prompts.len());
        Session { history: self.prompts[p].clone(), turn: 0 }
    }

    fn turn_tokens(&mut self) -> Vec<i32> {
        let (lo, hi) = (*self.config.turn_tokens.start(), *self.config.turn_tokens.end());
        let n = lo + self.rng.below(hi.saturating_sub(lo) + 1);
        random_tokens(&mut self.rng, n, self.config.vocab_size)
    }
}

fn random_tokens(rng: &mut SplitMix64, n: usize, vocab: i32) -> Vec<i32> {
    (0..n).map(|_| rng.below(vocab as usize) as i32).collect()
}

/// SplitMix64: tiny, fast and good enough for synthetic token ids.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> WorkloadConfig {
        WorkloadConfig {
            system_prompts: 2,
            system_prompt_tokens: 64,
            sessions: 3,
            turn_tokens: 4..=20,
            max_turns: 3,
            ..WorkloadConfig::default()
        }
    }

    #[test]
    fn equal_seeds_give_equal_requests() {
        let (mut a, mut b) = (Workload::new(small()), Workload::new(small()));
        for _ in 0..50 {
            assert_eq!(a.next_request(), b.next_request());
        }
        let mut c = Workload::new(WorkloadConfig { seed: 7, ..small() });
        assert_ne!(
            (0..5).map(|_| a.next_request()).collect::<Vec<_>>(),
            (0..5).map(|_| c.next_request()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn turns_extend_the_session_and_share_system_prompts() {
        let mut w = Workload::new(small());
        let prompts = w.prompts.clone();
        let mut last: Vec<Option<Request>> = vec![None; 3];
        for _ in 0..100 {
            let r = w.next_request();
            assert!(prompts.iter().any(|p| r.tokens.starts_with(p)), "no shared prefix");
            assert!(r.tokens.iter().all(|t| (0..32_000).contains(t)));
            if let Some(prev) = &last[r.session] {
                if r.turn > 0 {
                    assert_eq!(r.turn, prev.turn + 1);
                    assert!(r.tokens.starts_with(&prev.tokens), "a turn extends the last one");
                }
            }
            assert!(r.turn < 3);
            let session = r.session;
            last[session] = Some(r);
        }
    }
}
