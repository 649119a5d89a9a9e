//! `kvdir-bench replay`: replays a request trace (Mooncake format, [`trace`]) through the real
//! routing path and reports what routing did to prefix-cache hits and TTFT ([`ReplayReport`]).
//!
//! For each policy ([`ReplayOptions::policies`]: `--policy`, then RR for comparison) a run
//! starts from nothing, through the load tool's modules:
//! 1. `--engines` fresh [`crate::SimEngine`]s with 512-token blocks and no Host tier
//!    ([`super::fleet`]), registered in etcd under a namespace private to the run;
//! 2. a fresh kvdir started with `--spawn_kvdir`, the policy and the CAR knobs, discovering the
//!    engines ([`super::kvdir`]); the run waits until every stream is synchronized and every
//!    instance has a load report ([`super::probe`]);
//! 3. the requests, in trace order, paced at `--speed` ([`step`]): routed by kvdir, run on the
//!    chosen engine, queued in simulated time ([`clock`]);
//! 4. waits until kvdir applied every batch, for the streams' fault counters.
//!
//! The engines and kvdir of a run are stopped before the next one starts.

use std::time::{Duration, Instant};

use super::flags::BenchOptions;
use super::http::Conn;
use super::kvdir::Kvdir;
use super::probe::Probe;
use super::{applied, fleet::Fleet, BenchError};

pub mod clock;
pub mod flags;
pub mod report;
pub mod step;
pub mod trace;

pub use flags::{parse_replay_args, ReplayCommand, ReplayOptions, REPLAY_HELP};
use kvdir::car::Policy;
pub use report::{PolicyRun, ReplayReport, RunSetup};
use step::Replayer;
use trace::Trace;

/// Upper bound of one route request or probe.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest paced replay of one policy, in wall time.
const MAX_WALL: Duration = Duration::from_secs(3600);

/// Replays the trace with every policy and returns the report.
pub fn run(o: &ReplayOptions) -> Result<ReplayReport, BenchError> {
    let trace = Trace::read(&o.trace, o.requests)?;
    check_wall(&trace, o.speed)?;
    let mut runs = Vec::new();
    for policy in o.policies() {
        runs.push(run_policy(o, &trace, policy)?);
    }
    Ok(ReplayReport::new(o, &trace, runs))
}

/// Refuses a pacing under which one policy's replay would take more than [`MAX_WALL`].
fn check_wall(trace: &Trace, speed: Option<f64>) -> Result<(), BenchError> {
    let (Some(first), Some(last)) = (trace.requests.first(), trace.requests.last()) else {
        return Ok(());
    };
    let span = Duration::from_millis(last.timestamp_ms - first.timestamp_ms);
    match speed.map(|s| span.div_f64(s)) {
        Some(wall) if wall > MAX_WALL => Err(BenchError::Flags(vec![format!(
            "--speed {} makes the {} requests ({:.0} s of trace) take {:.0} s per policy, more \
             than {} s; raise --speed or lower --requests",
            speed.unwrap_or_default(),
            trace.requests.len(),
            span.as_secs_f64(),
            wall.as_secs_f64(),
            MAX_WALL.as_secs()
        )])),
        _ => Ok(()),
    }
}

/// One run with `policy` on fresh engines and a fresh kvdir.
fn run_policy(o: &ReplayOptions, trace: &Trace, policy: Policy) -> Result<PolicyRun, BenchError> {
    let b = o.bench_options(policy);
    let mut fleet = Fleet::start(&b)?;
    let mut kvdir = Kvdir::start(&b, &fleet.kvdir_config(&b))?;
    let run = RunSetup { policy, engines: o.engines as usize, speed: o.speed };
    replay_on(o, (&b, run), trace, &mut fleet, &kvdir).map_err(|e| kvdir.explain(e))
}

fn replay_on(
    o: &ReplayOptions,
    (b, run): (&BenchOptions, RunSetup),
    trace: &Trace,
    fleet: &mut Fleet,
    kvdir: &Kvdir,
) -> Result<PolicyRun, BenchError> {
    fleet.register(b, &kvdir.addr)?;
    let conn = || Conn::new(&kvdir.addr, o.internal_api_token.clone(), REQUEST_TIMEOUT);
    let mut probe = Probe::new(conn(), fleet.streams());
    probe.wait_synchronized(true, o.sync_timeout)?;
    let before = probe.views()?;
    let mut replayer = Replayer::new(o, fleet, conn());
    let first = trace.requests[0].timestamp_ms;
    let start = Instant::now();
    for r in &trace.requests {
        let arrival = Duration::from_millis(r.timestamp_ms - first);
        replayer.pace(arrival, start, o.speed);
        replayer.step(r, arrival)?;
    }
    let wall = start.elapsed();
    let (outcomes, mut routes, max_lag) = (replayer.outcomes, replayer.routes, replayer.max_lag);
    routes.latencies.sort();
    routes.wall = wall;
    let (after, lagging) = probe.wait_caught_up(&fleet.last_sequences()?, o.sync_timeout)?;
    let applied = applied(&fleet.streams(), &before, &after, lagging, start, wall);
    Ok(PolicyRun::new(run, &outcomes, routes, applied, max_lag))
}

#[cfg(test)]
mod tests {
    use super::trace::TraceRequest;
    use super::*;

    #[test]
    fn a_pacing_slower_than_an_hour_per_policy_is_refused() {
        let at = |index, timestamp_ms| TraceRequest {
            index,
            timestamp_ms,
            input_length: 1,
            hash_ids: vec![],
        };
        let trace = Trace { requests: vec![at(0, 0), at(1, 7_200_000)] };
        assert!(check_wall(&trace, Some(2.0)).is_ok(), "3600 s is the limit itself");
        assert!(check_wall(&trace, None).is_ok(), "no pacing");
        let err = check_wall(&trace, Some(1.0)).unwrap_err().to_string();
        assert!(err.contains("take 7200 s per policy, more than 3600 s; raise --speed"), "{err}");
    }
}
