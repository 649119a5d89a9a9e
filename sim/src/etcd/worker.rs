//! The etcd side of a [`super::Registration`]: a task that owns the lease, on the one shared
//! current-thread tokio runtime of the process ([`runtime`], thread `sim-etcd`), using the
//! process's client for its etcd endpoint.
//!
//! The task waits for either the next keepalive tick (every `ttl / 3`) or a command. A tick
//! refreshes the lease (one `/v3/lease/keepalive` call) and then makes sure the key exists: a
//! lease that expired is replaced by a new one and the key put again; a key deleted by someone
//! is put again. Each call is independent, so an etcd restart needs no reconnection step. The
//! task ends on [`Command::Stop`] or when the registration's command channel closes, revoking
//! the lease either way.

use std::collections::HashMap;
use std::future::Future;
use std::sync::mpsc::{self as std_mpsc, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use kvdir_etcd::{Client, EtcdError};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::time::{timeout, MissedTickBehavior};
use tracing::{debug, warn};

use super::{reply, Shared, ETCD_OP_TIMEOUT};
use crate::SimError;

/// What the registration asks of its worker.
pub(crate) enum Command {
    /// Write LOADMETRICS from the shared load (when enabled).
    SetLoad,
    /// Stop keepalives until `Resume`.
    Pause(SyncSender<()>),
    /// Put the key again and resume keepalives.
    Resume(SyncSender<Result<(), SimError>>),
    /// Revoke the lease and end.
    Stop(SyncSender<Result<(), SimError>>),
}

/// What the worker needs to register.
pub(crate) struct Setup {
    pub(crate) endpoint: String,
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) load_key: Option<String>,
    pub(crate) ttl_s: i64,
    pub(crate) shared: Arc<Shared>,
}

/// The runtime every registration and heartbeat of the process runs on, started on first use
/// in its own thread.
pub(crate) fn runtime() -> Result<&'static Handle, SimError> {
    static RUNTIME: OnceLock<Handle> = OnceLock::new();
    static STARTING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = STARTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(handle) = RUNTIME.get() {
        return Ok(handle);
    }
    let failed = |e: &dyn std::fmt::Display| etcd_err("-", "starting the etcd runtime", e);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = runtime.map_err(|e| failed(&e))?;
    let handle = runtime.handle().clone();
    thread::Builder::new()
        .name("sim-etcd".to_string())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .map_err(|e| failed(&e))?;
    Ok(RUNTIME.get_or_init(|| handle))
}

/// The process's client for `endpoint` (one connection pool per etcd).
fn client(endpoint: &str) -> Result<Client, SimError> {
    static CLIENTS: Mutex<Option<HashMap<String, Client>>> = Mutex::new(None);
    let mut clients = CLIENTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let clients = clients.get_or_insert_with(HashMap::new);
    if let Some(client) = clients.get(endpoint) {
        return Ok(client.clone());
    }
    let client =
        Client::new(endpoint, ETCD_OP_TIMEOUT).map_err(|e| etcd_err(endpoint, "connect", e))?;
    clients.insert(endpoint.to_string(), client.clone());
    Ok(client)
}

/// Starts the worker task; returns once the key is written (or registering failed).
pub(crate) fn spawn(setup: Setup) -> Result<UnboundedSender<Command>, SimError> {
    let (commands, inbox) = mpsc::unbounded_channel();
    let (ready, started) = std_mpsc::sync_channel(1);
    let endpoint = setup.endpoint.clone();
    runtime()?.spawn(async move {
        let mut worker = match Worker::connect(setup) {
            Ok(worker) => worker,
            Err(e) => return reply(ready, Err(e)),
        };
        if let Err(e) = worker.register().await {
            return reply(ready, Err(e));
        }
        reply(ready, Ok(()));
        worker.run(inbox).await;
    });
    match started.recv() {
        Ok(result) => result.map(|()| commands),
        Err(_) => Err(etcd_err(&endpoint, "starting the worker", "the worker task panicked")),
    }
}

fn etcd_err(endpoint: &str, op: &'static str, detail: impl std::fmt::Display) -> SimError {
    SimError::Etcd { endpoint: endpoint.to_string(), op, detail: detail.to_string() }
}

/// Runs one etcd call under [`ETCD_OP_TIMEOUT`].
async fn timed<T>(
    endpoint: &str,
    op: &'static str,
    call: impl Future<Output = Result<T, EtcdError>>,
) -> Result<T, SimError> {
    match timeout(ETCD_OP_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(etcd_err(endpoint, op, e)),
        Err(_) => Err(etcd_err(endpoint, op, format!("timed out after {ETCD_OP_TIMEOUT:?}"))),
    }
}

struct Worker {
    client: Client,
    setup: Setup,
    lease: Option<i64>,
    paused: bool,
    /// The LOADMETRICS value last written.
    written_load: Option<String>,
}

impl Worker {
    fn connect(setup: Setup) -> Result<Worker, SimError> {
        let client = client(&setup.endpoint)?;
        Ok(Worker { client, setup, lease: None, paused: false, written_load: None })
    }

    /// Keepalive period: a third of the TTL, at least 100 ms.
    fn period(&self) -> Duration {
        let ms = u64::try_from(self.setup.ttl_s.max(1)).unwrap_or(1) * 1000 / 3;
        Duration::from_millis(ms.max(100))
    }

    async fn run(&mut self, mut inbox: UnboundedReceiver<Command>) {
        let mut ticks = tokio::time::interval(self.period());
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks.tick().await; // The first tick is immediate; the key was just written.
        loop {
            tokio::select! {
                _ = ticks.tick() => self.tick().await,
                command = inbox.recv() => match command {
                    Some(Command::SetLoad) => {
                        let written = self.write_load().await;
                        self.log(written);
                    }
                    Some(Command::Pause(to)) => {
                        self.paused = true;
                        reply(to, ());
                    }
                    Some(Command::Resume(to)) => reply(to, self.resume().await),
                    Some(Command::Stop(to)) => return reply(to, self.revoke().await),
                    None => {
                        let revoked = self.revoke().await;
                        return self.log(revoked);
                    }
                },
            }
        }
    }

    fn log(&self, result: Result<(), SimError>) {
        if let Err(e) = result {
            warn!(key = %self.setup.key, error = %e, "etcd registration");
        }
    }

    /// A new lease, the instance key under it, and LOADMETRICS.
    async fn register(&mut self) -> Result<(), SimError> {
        let endpoint = &self.setup.endpoint;
        let lease =
            timed(endpoint, "lease grant", self.client.lease_grant(self.setup.ttl_s)).await?;
        self.lease = Some(lease);
        self.put_key(lease).await?;
        self.write_load().await
    }

    async fn put_key(&mut self, lease: i64) -> Result<(), SimError> {
        let (key, value) = (self.setup.key.as_bytes(), self.setup.value.as_bytes());
        let put = self.client.put(key, value, lease);
        timed(&self.setup.endpoint, "put instance key", put).await.map(|_| ())
    }

    async fn write_load(&mut self) -> Result<(), SimError> {
        let Some(key) = self.setup.load_key.as_deref() else { return Ok(()) };
        let value = self.setup.shared.load().to_json().to_string();
        let put = self.client.put(key.as_bytes(), value.as_bytes(), 0);
        timed(&self.setup.endpoint, "put LOADMETRICS", put).await?;
        self.written_load = Some(value);
        Ok(())
    }

    /// Rewrites LOADMETRICS when the load to report (live requests included) changed.
    async fn refresh_load(&mut self) -> Result<(), SimError> {
        let now = self.setup.shared.load().to_json().to_string();
        if self.setup.load_key.is_none() || self.written_load.as_deref() == Some(now.as_str()) {
            return Ok(());
        }
        self.write_load().await
    }

    async fn tick(&mut self) {
        if self.paused {
            return;
        }
        let result = self.refresh().await;
        self.log(result);
        let result = self.refresh_load().await;
        self.log(result);
    }

    /// Keeps the lease alive (or replaces an expired one) and puts a missing key again.
    async fn refresh(&mut self) -> Result<(), SimError> {
        let Some(lease) = self.lease else { return self.register().await };
        if !self.keep_alive(lease).await? {
            debug!(key = %self.setup.key, lease, "lease expired; registering again");
            return self.register().await;
        }
        let get = self.client.get(self.setup.key.as_bytes());
        if timed(&self.setup.endpoint, "get instance key", get).await?.is_none() {
            debug!(key = %self.setup.key, "instance key missing; putting it again");
            self.put_key(lease).await?;
        }
        Ok(())
    }

    /// One keepalive round trip; `Ok(false)` when the lease no longer exists.
    async fn keep_alive(&mut self, lease: i64) -> Result<bool, SimError> {
        let call = self.client.lease_keep_alive(lease);
        Ok(timed(&self.setup.endpoint, "lease keepalive", call).await? > 0)
    }

    /// Puts the key again under the old lease if it is still alive, else under a new one.
    async fn resume(&mut self) -> Result<(), SimError> {
        self.paused = false;
        let Some(lease) = self.lease else { return self.register().await };
        if self.keep_alive(lease).await.unwrap_or(false) {
            self.put_key(lease).await?;
            self.write_load().await
        } else {
            self.register().await
        }
    }

    /// Revokes the lease; one that expired meanwhile (e.g. while paused) is fine.
    async fn revoke(&mut self) -> Result<(), SimError> {
        let Some(lease) = self.lease.take() else { return Ok(()) };
        let revoke = self.client.lease_revoke(lease);
        timed(&self.setup.endpoint, "lease revoke", revoke).await.map(|_| ())
    }
}
