//! The admission queue's rules, one test each.

use super::*;

fn params(bound: u64, queue: usize, max_wait: u64) -> OverloadParams {
    OverloadParams { ttft_bound_ms: bound, queue, max_wait_ms: max_wait }
}

#[test]
fn off_sends_everything_whatever_the_estimate() {
    let mut q = AdmissionQueue::new(params(0, 1, 100));
    assert!(!q.params().enabled());
    for i in 0..5 {
        assert_eq!(q.arrive(0, Some(1e9), i), Arrival::Send(i));
    }
    assert_eq!(q.counters(), OverloadCounters::default());
}

#[test]
fn a_request_within_the_bound_goes_and_one_above_it_is_held() {
    let mut q = AdmissionQueue::new(params(500, 4, 10_000));
    assert_eq!(q.arrive(0, Some(500.0), "a"), Arrival::Send("a"), "the bound itself is within");
    assert_eq!(q.arrive(0, None, "b"), Arrival::Send("b"), "no candidate: routing answers");
    assert_eq!(q.arrive(0, Some(500.1), "c"), Arrival::Held(1));
    assert_eq!((q.len(), q.counters().held, q.counters().queue_length), (1, 1, 1));
}

#[test]
fn nothing_overtakes_a_held_request() {
    let mut q = AdmissionQueue::new(params(500, 4, 10_000));
    assert_eq!(q.arrive(0, Some(900.0), "first"), Arrival::Held(1));
    // A small request whose estimate is within the bound still queues behind it.
    assert_eq!(q.arrive(1, Some(10.0), "second"), Arrival::Held(2));
    assert_eq!(q.head(), Some(&"first"));
    assert_eq!(q.pop_due(2, Some(900.0)), None, "the head is still above the bound");
    assert_eq!(q.pop_due(3, Some(400.0)), Some(("first", Release::Capacity)));
    assert_eq!(q.pop_due(3, Some(10.0)), Some(("second", Release::Capacity)));
    assert_eq!(q.pop_due(3, Some(10.0)), None, "empty");
    assert_eq!(q.counters().released_capacity, 2);
}

#[test]
fn past_the_bound_of_the_queue_a_request_is_refused_with_the_estimate_in_seconds() {
    let mut q = AdmissionQueue::new(params(500, 2, 10_000));
    q.arrive(0, Some(900.0), 1);
    q.arrive(0, Some(900.0), 2);
    let Arrival::Refused(item, r) = q.arrive(0, Some(4_200.0), 3) else { panic!("refused") };
    assert_eq!((item, r.retry_after_s, r.estimate_ms), (3, 5, 4_200.0));
    assert_eq!(r.params.queue, 2);
    let Arrival::Refused(_, r) = q.arrive(0, Some(20.0), 4) else { panic!("refused") };
    assert_eq!(r.retry_after_s, 1, "never less than a second");
    assert_eq!((q.counters().refused, q.len()), (2, 2));
}

#[test]
fn a_request_held_for_max_wait_is_sent_anyway() {
    let mut q = AdmissionQueue::new(params(500, 4, 1_000));
    q.arrive(100, Some(900.0), "old");
    q.arrive(600, Some(900.0), "young");
    assert_eq!(q.next_deadline_ms(), Some(1_100));
    assert_eq!(q.pop_due(1_099, Some(900.0)), None);
    assert_eq!(q.pop_due(1_100, Some(900.0)), Some(("old", Release::MaxWait)));
    assert_eq!(q.next_deadline_ms(), Some(1_600), "the next oldest's deadline");
    assert_eq!(q.pop_due(1_200, Some(900.0)), None);
    assert_eq!(q.counters().released_max_wait, 1);
}

#[test]
fn a_withdrawn_request_frees_its_place() {
    let mut q = AdmissionQueue::new(params(500, 2, 10_000));
    let Arrival::Held(a) = q.arrive(0, Some(900.0), "a") else { panic!("held") };
    q.arrive(0, Some(900.0), "b");
    assert!(matches!(q.arrive(0, Some(900.0), "c"), Arrival::Refused(..)));
    assert_eq!(q.withdraw(a), Some("a"));
    assert_eq!(q.withdraw(a), None, "once");
    assert_eq!(q.arrive(0, Some(900.0), "c"), Arrival::Held(3));
    q.withdraw_where(|item| *item == "b");
    assert_eq!((q.head(), q.len(), q.counters().withdrawn), (Some(&"c"), 1, 2));
}

#[test]
fn an_empty_queue_has_no_deadline_and_lets_requests_within_the_bound_through_again() {
    let mut q = AdmissionQueue::new(params(500, 2, 10_000));
    assert_eq!(q.next_deadline_ms(), None);
    q.arrive(0, Some(900.0), 1);
    assert_eq!(q.pop_due(1, Some(100.0)), Some((1, Release::Capacity)));
    assert!(q.is_empty());
    assert_eq!(q.arrive(2, Some(100.0), 2), Arrival::Send(2));
}
