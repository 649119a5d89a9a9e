//! The `kvdir` binary: parses flags, loads the config file, starts the service and waits.

use std::process::ExitCode;
use std::sync::mpsc::Receiver;

use kvdir::config::{
    parse_config_file_with_bind, parse_flags, usage, Command, ConfigFile, Flags, LogFormat,
};
use kvdir_service::held_logs::HeldLogs;
use kvdir_service::Service;
use tracing_subscriber::EnvFilter;

fn load_config_file(flags: &Flags) -> Result<Option<ConfigFile>, String> {
    let Some(path) = &flags.kv_events_config_file else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --kv_events_config_file {}: {e}", path.display()))?;
    parse_config_file_with_bind(&text, flags.kv_events_bind.as_deref())
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// kube's client logs an ERROR for every request that fails, every retry of an outage; kvdir
/// reports the outage itself, once (discovery/kube_watch.rs).
const KUBE_CLIENT_QUIET: &str = "kube_client::client::builder=off";

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`), as text or one JSON object per
/// line; colours only on a terminal. A `RUST_LOG` that does not parse is reported and replaced
/// by `info`; one that does not name `kube_client` leaves [`KUBE_CLIENT_QUIET`] on. The demo's
/// logs are `held` until its banner is printed.
fn init_logs(format: LogFormat, held: &HeldLogs) {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let mut filter = EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        eprintln!("warning: RUST_LOG={spec:?} is not a valid filter ({e}); using info");
        EnvFilter::new("info")
    });
    if let (false, Ok(quiet)) = (spec.contains("kube_client"), KUBE_CLIENT_QUIET.parse()) {
        filter = filter.add_directive(quiet);
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let held = held.clone();
    let logs = tracing_subscriber::fmt()
        .with_writer(move || held.writer())
        .with_ansi(ansi)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
}

/// Waits for SIGTERM (a container runtime stopping kvdir) or SIGINT (Ctrl-C) on a thread of
/// its own, and sends the name of the one that came. Returns once the handlers are installed,
/// so no signal after it gets the default action. kvdir is often a container's first process,
/// which gets no default signal handling: without this, a SIGTERM would be ignored until the
/// runtime's SIGKILL.
fn on_termination() -> Receiver<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let (installed_tx, installed) = std::sync::mpsc::channel();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let (Ok(mut term), Ok(mut int)) =
                (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
            else {
                tracing::warn!("cannot handle SIGTERM and SIGINT: kvdir stops only when killed");
                let _ = installed_tx.send(());
                // The sender stays alive: a closed channel would read as a stop.
                return std::future::pending::<()>().await;
            };
            let _ = installed_tx.send(());
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = %name, "stopping: no new requests; finishing those in flight");
            let _ = tx.send(name);
            std::future::pending::<()>().await
        })
    });
    let _ = installed.recv();
    rx
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let held = HeldLogs::default();
    let flags = match parse_flags(&args) {
        Ok(Command::Run(f)) => {
            if !f.demo {
                held.release();
            }
            init_logs(f.log_format, &held);
            *f
        }
        Ok(Command::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("kvdir {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let file = match load_config_file(&flags) {
        Ok(d) => d,
        Err(e) => {
            held.release();
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if flags.demo {
        let result = kvdir_service::demo::run(flags, &held, on_termination());
        held.release();
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if flags.check_config {
        for warning in &flags.warnings {
            tracing::warn!("{warning}");
        }
        println!("configuration is valid");
        return ExitCode::SUCCESS;
    }
    // Before start-up, so that a signal during it stops kvdir as soon as it is up.
    let signalled = on_termination();
    match Service::start(flags, file) {
        Ok(service) => {
            println!("kvdir listening on http://{}", service.http_addr());
            let stop = service.stop_handle();
            std::thread::spawn(move || {
                if signalled.recv().is_ok() {
                    stop.stop();
                }
            });
            service.wait();
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
