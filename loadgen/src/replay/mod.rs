//! `kvdir-bench replay`: replays a request trace (Mooncake format, [`trace`]) through the real
//! routing path and reports what routing did to prefix-cache hits and TTFT ([`ReplayReport`]).
//!
//! For each run ([`ReplayOptions::policies`]: `--policy`, then RR for comparison; or the
//! `--policies` list, e.g. `CAR@0.5,CAR@0.8,TTFT,RR`) a run starts from nothing, through the
//! load tool's modules:
//! 1. `--engines` fresh [`kvdir_sim::SimEngine`]s with 512-token blocks and no Host tier
//!    ([`super::fleet`]), registered in etcd under a namespace private to the run;
//! 2. `--routers` fresh kvdir replicas started with `--spawn_kvdir`, the policy and the CAR
//!    knobs, each discovering the engines and subscribing to their streams on its own
//!    ([`super::kvdir`]); the engines' heartbeats go to the first, their LOADMETRICS (etcd) reach
//!    all; the run waits until every replica has every stream synchronized and every instance
//!    with a load report ([`super::probe`]);
//! 3. the requests, in trace order, paced at `--speed` ([`step`]): routed by kvdir (`--concurrent`
//!    at once), run on the chosen engine, queued in simulated time ([`clock`]);
//! 4. waits until every replica applied every batch, for the streams' fault counters.
//!
//! The engines and kvdir replicas of a run are stopped before the next one starts, and on any
//! error or panic (their `Drop` kills the children).

use std::time::{Duration, Instant};

use super::flags::BenchOptions;
use super::http::Conn;
use super::kvdir::Kvdir;
use super::probe::Probe;
use super::{applied, fleet::Fleet, BenchError};

pub mod affinity;
pub mod approx;
pub mod clock;
pub mod flags;
pub mod report;
pub mod step;
pub mod trace;

pub use flags::{parse_replay_args, replay_help, ReplayCommand, ReplayOptions, RunSpec};
pub use report::{PolicyRun, ReplayReport, RunSetup};
use step::Replayer;
use trace::{Trace, TraceRequest};

/// Upper bound of one route request or probe.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest paced replay of one policy, in wall time.
const MAX_WALL: Duration = Duration::from_secs(3600);

/// Replays the trace with every policy and returns the report.
pub fn run(o: &ReplayOptions) -> Result<ReplayReport, BenchError> {
    let trace = Trace::read(&o.trace, o.requests)?;
    check_wall(&trace, o.speed)?;
    let mut runs = Vec::new();
    for (index, spec) in o.policies().into_iter().enumerate() {
        runs.push(run_policy(o, &trace, index, spec)?);
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

/// Run number `index`, `spec`, on fresh engines and `--routers` fresh kvdir replicas.
fn run_policy(
    o: &ReplayOptions,
    trace: &Trace,
    index: usize,
    spec: RunSpec,
) -> Result<PolicyRun, BenchError> {
    let b = o.bench_options(index, spec);
    let mut fleet = Fleet::start(&b)?;
    let mut config = fleet.kvdir_config(&b);
    if o.approximate {
        approx::configure(&mut config, o);
    }
    let mut kvdirs = Vec::with_capacity(o.routers);
    for _ in 0..o.routers {
        // On an error the replicas started so far are dropped, which kills them.
        kvdirs.push(Kvdir::start(&b, &config)?);
    }
    let run = RunSetup {
        policy: spec.policy,
        label: spec.label(),
        engines: o.engines as usize,
        speed: o.speed,
    };
    let result = replay_on(o, (&b, run), trace, &mut fleet, &kvdirs);
    result.map_err(|(router, e)| kvdirs[router].explain(e))
}

/// The replay itself; an error comes with the replica it concerns (0 when none in particular).
fn replay_on(
    o: &ReplayOptions,
    (b, run): (&BenchOptions, RunSetup),
    trace: &Trace,
    fleet: &mut Fleet,
    kvdirs: &[Kvdir],
) -> Result<PolicyRun, (usize, BenchError)> {
    fleet.register(b, &kvdirs[0].addr).map_err(|e| (0, e))?;
    let conn = |k: &Kvdir| Conn::new(&k.addr, o.kvdir.internal_api_token.clone(), REQUEST_TIMEOUT);
    let mut probes: Vec<Probe> =
        kvdirs.iter().map(|k| Probe::new(conn(k), fleet.streams())).collect();
    let mut before = Vec::with_capacity(probes.len());
    for (i, probe) in probes.iter_mut().enumerate() {
        let ready = match o.approximate {
            true => probe.wait_loaded(o.kvdir.sync_timeout),
            false => probe.wait_synchronized(true, o.kvdir.sync_timeout),
        };
        ready.map_err(|e| (i, e))?;
    }
    for (i, probe) in probes.iter_mut().enumerate().filter(|_| !o.approximate) {
        before.push(probe.views().map_err(|e| (i, e))?);
    }
    let slots = o.concurrent.max(o.routers);
    let mut replayer =
        Replayer::new(o, fleet, (0..slots).map(|j| conn(&kvdirs[j % o.routers])).collect());
    let first = trace.requests[0].timestamp_ms;
    let start = Instant::now();
    for chunk in trace.requests.chunks(o.concurrent) {
        let at = |r: &TraceRequest| Duration::from_millis(r.timestamp_ms - first);
        let batch: Vec<(&TraceRequest, Duration)> = chunk.iter().map(|r| (r, at(r))).collect();
        replayer.pace(batch[0].1, start, o.speed);
        replayer.step(&batch).map_err(|e| (0, e))?;
    }
    let wall = start.elapsed();
    let span = trace.requests.last().map_or(0, |r| r.timestamp_ms - first);
    let mut finished = replayer.finish(Duration::from_millis(span));
    finished.routes.iter_mut().for_each(|r| r.wall = wall);
    if o.approximate {
        let applies = probes.iter().map(|_| approx::nothing_applied(wall)).collect();
        return Ok(PolicyRun::new(run, finished, applies));
    }
    let expected = fleet.last_sequences().map_err(|e| (0, e.into()))?;
    let mut applies = Vec::with_capacity(probes.len());
    for (i, (probe, before)) in probes.iter_mut().zip(&before).enumerate() {
        let (after, lagging) =
            probe.wait_caught_up(&expected, o.kvdir.sync_timeout).map_err(|e| (i, e))?;
        applies.push(applied(&fleet.streams(), before, &after, lagging, start, wall));
    }
    Ok(PolicyRun::new(run, finished, applies))
}

#[cfg(test)]
mod tests {
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
