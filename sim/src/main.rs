//! The `kvdir-sim` binary: starts simulated engines from flags, prints their endpoints and the
//! static-stream JSON for a kvdir config file (`--dialect vllm`: simulated vLLM engines), then
//! drives a synthetic shared-prefix workload
//! until Ctrl-C (the default SIGINT action ends the process; the OS closes the sockets) or
//! `--duration_s`. With `--etcd_addr` every engine also registers in etcd (and reports its
//! Device usage as load every [`LOAD_EVERY`]); with `--tokenizer_path` every engine serves the
//! OpenAI endpoints on its HTTP port. Everything but the pacing loop lives in the library.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use kvdir_sim::cli::{self, CliCommand, CliOptions};
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::{Registration, SimEngine, SimError};

/// How often the binary prints per-rank sequence numbers and block counts.
const STATUS_EVERY: Duration = Duration::from_secs(10);
/// How often registered engines update their load.
const LOAD_EVERY: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    match cli::parse_args(std::env::args().skip(1)) {
        Ok(CliCommand::Help) => {
            print!("{}", cli::help());
            ExitCode::SUCCESS
        }
        Ok(CliCommand::WriteDemoModel(dir)) => {
            match kvdir_text::demo::write_model(std::path::Path::new(&dir)) {
                Ok(()) => {
                    println!("demo model written to {dir}; serve it with --tokenizer_path {dir}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("kvdir-sim: --write_demo_model {dir}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Ok(CliCommand::Run(options)) => match run(&options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvdir-sim: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("kvdir-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(options: &CliOptions) -> Result<(), SimError> {
    let engines = options
        .engine_configs()?
        .into_iter()
        .map(SimEngine::start)
        .collect::<Result<Vec<_>, _>>()?;
    for engine in &engines {
        match engine.config().http_port {
            0 => println!("engine {}:", engine.config().name),
            _ => println!("engine {} (http {}):", engine.config().name, engine.instance_name()),
        }
        for (rank, ep) in engine.endpoints().iter().enumerate() {
            let replay = match engine.config().dialect {
                kvdir_sim::Dialect::Xllm => "snapshots",
                _ => "history replay",
            };
            println!("  rank {rank}: events {}  {replay} {}", ep.event, ep.replay);
        }
        if let Some(openai) = &engine.config().openai {
            println!(
                "  openai: http://{}/v1/chat/completions (model {:?})",
                engine.instance_name(),
                openai.served_model_name
            );
        }
    }
    let registrations = register(&engines, options)?;
    println!("kvdir config (static streams):");
    println!("{:#}", cli::static_streams_config(&engines));
    drive(&engines, &registrations, options)
}

/// One registration per engine with `--etcd_addr`, else none (the vLLM dialect's usual case).
fn register(engines: &[SimEngine], options: &CliOptions) -> Result<Vec<Registration>, SimError> {
    let Some(opts) = options.registration_options() else { return Ok(Vec::new()) };
    let mut registrations = Vec::with_capacity(engines.len());
    for engine in engines {
        let registration = Registration::start(engine, opts.clone())?;
        println!(
            "registered {} (incarnation {})",
            registration.key(),
            registration.incarnation_id()
        );
        registrations.push(registration);
    }
    Ok(registrations)
}

/// Sets each registration's load: Device usage over all ranks, and no queue besides the
/// OpenAI requests in flight, which the registration adds itself.
fn report_load(engines: &[SimEngine], registrations: &[Registration]) -> Result<(), SimError> {
    for (engine, registration) in engines.iter().zip(registrations) {
        let mut used = 0u64;
        for rank in 0..engine.config().dp_size {
            used += engine.counts(rank)?.0;
        }
        let capacity =
            engine.config().device_capacity_blocks as f64 * f64::from(engine.config().dp_size);
        registration.set_load(0, (used as f64 / capacity).clamp(0.0, 1.0));
    }
    Ok(())
}

/// Sends `--rate` requests per second, each session always to the same (engine, rank).
fn drive(
    engines: &[SimEngine],
    registrations: &[Registration],
    options: &CliOptions,
) -> Result<(), SimError> {
    let targets: Vec<(usize, u32)> = engines
        .iter()
        .enumerate()
        .flat_map(|(e, engine)| (0..engine.config().dp_size).map(move |r| (e, r)))
        .collect();
    let block = options.block_size as usize;
    let mut workload = Workload::new(WorkloadConfig {
        seed: options.seed,
        system_prompt_tokens: 8 * block,
        turn_tokens: (block / 4).max(1)..=4 * block,
        ..WorkloadConfig::default()
    });
    if let Some(path) = &options.query_file {
        let body = serde_json::json!({ "token_ids": workload.system_prompt(0) });
        std::fs::write(path, body.to_string())
            .map_err(|e| SimError::Flags(vec![format!("--query_file {path}: {e}")]))?;
        println!("query body for system prompt 0 written to {path}");
    }
    let start = Instant::now();
    let end = options.duration_s.map(|s| start + Duration::from_secs(s));
    let interval = (options.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / options.rate));
    let (mut next_request, mut next_status) = (start, start + STATUS_EVERY);
    let mut next_load = start;
    loop {
        let now = Instant::now();
        if end.is_some_and(|end| now >= end) {
            return Ok(());
        }
        if now >= next_status {
            print_status(engines, start)?;
            next_status += STATUS_EVERY;
        }
        if now >= next_load && !registrations.is_empty() {
            report_load(engines, registrations)?;
            next_load += LOAD_EVERY;
        }
        match interval {
            Some(interval) if now >= next_request => {
                let request = workload.next_request();
                let (e, rank) = targets[request.session % targets.len()];
                engines[e].process(rank, &request.tokens)?;
                next_request += interval;
            }
            _ => {
                let wake = interval.map_or(next_status, |_| next_request.min(next_status));
                let wake = if registrations.is_empty() { wake } else { wake.min(next_load) };
                let wake = end.map_or(wake, |end| wake.min(end));
                thread::sleep(wake.saturating_duration_since(now));
            }
        }
    }
}

fn print_status(engines: &[SimEngine], start: Instant) -> Result<(), SimError> {
    let elapsed = start.elapsed().as_secs();
    for engine in engines {
        for rank in 0..engine.config().dp_size {
            let (device, host) = engine.counts(rank)?;
            let seq = engine.next_sequence(rank)?;
            let name = &engine.config().name;
            eprintln!(
                "[{elapsed:>5}s] {name} rank {rank}: next_seq {seq} device {device} host {host}"
            );
        }
    }
    Ok(())
}
