//! [`Registration`]: a simulated engine registers itself in etcd like an xLLM engine
//! (protocol.md section 5) and, optionally, sends heartbeats to kvdir (section 5.2).
//!
//! - The instance key `<prefix>XLLM:<TYPE>:<name>` holds the instance JSON under a lease of
//!   `ttl_s` seconds, kept alive every `ttl_s / 3`. At each keepalive the key is checked and put
//!   again if it went missing (deleted by someone, or the lease expired).
//! - With `write_loadmetrics`, `<prefix>XLLM:LOADMETRICS:<name>` (no lease) holds the load set
//!   by [`Registration::set_load`], whose `waiting_requests_num` also counts the engine's OpenAI
//!   requests waiting or prefilling (rewritten at keepalives when it changed).
//! - With `heartbeat_to`, a task POSTs `/v1/internal/heartbeat` every `heartbeat_interval`.
//!
//! The etcd client is async. Every registration of the process is a task on one shared
//! current-thread tokio runtime in one thread (see `worker`), with one etcd client per
//! endpoint, so 1,024 registered engines are not 1,024 threads or connections; every method
//! here is synchronous. Every etcd call is bounded by [`ETCD_OP_TIMEOUT`].

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self as std_mpsc, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvdir::registry::namespace_prefix;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedSender;
use tracing::warn;

use crate::openai::RequestLoad;
use crate::{SimEngine, SimError};

mod heartbeat;
mod worker;

use heartbeat::Heartbeat;
use worker::{Command, Setup};

/// Upper bound of one etcd call (connect, grant, put, get, keepalive, revoke).
pub const ETCD_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How an engine registers. `Default` gives a DEFAULT instance in no namespace at
/// `127.0.0.1:2379`, TTL 3 s, no heartbeats, no LOADMETRICS.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrationOptions {
    /// etcd client endpoint, `host:port` (or `http://host:port`).
    pub etcd: String,
    /// Key namespace: `""` for none, `"prod"` for `/prod/`.
    pub namespace: String,
    /// Instance type: 0 DEFAULT, 1 PREFILL, 2 DECODE, 3 MIX.
    pub kind: u8,
    /// For MIX: what it currently acts as (1 PREFILL, 2 DECODE); omitted when `None`.
    pub current_type: Option<u8>,
    /// `None` draws a random id at every start.
    pub incarnation_id: Option<String>,
    /// `register_ts_ms` of the instance JSON; omitted when `None`.
    pub register_ts_ms: Option<u64>,
    /// `backend_type` of the instance JSON ("xllm", "vllm"); omitted when `None`.
    pub backend_type: Option<String>,
    /// Lease TTL in seconds (etcd raises values below its minimum, about 2 s).
    pub ttl_s: i64,
    /// kvdir's HTTP address `host:port` for heartbeats; `None` sends none.
    pub heartbeat_to: Option<String>,
    /// Time between heartbeats.
    pub heartbeat_interval: Duration,
    /// `X-Internal-Token` header of heartbeats, when kvdir requires one.
    pub internal_token: Option<String>,
    /// Also write `XLLM:LOADMETRICS:<name>`.
    pub write_loadmetrics: bool,
}

impl Default for RegistrationOptions {
    fn default() -> Self {
        RegistrationOptions {
            etcd: "127.0.0.1:2379".to_string(),
            namespace: String::new(),
            kind: 0,
            current_type: None,
            incarnation_id: None,
            register_ts_ms: None,
            backend_type: None,
            ttl_s: 3,
            heartbeat_to: None,
            heartbeat_interval: Duration::from_millis(500),
            internal_token: None,
            write_loadmetrics: false,
        }
    }
}

impl RegistrationOptions {
    /// Checks every option for an engine with HTTP port `http_port`; all problems at once.
    pub fn validate(&self, http_port: u16) -> Result<(), SimError> {
        let mut problems = Vec::new();
        if http_port == 0 {
            problems.push(
                "the engine has http_port = 0; registered names are host:port of the HTTP \
                 port, so set EngineConfig::http_port"
                    .to_string(),
            );
        }
        if self.etcd.trim().is_empty() {
            problems.push("etcd endpoint is empty; give host:port".to_string());
        }
        if self.kind > 3 {
            problems.push(format!("kind = {} is not 0 (DEFAULT) .. 3 (MIX)", self.kind));
        }
        if let Some(t) = self.current_type.filter(|t| *t > 3) {
            problems.push(format!("current_type = {t} is not 0 .. 3"));
        }
        if self.ttl_s < 1 {
            problems.push(format!("ttl_s = {} is below the minimum 1", self.ttl_s));
        }
        if self.heartbeat_interval.is_zero() {
            problems.push("heartbeat_interval = 0 s; give a positive interval".to_string());
        }
        if self.incarnation_id.as_deref() == Some("") {
            problems.push("incarnation_id is empty; use None for a random one".to_string());
        }
        if self.heartbeat_to.as_deref().is_some_and(|a| !a.contains(':')) {
            problems.push(format!("heartbeat_to = {:?} is not host:port", self.heartbeat_to));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SimError::Registration(problems))
        }
    }
}

/// The key segment of an instance type code (checked by [`RegistrationOptions::validate`]).
fn type_segment(kind: u8) -> &'static str {
    match kind {
        0 => "DEFAULT",
        1 => "PREFILL",
        2 => "DECODE",
        _ => "MIX",
    }
}

/// The instance JSON of protocol.md section 5, absent optionals omitted; `model` is the
/// served model of an OpenAI engine (`model_name`).
fn instance_json(
    name: &str,
    dp_size: u32,
    incarnation: &str,
    model: Option<&str>,
    o: &RegistrationOptions,
) -> Value {
    let mut v = Map::new();
    v.insert("name".into(), json!(name));
    v.insert("rpc_address".into(), json!(""));
    v.insert("type".into(), json!(o.kind));
    v.insert("dp_size".into(), json!(dp_size));
    v.insert("incarnation_id".into(), json!(incarnation));
    if let Some(ts) = o.register_ts_ms {
        v.insert("register_ts_ms".into(), json!(ts));
    }
    if let Some(backend) = &o.backend_type {
        v.insert("backend_type".into(), json!(backend));
    }
    if let Some(current) = o.current_type {
        v.insert("current_type".into(), json!(current));
    }
    if let Some(model) = model {
        v.insert("model_name".into(), json!(model));
    }
    Value::Object(v)
}

/// A fresh 128-bit hex id: std's randomly keyed hasher over time, process and a counter.
fn random_incarnation() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut halves = [0u64; 2];
    for half in &mut halves {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.write_u64(count);
        *half = h.finish();
    }
    format!("{:016x}{:016x}", halves[0], halves[1])
}

/// The load last set, shared with the worker and the heartbeat thread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Load {
    pub(crate) waiting: u64,
    pub(crate) usage: f64,
}

impl Load {
    pub(crate) fn to_json(self) -> Value {
        json!({ "waiting_requests_num": self.waiting, "gpu_cache_usage_perc": self.usage })
    }
}

/// State read by the worker and the heartbeat thread.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The load last set by [`Registration::set_load`].
    pub(crate) load: Mutex<Load>,
    /// The engine's live OpenAI request counters.
    pub(crate) live: Arc<RequestLoad>,
    /// Heartbeats stop while set.
    pub(crate) paused: AtomicBool,
    /// Last heartbeat HTTP status; 0 = none yet.
    pub(crate) last_status: AtomicU64,
    /// Heartbeats that got any HTTP response.
    pub(crate) answered: AtomicU64,
}

impl Shared {
    /// The load to report: the one set, plus the engine's OpenAI requests waiting or
    /// prefilling right now in `waiting`.
    pub(crate) fn load(&self) -> Load {
        let set = *self.load.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Load { waiting: set.waiting.saturating_add(self.live.in_flight().waiting), ..set }
    }
}

/// A live registration; dropping it revokes the lease and stops heartbeats.
pub struct Registration {
    name: String,
    key: String,
    incarnation_id: String,
    shared: Arc<Shared>,
    commands: Option<UnboundedSender<Command>>,
    heartbeat: Option<Heartbeat>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("incarnation_id", &self.incarnation_id)
            .finish()
    }
}

impl Registration {
    /// Validates `opts`, connects to etcd, grants the lease and puts the instance key (and
    /// LOADMETRICS), then starts keepalives and heartbeats. Returns once the key is written.
    pub fn start(engine: &SimEngine, opts: RegistrationOptions) -> Result<Registration, SimError> {
        opts.validate(engine.config().http_port)?;
        let name = engine.instance_name();
        let prefix = namespace_prefix(&opts.namespace);
        let key = format!("{prefix}XLLM:{}:{name}", type_segment(opts.kind));
        let incarnation_id = opts.incarnation_id.clone().unwrap_or_else(random_incarnation);
        let model = engine.config().openai.as_ref().map(|o| o.served_model_name.as_str());
        let value = instance_json(&name, engine.config().dp_size, &incarnation_id, model, &opts);
        let shared = Arc::new(Shared {
            load: Mutex::new(Load { waiting: 0, usage: 0.0 }),
            live: engine.request_load(),
            paused: AtomicBool::new(false),
            last_status: AtomicU64::new(0),
            answered: AtomicU64::new(0),
        });
        let setup = Setup {
            endpoint: opts.etcd.clone(),
            key: key.clone(),
            value: value.to_string(),
            load_key: opts.write_loadmetrics.then(|| format!("{prefix}XLLM:LOADMETRICS:{name}")),
            ttl_s: opts.ttl_s,
            shared: Arc::clone(&shared),
        };
        let commands = worker::spawn(setup)?;
        let mut registration = Registration {
            name: name.clone(),
            key,
            incarnation_id: incarnation_id.clone(),
            shared: Arc::clone(&shared),
            commands: Some(commands),
            heartbeat: None,
        };
        if let Some(to) = &opts.heartbeat_to {
            let target = heartbeat::Target::new(to, &name, &incarnation_id, &opts);
            registration.heartbeat = Some(Heartbeat::spawn(target, shared)?);
        }
        Ok(registration)
    }

    /// The instance name (`127.0.0.1:<http_port>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The full instance key, such as `/prod/XLLM:PREFILL:127.0.0.1:8000`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The incarnation id written to etcd and sent with heartbeats.
    pub fn incarnation_id(&self) -> &str {
        &self.incarnation_id
    }

    /// Sets the load reported by heartbeats and, with `write_loadmetrics`, written to
    /// LOADMETRICS (asynchronously: the call does not wait for etcd). The reported
    /// `waiting_requests_num` is `waiting` plus the engine's OpenAI requests waiting or
    /// prefilling at the time of the report ([`SimEngine::in_flight`]); LOADMETRICS is also
    /// rewritten at each keepalive when that sum changed.
    pub fn set_load(&self, waiting: u64, usage: f64) {
        *self.shared.load.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Load { waiting, usage };
        self.send(Command::SetLoad);
    }

    /// Stops keepalives and heartbeats: the lease expires within the TTL and the key
    /// disappears, while the engine and its `/health` keep running. Returns once the worker
    /// has stopped keeping the lease alive.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        let (reply, answer) = std_mpsc::sync_channel(1);
        if self.send(Command::Pause(reply)) {
            // A worker that is gone keeps nothing alive either.
            let _ = answer.recv();
        }
    }

    /// Registers again with the same incarnation (the old lease if still alive, else a new
    /// one), then resumes keepalives and heartbeats. Returns once the key is written.
    pub fn resume(&self) -> Result<(), SimError> {
        let (reply, answer) = std_mpsc::sync_channel(1);
        if !self.send(Command::Resume(reply)) {
            return Err(self.stopped());
        }
        answer.recv().map_err(|_| self.stopped())??;
        self.shared.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Revokes the lease (the key is gone at once) and stops heartbeats. A failed revoke is
    /// logged; the lease then expires within the TTL.
    pub fn kill(mut self) {
        if let Err(e) = self.shutdown() {
            warn!(instance = %self.name, error = %e, "revoking the lease failed");
        }
    }

    /// The HTTP status of the last answered heartbeat; `None` before any answer.
    pub fn last_heartbeat_status(&self) -> Option<u16> {
        let status = self.shared.last_status.load(Ordering::SeqCst);
        u16::try_from(status).ok().filter(|s| *s != 0)
    }

    /// How many heartbeats got an HTTP response (of any status).
    pub fn heartbeats_answered(&self) -> u64 {
        self.shared.answered.load(Ordering::SeqCst)
    }

    /// Sends `command` to the worker; false when it is gone.
    fn send(&self, command: Command) -> bool {
        self.commands.as_ref().is_some_and(|c| c.send(command).is_ok())
    }

    fn stopped(&self) -> SimError {
        SimError::RegistrationStopped { name: self.name.clone() }
    }

    /// Stops heartbeats, revokes the lease and ends the worker task. Idempotent.
    fn shutdown(&mut self) -> Result<(), SimError> {
        self.heartbeat = None;
        let Some(commands) = self.commands.take() else { return Ok(()) };
        let (reply, answer) = std_mpsc::sync_channel(1);
        let result = match commands.send(Command::Stop(reply)) {
            Ok(()) => answer.recv().map_err(|_| self.stopped()).and_then(|r| r),
            Err(_) => Err(self.stopped()),
        };
        drop(commands);
        result
    }
}

impl Drop for Registration {
    /// Same as [`Registration::kill`].
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            warn!(instance = %self.name, error = %e, "revoking the lease failed");
        }
    }
}

/// Replies to a command, ignoring a caller that stopped waiting.
fn reply<T>(to: SyncSender<T>, value: T) {
    let _ = to.send(value);
}

#[cfg(test)]
mod tests;
