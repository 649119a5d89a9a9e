//! [`Backoff`]: the doubling retry delay every retry loop in kvdir uses (snapshot retries,
//! etcd re-listing, stream thread restarts), so they all behave alike: `min`, then twice the
//! previous delay, at most `max`, back to `min` after a success.

use std::time::Duration;

/// A doubling delay between `min` and `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `min`; never above `max` (nor below `min`).
    pub const fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max, next: min }
    }

    /// The delay to wait now; the one after it doubles (up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next.clamp(self.min, self.max.max(self.min));
        self.next = now.saturating_mul(2).min(self.max.max(self.min));
        now
    }

    /// After a success: the next delay is `min` again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_maximum_and_reset_to_the_minimum() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let delays: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(delays, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
        let mut odd = Backoff::new(ms(300), ms(100));
        assert_eq!((odd.next_delay(), odd.next_delay()), (ms(300), ms(300)), "max below min");
    }
}
