//! kvdir's test kit, shared by every crate's tests and benches and by nothing that ships (it is
//! only ever a dev-dependency):
//!
//! - [`eventually`] and [`eventually_true`] (each with a `_within` form): poll what a user would see until it holds or a
//!   deadline passes, then fail with the last observation. Tests never sleep to synchronise.
//! - [`http`]: one request per connection to a 127.0.0.1 server, panicking on a transport
//!   error (over the simulator's reqwest client, [`kvdir_sim::http::request`]).
//! - [`etcd`]: the etcd server of a test: the one CI names in `KVDIR_TEST_ETCD`, or a private
//!   one; without etcd a test fails loudly, it never skips.
//! - [`layers`]: the check that a crate's modules form layers (no import cycle), which the
//!   core and the service run on their own `src/`.

pub mod etcd;
pub mod http;
pub mod layers;

use std::time::{Duration, Instant};

/// How long anything may take to become visible in a test.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// How often [`eventually`] polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `probe` every 20 ms until it returns `Ok`, or panics with its last `Err` after
/// [`DEADLINE`].
pub fn eventually<T>(what: &str, probe: impl FnMut() -> Result<T, String>) -> T {
    eventually_within(DEADLINE, what, probe)
}

/// [`eventually`] with its own deadline.
pub fn eventually_within<T>(
    deadline: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + deadline;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// [`eventually`] for a check that says only yes or no.
pub fn eventually_true(what: &str, check: impl FnMut() -> bool) {
    eventually_true_within(DEADLINE, what, check);
}

/// [`eventually_true`] with its own deadline.
pub fn eventually_true_within(deadline: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let probe = || if check() { Ok(()) } else { Err("the check still fails".to_string()) };
    eventually_within(deadline, what, probe);
}
