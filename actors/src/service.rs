//! Wiring: starts the actors for a validated configuration, then the HTTP server.
//!
//! The HTTP port opens only after every stream and index actor runs and the router knows every
//! stream, so a client that can connect always gets complete answers. The service runs its own
//! actix system on a dedicated thread; [`Service`] is the handle to stop it or wait for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use actix::prelude::*;
use actix_web::{web, App, HttpServer};
use kvdir::config::fds::StreamKind;
use kvdir::config::{
    is_bound, BindConfig, ConfigFile, DiscoveryConfig, EngineSpec, Flags, Limits, Source,
    StreamSpec,
};
use kvdir::registry::Identity;
use thiserror::Error;

use crate::directory::Directory;
use crate::discovery::{Beats, DiscoveryActor};
use crate::http::frontdoor::{FrontDoor, FrontDoorSetupError};
use crate::http::{routes, AppState, ServiceMetrics};
use crate::router::{RouterActor, RouterLink};
use crate::stream::{bind_ports, BindRoutes, StreamSet, StreamSource};
use crate::stream::{plan_fds, IoPool};

/// Arbiters (threads) shared by the index actors.
const INDEX_ARBITERS: usize = 2;
/// HTTP worker threads.
const HTTP_WORKERS: usize = 2;

/// Why the service did not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// The HTTP address could not be bound.
    #[error("cannot listen on {addr}: {source}; pick another --http_server_port or --server_host")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The service thread ended before it was ready.
    #[error("the service thread ended during start-up")]
    Died,
    /// The `kv_events_bind` endpoint could not be bound.
    #[error("{0}")]
    KvEventsBind(String),
    /// The I/O threads of the streams did not start.
    #[error("cannot start the streams' I/O threads: {0}; lower io_threads")]
    IoThreads(std::io::Error),
    /// The front door's tokenizer or template did not load.
    #[error(transparent)]
    FrontDoor(#[from] FrontDoorSetupError),
}

/// A running service.
pub struct Service {
    addr: SocketAddr,
    server: actix_web::dev::ServerHandle,
    router: Addr<RouterActor>,
    threads: IoPool,
    thread: Option<JoinHandle<()>>,
}

/// How long a stopping service lets the requests in flight finish (below Kubernetes' default
/// 30 s grace period, so a rollout's SIGTERM ends in an exit, not a SIGKILL).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(25);

/// Stops a running [`Service`] from another thread (see [`Service::stop_handle`]).
#[derive(Clone)]
pub struct StopHandle(actix_web::dev::ServerHandle);

impl StopHandle {
    /// Stops accepting connections and waits for the requests in flight (at most
    /// [`SHUTDOWN_GRACE`]); the service's [`Service::wait`] returns after.
    pub fn stop(&self) {
        let server = self.0.clone();
        actix_rt::System::new().block_on(server.stop(true));
    }
}

/// What to start: static streams (with the process identity they stand for, if known),
/// discovery, listed engines and limits.
#[derive(Debug, Clone, Default)]
pub struct StartPlan {
    /// Streams started once; an identity lets them earn CAR credit.
    pub streams: Vec<(StreamSpec, Option<Identity>)>,
    /// Discovery from etcd (streams for discovered instances), if enabled.
    pub discovery: Option<DiscoveryConfig>,
    /// Engines listed by address (no etcd needed), polled every `engine_poll_interval`.
    pub engines: Vec<EngineSpec>,
    /// How often listed engines are polled.
    pub engine_poll_interval: std::time::Duration,
    /// Engine pods from the Kubernetes API, if configured.
    pub kubernetes: Option<kvdir::config::kubernetes::KubernetesConfig>,
    /// Run the instance registry for routing: listed and registered engines, heartbeats, and
    /// the registry in etcd at `--etcd_addr` when that flag is set, whether or not `discovery`
    /// subscribes to its instances. Off only where something else supplies the candidates (the
    /// demo).
    pub registry: bool,
    /// Limits.
    pub limits: Limits,
    /// The endpoint engines connect to, if kvdir binds one.
    pub bind: Option<BindConfig>,
}

impl Service {
    /// Starts everything and returns once the HTTP port accepts connections. The instance
    /// registry follows etcd at `--etcd_addr` whatever the config file says (unless that
    /// flag is empty): the config file's streams only supply hit ratios.
    pub fn start(flags: Flags, file: Option<ConfigFile>) -> Result<Service, StartError> {
        for warning in &flags.warnings {
            tracing::warn!("{warning}");
        }
        let etcd = if flags.etcd_addr.is_empty() {
            "--etcd_addr is empty: instances are the listed engines only".to_string()
        } else {
            format!("instances, loads and heartbeats still follow etcd at {}", flags.etcd_addr)
        };
        let source = file.as_ref().map(|d| &d.source);
        let streams = match source {
            Some(Source::Streams(s)) => {
                tracing::warn!(
                    "static streams carry no process identity, so they give no CAR credit (list \
                     engines for that); {etcd}"
                );
                s.iter().map(|spec| (spec.clone(), None)).collect()
            }
            _ => Vec::new(),
        };
        let discovery = match source {
            Some(Source::Discovery(d)) if d.enabled && !flags.etcd_addr.is_empty() => {
                Some(d.clone())
            }
            Some(Source::Discovery(_)) => {
                tracing::warn!(
                    "discovery is off (enabled: false or no --etcd_addr): no discovered streams; \
                     {etcd}"
                );
                None
            }
            _ => None,
        };
        let engines = file.as_ref().map(|d| d.engines.clone()).unwrap_or_default();
        let kubernetes = file.as_ref().and_then(|d| d.kubernetes.clone());
        let bind = bind_config(&flags, file.as_ref())?;
        let announce = bind.as_ref().is_some_and(|b| b.announce.is_some());
        if streams.is_empty() && discovery.is_none() && engines.is_empty() && kubernetes.is_none() {
            let until = match announce {
                true => "engines announce themselves on kv_events_bind or are registered",
                false => "engines are registered (POST /register)",
            };
            tracing::warn!(
                "no streams, discovery or engines: the KV directory is empty until {until}, and \
                 CAR uses zero prefill hit ratios; {etcd}"
            );
        }
        let poll =
            file.as_ref().map_or(std::time::Duration::from_secs(1), |d| d.engine_poll_interval);
        let limits = file.map(|d| d.limits).unwrap_or_default();
        let plan = StartPlan {
            bind,
            streams,
            discovery,
            engines,
            engine_poll_interval: poll,
            kubernetes,
            registry: true,
            limits,
        };
        Service::start_plan(flags, plan)
    }

    /// Starts everything for an explicit [`StartPlan`].
    pub fn start_plan(flags: Flags, plan: StartPlan) -> Result<Service, StartError> {
        let front = Arc::new(FrontDoor::new(&flags.front)?);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kvdir-service".into())
            .spawn(move || {
                let sys = actix_rt::System::new();
                sys.block_on(async move {
                    match boot(&flags, plan, front).await {
                        Ok((server, addr, router, threads, arbiters)) => {
                            let _ = tx.send(Ok((server.handle(), addr, router, threads)));
                            let _ = server.await;
                            // Actors holding the stream set (discovery, index actors) are
                            // dropped before `stop` returns, so nothing outlives the service.
                            for arbiter in arbiters {
                                arbiter.stop();
                                let _ = arbiter.join();
                            }
                            System::current().stop();
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|_| StartError::Died)?;
        let (server, addr, router, threads) = rx.recv().map_err(|_| StartError::Died)??;
        tracing::info!(%addr, "kvdir ready");
        Ok(Service { addr, server, router, threads, thread: Some(thread) })
    }

    /// The router, for in-process callers (the demo pushes its instances there).
    pub fn router(&self) -> Addr<RouterActor> {
        self.router.clone()
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the service stops (a signal or [`Service::stop`] from another handle).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            self.threads.stop_and_join();
        }
    }

    /// A handle that stops the service from another thread (a signal handler): the HTTP
    /// server stops accepting, finishes the requests in flight within [`SHUTDOWN_GRACE`], and
    /// [`Service::wait`] then returns once every stream thread has stopped.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.server.clone())
    }

    /// Stops the HTTP server and every actor, and waits for the service and stream threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let server = self.server.clone();
        if let Some(t) = self.thread.take() {
            std::thread::spawn(move || actix_rt::System::new().block_on(server.stop(true)));
            let _ = t.join();
            self.threads.stop_and_join();
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the actors and binds the server; runs inside the service's actix system.
/// What [`boot`] hands back: the server to run, its address, the router, the stream threads and
/// the arbiters (kept alive while the server runs).
type Booted = (actix_web::dev::Server, SocketAddr, Addr<RouterActor>, IoPool, Vec<Arbiter>);

async fn boot(flags: &Flags, plan: StartPlan, front: Arc<FrontDoor>) -> Result<Booted, StartError> {
    let StartPlan {
        streams: specs,
        discovery,
        engines,
        engine_poll_interval,
        kubernetes,
        registry,
        limits,
        bind,
    } = plan;
    let kind = stream_kind(&specs, discovery.as_ref(), &engines, bind.as_ref());
    let budget = plan_fds(&limits, flags.http_max_connections as u64, kind);
    tracing::info!(zmq_sockets = budget.zmq_sockets(), "{}", budget.describe());
    for warning in budget.warnings(limits.max_concurrent_replays) {
        tracing::warn!("{warning}");
    }
    let limits = &Limits { max_concurrent_replays: budget.replays, ..limits };
    let mut params = flags.route.clone();
    let front_policy = flags.front.policy;
    // The registry may be given engines later (`POST /register`), with credit.
    params.directory_enabled = !specs.is_empty() || discovery.is_some() || registry;
    use kvdir::car::Policy;
    if !params.directory_enabled && matches!(params.policy, Policy::Car | Policy::Ttft) {
        tracing::warn!(
            policy = ?params.policy,
            "no KV directory: every hit ratio is 0 and routing follows queues only"
        );
    }
    let overload = flags.front.overload;
    let directory = Arc::new(Directory::new(limits.approximate));
    let for_router = Arc::clone(&directory);
    let actor = RouterActor::new(for_router, params, front_policy).with_overload(overload);
    let route = actor.shared();
    let router = RouterActor::start_in_arbiter(&Arbiter::new().handle(), move |_| actor);
    let mut arbiters: Vec<Arbiter> = (0..INDEX_ARBITERS).map(|_| Arbiter::new()).collect();
    let mut set = StreamSet::new(
        Arc::clone(&directory),
        RouterLink::new(router.clone(), route.clone()),
        arbiters.iter().map(Arbiter::handle).collect(),
        limits.clone(),
        budget.zmq_sockets(),
    )
    .map_err(StartError::IoThreads)?;
    // Bound (and handed to the I/O threads) before any bound stream starts.
    if let Some(b) = bind {
        let routes = BindRoutes::new(b);
        bind_ports(set.zmq(), &set.pool(), routes.clone(), limits)
            .map_err(StartError::KvEventsBind)?;
        set = set.with_bind(routes);
    }
    for (spec, identity) in specs {
        set.start(spec, identity, StreamSource::Static).map_err(|e| {
            tracing::error!(error = %e, "cannot start stream");
            StartError::Died
        })?;
    }
    let streams = set.map();
    let beats: Arc<Beats> = Arc::default();
    let discovery = (registry || discovery.is_some()).then(|| {
        let (addr, ns) = (flags.etcd_addr.clone(), flags.etcd_namespace.clone());
        let set = set.clone();
        let limits = limits.clone();
        let text = front.text_model();
        let beats = Arc::clone(&beats);
        let arbiter = Arbiter::new();
        let actor = DiscoveryActor::start_in_arbiter(&arbiter.handle(), move |_| {
            DiscoveryActor::new(discovery, &limits, addr, &ns, set)
                .with_engines(engines, engine_poll_interval)
                .with_kubernetes(kubernetes)
                .with_parity(text)
                .with_beats(beats)
        });
        arbiters.push(arbiter);
        actor
    });
    let metrics: Arc<ServiceMetrics> = Arc::default();
    let connections = Arc::clone(&metrics);
    let state = web::Data::new(AppState {
        router: router.clone(),
        route,
        directory,
        streams,
        set: set.clone(),
        discovery,
        beats,
        token: flags.internal_api_token.clone(),
        max_request_bytes: flags.max_request_bytes,
        max_query_tokens: flags.max_query_tokens,
        metrics,
        front,
    });
    let addr = format!("{}:{}", flags.server_host, flags.http_server_port);
    let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
        .workers(HTTP_WORKERS)
        // Each connection holds a descriptor: capped (per worker), and idled out, so clients
        // and engines' heartbeats cannot take the streams' descriptors.
        .max_connections(flags.http_max_connections.div_ceil(HTTP_WORKERS))
        .keep_alive(flags.http_keep_alive)
        // The binary handles SIGTERM and SIGINT itself (`StopHandle`): it stops the streams
        // too, which actix's own handler would not.
        .disable_signals()
        .shutdown_timeout(SHUTDOWN_GRACE.as_secs())
        // A client that closes its connection ends its handler at once (a held request leaves
        // the overload queue, an unanswered one is cancelled at its engine) instead of when
        // the answer is written.
        .h1_allow_half_closed(false)
        .on_connect(move |conn, ext| {
            no_delay(conn);
            // Dropped with the connection: the count of open connections goes down.
            ext.insert(connections.connection_opened());
        })
        .bind(&addr)
        .map_err(|source| StartError::Bind { addr: addr.clone(), source })?;
    let bound = server.addrs().first().copied().ok_or(StartError::Died)?;
    Ok((server.run(), bound, router, set.pool(), arbiters))
}

/// How the streams reach their engines, for the descriptor budget: bound only when every
/// source of streams publishes to the bind endpoint (registered streams may still connect).
fn stream_kind(
    specs: &[(StreamSpec, Option<Identity>)],
    discovery: Option<&DiscoveryConfig>,
    engines: &[EngineSpec],
    bind: Option<&BindConfig>,
) -> StreamKind {
    let static_bound = specs.iter().all(|(s, _)| is_bound(&s.endpoint));
    let discovered_bound = discovery.is_none_or(|d| d.bind.is_some());
    match bind.is_some() && static_bound && discovered_bound && engines.is_empty() {
        true => StreamKind::Bound,
        false => StreamKind::Connected,
    }
}

/// The endpoint engines connect to: the config file's `kv_events_bind` (its endpoint
/// overridden by `--kv_events_bind`), or the flag alone with the default ranks and topic.
fn bind_config(flags: &Flags, file: Option<&ConfigFile>) -> Result<Option<BindConfig>, StartError> {
    let from_file = file.and_then(|d| d.bind.clone());
    Ok(match (from_file, &flags.kv_events_bind) {
        (Some(b), Some(ep)) => Some(BindConfig { endpoint: ep.clone(), ..b }),
        (None, Some(ep)) => Some(BindConfig::with_endpoint(ep).map_err(StartError::KvEventsBind)?),
        (b, None) => b,
    })
}

/// Sends small writes at once. A streamed answer's head goes out before its first chunk
/// exists; with Nagle's algorithm on, that chunk then waited for the client's delayed ACK of
/// the head (about 40 ms on Linux) before leaving.
fn no_delay(conn: &dyn std::any::Any) {
    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an HTTP connection");
        }
    }
}
