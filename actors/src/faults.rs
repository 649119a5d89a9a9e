//! Fault injection at named points of the service, for end-to-end tests of supervision.
//!
//! Some faults have no input that provokes them on demand: a stream thread that cannot create
//! a socket (the process ran out of file descriptors) or a stream thread that falls behind (starved
//! of CPU). Tests arm them here; everything else stays real (sockets, actors,
//! supervisor, HTTP). With the `fault-injection` feature off, every check is a constant no-op;
//! with it on and nothing armed, a check is one uncontended lock.

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// A stream thread opening its sockets.
    WorkerOpen,
    /// A stream thread opening the DEALER of a snapshot request.
    SnapshotRequest,
}

/// What an armed point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail as if the process had run out of file descriptors (`EMFILE`).
    OutOfFiles,
    /// Panic, as a bug would.
    Panic,
}

#[cfg(feature = "fault-injection")]
mod armed {
    use std::sync::Mutex;

    use super::{Fault, FaultPoint};

    pub(super) struct Armed {
        pub point: FaultPoint,
        pub stream: (String, u32),
        pub remaining: u32,
        pub fault: Fault,
    }

    pub(super) static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());
    pub(super) static HELD: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());
}

/// Makes the next `times` checks of `point` by stream `instance`/`dp_rank` fail with `fault`.
#[cfg(feature = "fault-injection")]
pub fn arm(point: FaultPoint, instance: &str, dp_rank: u32, times: u32, fault: Fault) {
    let stream = (instance.to_string(), dp_rank);
    crate::sync::lock(&armed::ARMED).push(armed::Armed { point, stream, remaining: times, fault });
}

/// Checks `point` for a stream: `Err` (or a panic) when a fault is armed for it.
pub fn check(point: FaultPoint, instance: &str, dp_rank: u32) -> Result<(), zmq::Error> {
    #[cfg(feature = "fault-injection")]
    {
        let fault = crate::sync::lock(&armed::ARMED)
            .iter_mut()
            .find(|a| {
                a.point == point
                    && a.remaining > 0
                    && a.stream.0 == instance
                    && a.stream.1 == dp_rank
            })
            .map(|a| {
                a.remaining -= 1;
                a.fault
            });
        match fault {
            Some(Fault::OutOfFiles) => return Err(zmq::Error::EMFILE),
            Some(Fault::Panic) => panic!("injected fault at {point:?}"),
            None => {}
        }
    }
    let _ = (point, instance, dp_rank);
    Ok(())
}

/// Holds the stream thread of `instance`/`dp_rank` before its next index write (as a thread
/// starved of CPU would be) until the returned guard is dropped or the stream stops.
#[cfg(feature = "fault-injection")]
pub fn hold_stream(instance: &str, dp_rank: u32) -> StreamHold {
    let stream = (instance.to_string(), dp_rank);
    crate::sync::lock(&armed::HELD).push(stream.clone());
    StreamHold { stream }
}

/// Releases a held stream thread when dropped.
#[cfg(feature = "fault-injection")]
pub struct StreamHold {
    stream: (String, u32),
}

#[cfg(feature = "fault-injection")]
impl Drop for StreamHold {
    fn drop(&mut self) {
        crate::sync::lock(&armed::HELD).retain(|s| *s != self.stream);
    }
}

/// Whether the stream thread of `instance`/`dp_rank` is held.
pub fn stream_held(instance: &str, dp_rank: u32) -> bool {
    #[cfg(feature = "fault-injection")]
    {
        let held = crate::sync::lock(&armed::HELD);
        held.iter().any(|(i, d)| i == instance && *d == dp_rank)
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = (instance, dp_rank);
        false
    }
}
