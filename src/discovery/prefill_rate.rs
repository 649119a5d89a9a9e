//! The prefill rate an engine reports ([`PrefillRate`]): vLLM's `/metrics` sums the uncached
//! tokens each request's prefill computed (`vllm:request_prefill_kv_computed_tokens`) and the
//! time each took (`vllm:request_prefill_time_seconds`, from its first scheduling to its first
//! token, without its wait in the queue). Between two polls, the new tokens over the new
//! seconds are the rate of one request's prefill; prefills that overlap share the engine, so
//! it reads low then. The TTFT policy uses it, as `reported`, where the front door has learned
//! no rate of its own (`kvdir::car::ttft`).

use crate::car::ewma;
use crate::prometheus::Samples;

/// The metrics read: each histogram's `_sum`, over every label set (DP rank).
const TOKENS: &str = "vllm:request_prefill_kv_computed_tokens_sum";
const SECONDS: &str = "vllm:request_prefill_time_seconds_sum";

/// Weight of a new sample in the rate's moving average.
const ALPHA: f64 = 0.3;

/// The prefill sums of one `/metrics` answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillTotals {
    /// Uncached prompt tokens computed by prefills so far.
    pub tokens: f64,
    /// Seconds those prefills took, summed over requests.
    pub seconds: f64,
}

impl PrefillTotals {
    /// The sums in `s`, when the engine exports both.
    pub fn read(s: &Samples<'_>) -> Option<PrefillTotals> {
        let (tokens, seconds) = (s.sum(TOKENS)?, s.sum(SECONDS)?);
        (tokens.is_finite() && seconds.is_finite()).then_some(PrefillTotals { tokens, seconds })
    }
}

/// An engine's reported prefill rate, learned from its successive sums.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrefillRate {
    last: Option<PrefillTotals>,
    rate: Option<f64>,
}

impl PrefillRate {
    /// Tokens per second, once two polls a prefill apart have been seen.
    pub fn get(&self) -> Option<f64> {
        self.rate
    }

    /// Takes one poll's sums. Sums that went down are a new process: the rate starts over.
    pub fn observe(&mut self, now: Option<PrefillTotals>) {
        let Some(now) = now else { return };
        if let Some(last) = self.last.replace(now) {
            let (tokens, seconds) = (now.tokens - last.tokens, now.seconds - last.seconds);
            if tokens < 0.0 || seconds < 0.0 {
                self.rate = None;
            } else if tokens > 0.0 && seconds > 0.0 {
                self.rate = Some(ewma(self.rate, tokens / seconds, ALPHA));
            }
        }
    }

    /// Forgets everything (another process).
    pub fn reset(&mut self) {
        *self = PrefillRate::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(tokens: f64, seconds: f64) -> Option<PrefillTotals> {
        Some(PrefillTotals { tokens, seconds })
    }

    #[test]
    fn the_rate_is_new_tokens_over_new_seconds_between_polls() {
        let mut r = PrefillRate::default();
        r.observe(totals(1000.0, 1.0));
        assert_eq!(r.get(), None, "one poll has no interval");
        r.observe(totals(1000.0, 1.0));
        assert_eq!(r.get(), None, "no prefill in between");
        r.observe(totals(3000.0, 1.5));
        assert_eq!(r.get(), Some(4000.0));
        r.observe(totals(4000.0, 2.0));
        assert_eq!(r.get(), Some(4000.0 + ALPHA * (2000.0 - 4000.0)), "a moving average");
    }

    #[test]
    fn sums_that_go_down_start_over_and_absent_sums_change_nothing() {
        let mut r = PrefillRate::default();
        r.observe(totals(1000.0, 1.0));
        r.observe(totals(2000.0, 2.0));
        r.observe(None);
        assert_eq!(r.get(), Some(1000.0));
        r.observe(totals(10.0, 0.01));
        assert_eq!(r.get(), None, "a restarted engine's sums");
        r.observe(totals(510.0, 0.26));
        assert_eq!(r.get(), Some(2000.0));
    }

    #[test]
    fn both_sums_are_read_over_every_rank() {
        let text = "vllm:request_prefill_kv_computed_tokens_sum{engine=\"0\"} 100.0\n\
                    vllm:request_prefill_kv_computed_tokens_sum{engine=\"1\"} 50.0\n\
                    vllm:request_prefill_time_seconds_sum{engine=\"0\"} 0.5\n";
        assert_eq!(PrefillTotals::read(&Samples::parse(text)), totals(150.0, 0.5));
        let only_tokens = "vllm:request_prefill_kv_computed_tokens_sum 100.0\n";
        assert_eq!(PrefillTotals::read(&Samples::parse(only_tokens)), None);
    }
}
