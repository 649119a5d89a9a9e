//! The kvdir that `kvdir-bench chat` and `kvdir-bench replay` start, and the etcd they use:
//! the flags both modes take, declared once ([`KvdirRunFlags`], flattened into each mode's
//! command), their values ([`KvdirRun`]) and their checks.

use std::path::PathBuf;
use std::time::Duration;

use kvdir::config::args::number;

use super::{check_loopback, switch};

/// The flags of the kvdir that `chat` and `replay` start, and of the etcd they use.
#[allow(dead_code)]
#[derive(Debug, clap::Args)]
#[command(rename_all = "snake_case")]
pub(crate) struct KvdirRunFlags {
    /// etcd where the engines register and kvdir discovers them
    #[arg(long, value_name = "H:P")]
    etcd_addr: Option<String>,
    /// the kvdir binary to start (127.0.0.1, port 0) for each run (chat: not needed with --direct)
    #[arg(long, value_name = "PATH")]
    spawn_kvdir: Option<String>,
    /// etcd namespace [default: a private kvdir-chat-<pid> or kvdir-replay-<pid>; each replay run
    /// adds -<run>-<policy>]
    #[arg(long, value_name = "NS")]
    etcd_namespace: Option<String>,
    /// X-Internal-Token for kvdir (and the spawned kvdir)
    #[arg(long, value_name = "T")]
    internal_api_token: Option<String>,
    /// extra flag for the spawned kvdir (repeatable; use the = form: --kvdir_arg=--flag=value)
    #[arg(long, value_name = "FLAG", action = clap::ArgAction::Append)]
    kvdir_arg: Vec<String>,
    /// longest wait for kvdir to know and synchronize every engine, or to catch up [default: 60]
    #[arg(long, value_name = "S")]
    sync_timeout_seconds: Option<String>,
    /// accept a non-loopback --etcd_addr
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    allow_remote: Option<String>,
    /// print the report as JSON
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    json: Option<String>,
}

/// The values of [`KvdirRunFlags`].
#[derive(Debug, Clone, PartialEq)]
pub struct KvdirRun {
    /// etcd endpoint.
    pub etcd_addr: String,
    /// Namespace (replay: the prefix of each run's).
    pub namespace: String,
    /// kvdir binary.
    pub spawn_kvdir: Option<PathBuf>,
    /// Extra kvdir flags.
    pub kvdir_args: Vec<String>,
    /// `X-Internal-Token`.
    pub internal_api_token: Option<String>,
    /// Deadline of every wait on kvdir.
    pub sync_timeout: Duration,
    /// Print JSON.
    pub json: bool,
    /// Accept a non-loopback `--etcd_addr`.
    pub allow_remote: bool,
}

impl KvdirRun {
    /// The defaults of mode `mode` (`chat`, `replay`): a namespace of this process's own.
    pub fn new(mode: &str) -> Self {
        KvdirRun {
            etcd_addr: String::new(),
            namespace: format!("kvdir-{mode}-{}", std::process::id()),
            spawn_kvdir: None,
            kvdir_args: Vec::new(),
            internal_api_token: None,
            sync_timeout: Duration::from_secs(60),
            json: false,
            allow_remote: false,
        }
    }

    /// Sets flag `--name` to `value`; `None` when it is not one of these flags.
    pub fn set(&mut self, name: &str, value: &str) -> Option<Result<(), String>> {
        let set = |v: &mut Self| -> Result<(), String> {
            match name {
                "etcd_addr" => v.etcd_addr = value.to_string(),
                "etcd_namespace" => v.namespace = value.to_string(),
                "spawn_kvdir" => v.spawn_kvdir = Some(PathBuf::from(value)),
                "kvdir_arg" => v.kvdir_args.push(value.to_string()),
                "internal_api_token" => v.internal_api_token = Some(value.to_string()),
                "sync_timeout_seconds" => {
                    let seconds = number::<f64>(name, value)?.max(1.0);
                    v.sync_timeout = Duration::from_secs_f64(seconds);
                }
                "json" => v.json = switch(name, value)?,
                _ => v.allow_remote = switch(name, value)?,
            }
            Ok(())
        };
        const NAMES: [&str; 8] = [
            "etcd_addr",
            "etcd_namespace",
            "spawn_kvdir",
            "kvdir_arg",
            "internal_api_token",
            "sync_timeout_seconds",
            "json",
            "allow_remote",
        ];
        NAMES.contains(&name).then(|| set(self))
    }

    /// The problems of these flags: `--etcd_addr` is required and on this host unless
    /// `--allow_remote`.
    pub fn check(&self, problems: &mut Vec<String>) {
        if self.etcd_addr.is_empty() {
            problems.push("--etcd_addr H:P is required".to_string());
        } else if !self.allow_remote {
            check_loopback("etcd_addr", &self.etcd_addr, problems);
        }
    }
}
