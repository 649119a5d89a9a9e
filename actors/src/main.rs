//! The `kvdir` binary: parses flags, loads the config file, starts the service and waits.

use std::process::ExitCode;

use kvdir::config::{parse_config_file, parse_flags, Command, DirectoryConfig, Flags, USAGE};
use kvdir_actors::Service;

fn load_directory(flags: &Flags) -> Result<Option<DirectoryConfig>, String> {
    let Some(path) = &flags.kv_events_config_file else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --kv_events_config_file {}: {e}", path.display()))?;
    parse_config_file(&text).map(Some).map_err(|e| format!("{}: {e}", path.display()))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flags = match parse_flags(&args) {
        Ok(Command::Run(f)) => f,
        Ok(Command::Help) => {
            print!("{USAGE}");
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
    let directory = match load_directory(&flags) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if flags.demo {
        return match kvdir_actors::demo::run(flags) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if flags.check_config {
        println!("configuration is valid");
        return ExitCode::SUCCESS;
    }
    match Service::start(flags, directory) {
        Ok(service) => {
            println!("kvdir listening on http://{}", service.http_addr());
            service.wait();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
