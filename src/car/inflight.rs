//! [`InFlight`]: the requests a forwarding router sent to each instance and that have not
//! produced their first byte yet. Engines report their queue only now and then; between two
//! reports, the router adds its own unanswered requests started since the latest report to the
//! reported `waiting_requests_num`, so a burst does not all land on the instance that looked
//! idle at the last report.
//!
//! A request counts from [`InFlight::start`] until [`InFlight::first_byte`] or
//! [`InFlight::finish`], and only while no newer load report arrived for its instance (a report
//! received after the start already includes it).

use std::collections::HashMap;

/// Identifies one forwarded request.
pub type RequestId = u64;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The instance's report count when the request started.
    reports_at_start: u64,
    /// Whether the first byte came back (the request is past its prefill).
    answered: bool,
}

/// Per-instance requests in flight.
#[derive(Debug, Default)]
pub struct InFlight {
    next: RequestId,
    by_instance: HashMap<String, HashMap<RequestId, Entry>>,
}

impl InFlight {
    /// A request sent to `instance`, whose load reports numbered `reports` so far.
    pub fn start(&mut self, instance: &str, reports: u64) -> RequestId {
        self.next += 1;
        let entry = Entry { reports_at_start: reports, answered: false };
        self.by_instance.entry(instance.to_string()).or_default().insert(self.next, entry);
        self.next
    }

    /// The request's first byte came back.
    pub fn first_byte(&mut self, instance: &str, id: RequestId) {
        if let Some(e) = self.by_instance.get_mut(instance).and_then(|m| m.get_mut(&id)) {
            e.answered = true;
        }
    }

    /// The request ended (answered, failed or cancelled).
    pub fn finish(&mut self, instance: &str, id: RequestId) {
        if let Some(m) = self.by_instance.get_mut(instance) {
            m.remove(&id);
            if m.is_empty() {
                self.by_instance.remove(instance);
            }
        }
    }

    /// Unanswered requests to `instance` that its latest report (number `reports`) cannot
    /// include, because they started after it.
    pub fn unreported(&self, instance: &str, reports: u64) -> u64 {
        self.by_instance.get(instance).map_or(0, |m| {
            m.values().filter(|e| !e.answered && e.reports_at_start >= reports).count() as u64
        })
    }

    /// Requests to `instance` not finished yet, answered or not.
    pub fn open(&self, instance: &str) -> usize {
        self.by_instance.get(instance).map_or(0, HashMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_until_its_first_byte_or_a_newer_report() {
        let mut f = InFlight::default();
        let a = f.start("p1", 3);
        let b = f.start("p1", 3);
        let c = f.start("p2", 0);
        assert_eq!((f.unreported("p1", 3), f.unreported("p2", 0)), (2, 1));
        f.first_byte("p1", a);
        assert_eq!(f.unreported("p1", 3), 1, "answered requests are past their prefill");
        assert_eq!(f.unreported("p1", 4), 0, "a newer report includes b");
        assert_eq!(f.open("p1"), 2);
        f.finish("p1", a);
        f.finish("p1", b);
        f.finish("p2", c);
        assert_eq!((f.open("p1"), f.open("p2"), f.unreported("p1", 3)), (0, 0, 0));
        // Unknown ids and instances are ignored.
        f.finish("p3", 99);
        f.first_byte("p3", 99);
        assert!(f.by_instance.is_empty());
    }
}
