//! kvdir's test kit, shared by every crate's tests and benches and by nothing that ships (it is
//! only ever a dev-dependency):
//!
//! - [`eventually`] (and [`Patience`] for another deadline): polls what a user would see until
//!   it holds or a deadline passes, then fails with the last observation. Tests never sleep to
//!   synchronise.
//! - [`http`]: one request per connection to a 127.0.0.1 server, panicking on a transport
//!   error (over the simulator's reqwest client, [`kvdir_sim::http::request`]).
//! - [`etcd`]: the etcd server of a test: the one CI names in `KVDIR_TEST_ETCD`, or a private
//!   one; without etcd a test fails loudly, it never skips.
//! - `kube` (feature `kube`): a real kube-apiserver with its own etcd, users with and
//!   without rights, and a test playing the kubelet (`scripts/kube-apiserver.sh` builds it).
//! - [`layers`]: the check that a crate's modules form layers (no import cycle), which the
//!   core and the service run on their own `src/`.

pub mod etcd;
pub mod http;
#[cfg(feature = "kube")]
pub mod kube;
pub mod layers;
mod scratch;

use std::time::{Duration, Instant};

/// How long anything may take to become visible in a test.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// How often [`eventually`] polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What a probe of [`eventually`] says: a `bool` (holds or not yet), or a `Result` with the
/// value wanted or the last observation, which the failure message shows.
pub trait Outcome {
    /// What `eventually` returns once the probe succeeds.
    type Value;
    /// The value, or what was observed instead.
    fn into_result(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();

    fn into_result(self) -> Result<(), String> {
        self.then_some(()).ok_or_else(|| "the check still fails".to_string())
    }
}

impl<T> Outcome for Result<T, String> {
    type Value = T;

    fn into_result(self) -> Result<T, String> {
        self
    }
}

/// Polls `probe` every 20 ms until it succeeds (`true`, or `Ok` with the value returned), or
/// panics with its last observation after [`DEADLINE`]. The one polling helper of every test;
/// a test that needs longer says so with [`Patience`].
pub fn eventually<R: Outcome>(what: &str, probe: impl FnMut() -> R) -> R::Value {
    Patience::new(DEADLINE).eventually(what, probe)
}

/// A deadline other than [`DEADLINE`] (and, for benches, a poll interval other than 20 ms) for
/// [`Patience::eventually`], which is [`eventually`] with them.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    deadline: Duration,
    every: Duration,
}

impl Patience {
    /// Waiting up to `deadline`, polling every 20 ms.
    pub fn new(deadline: Duration) -> Self {
        Patience { deadline, every: POLL_INTERVAL }
    }

    /// The same, polling every `every`.
    pub fn polling_every(self, every: Duration) -> Self {
        Patience { every, ..self }
    }

    /// [`eventually`] with this deadline and poll interval.
    pub fn eventually<R: Outcome>(&self, what: &str, mut probe: impl FnMut() -> R) -> R::Value {
        let deadline = Instant::now() + self.deadline;
        loop {
            match probe().into_result() {
                Ok(v) => return v,
                Err(last) if Instant::now() >= deadline => {
                    panic!("timed out after {:?} waiting for {what}; last: {last}", self.deadline)
                }
                Err(_) => std::thread::sleep(self.every),
            }
        }
    }
}
