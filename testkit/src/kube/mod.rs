//! A real Kubernetes API server for tests (feature `kube`): kube-apiserver 1.20 with its own
//! private etcd, on a free 127.0.0.1 port, with a fresh directory under the system temp dir.
//!
//! - **Binary.** `KVDIR_KUBE_APISERVER`, else `~/.cache/kvdir/kube-apiserver/kube-apiserver`,
//!   built by `scripts/kube-apiserver.sh` (its recipe stamp must match [`RECIPE`]). Without it
//!   [`KubeApiServer::start`] panics with "run scripts/kube-apiserver.sh": a test never skips.
//! - **Users.** Token authentication with three users ([`User`]): `admin` (group
//!   `system:masters`), `kvdir`, whom a Role and RoleBinding made by the harness allow `get`,
//!   `list` and `watch` on pods in [`NAMESPACE`] and nothing else, and `nobody`, who may do
//!   nothing. Authorization is RBAC. [`KubeApiServer::kubeconfig`] is a kubeconfig file per
//!   user, trusting the server's own certificate authority.
//! - **Pods.** There is no scheduler, controller manager or kubelet: a test creates Pod objects
//!   and plays the kubelet by writing their status (`phase`, `podIP`, the `Ready` condition)
//!   through the `pods/status` subresource ([`api`]).
//! - **Address.** Clients reach the server through a gate on a port of its own
//!   ([`KubeApiServer::url`], the kubeconfigs): a TCP forwarder that passes connections only
//!   while the server is ready, as a load balancer in front of API servers does (see
//!   `gate.rs`). The harness's own requests go to the server directly.
//! - **Faults.** [`KubeApiServer::break_connections`] breaks every connection through the gate
//!   (every watch ends mid-stream) and leaves the server up. [`KubeApiServer::stop`] and
//!   [`KubeApiServer::start_again`] kill and restart the API server on the same port,
//!   certificate and etcd (the gate is closed in between). [`KubeApiServer::second`] runs
//!   another API server on the same etcd (changes made through it while the first is down
//!   make the first's watch cache start past every resourceVersion a client held: 410 Gone).
//!
//! Everything is bounded in time ([`START_DEADLINE`], [`REQUEST_TIMEOUT`]); the processes are
//! killed and the directory removed on drop. Use it from plain (not async) test threads: its
//! HTTP client (ureq) is blocking.

pub mod api;
mod gate;
mod process;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::etcd::EtcdServer;
use gate::Gate;
use process::{Files, Process};

/// The namespace whose pods the `kvdir` user may get, list and watch.
pub const NAMESPACE: &str = "engines";
/// The recipe stamp (`kube-apiserver.recipe` beside the binary) this harness needs: keep it
/// equal to `RECIPE` in `scripts/kube-apiserver.sh`.
pub const RECIPE: &str = "3";
/// Environment variable naming the kube-apiserver binary.
pub const ENV_VAR: &str = "KVDIR_KUBE_APISERVER";
/// The longest wait for a started API server to answer `/readyz`.
pub const START_DEADLINE: Duration = Duration::from_secs(60);
/// The longest one request of the harness may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Who talks to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    /// Group `system:masters`: may do anything (the harness itself).
    Admin,
    /// May get, list and watch pods in [`NAMESPACE`], nothing else.
    Kvdir,
    /// Authenticated, with no rights.
    Nobody,
}

impl User {
    /// Every user.
    pub const ALL: [User; 3] = [User::Admin, User::Kvdir, User::Nobody];

    /// The user name (and the kubeconfig's file name stem).
    pub fn name(self) -> &'static str {
        match self {
            User::Admin => "admin",
            User::Kvdir => "kvdir",
            User::Nobody => "nobody",
        }
    }
}

/// A running kube-apiserver with its etcd; see the module doc.
#[derive(Debug)]
pub struct KubeApiServer {
    process: Process,
    gate: Gate,
    /// Shared with a [`KubeApiServer::second`] server: etcd stops when the last one drops.
    etcd: Arc<EtcdServer>,
    files: Arc<Files>,
    client: ureq::Agent,
}

impl KubeApiServer {
    /// Starts etcd and the API server, waits until it is ready, creates [`NAMESPACE`] and the
    /// `kvdir` user's Role and RoleBinding, and writes the kubeconfig files. Panics when any
    /// of it fails, with the server's log tail.
    pub fn start() -> KubeApiServer {
        let binary = process::binary();
        let files = Arc::new(Files::create());
        let etcd = Arc::new(EtcdServer::private());
        let process = Process::start(&binary, &files, &etcd.endpoint, None);
        let gate = Gate::new(process.port());
        gate.open(process.port());
        let client = api::client(files.ca_file());
        let server = KubeApiServer { process, gate, etcd, files, client };
        server.files.write_kubeconfigs(&server.url());
        server.create_namespace(NAMESPACE);
        server.grant_pod_reading(NAMESPACE);
        server
    }

    /// Another API server on the same etcd, serving with the same certificate and tokens (a
    /// client with the kubeconfig's credentials and its own URL can use it). Panics when it
    /// does not become ready.
    pub fn second(&self) -> KubeApiServer {
        let binary = process::binary();
        let cert = self.files.serving_cert();
        let process = Process::start(&binary, &self.files, &self.etcd.endpoint, Some(cert));
        let gate = Gate::new(process.port());
        gate.open(process.port());
        let client = api::client(self.files.ca_file());
        KubeApiServer {
            process,
            gate,
            etcd: Arc::clone(&self.etcd),
            files: Arc::clone(&self.files),
            client,
        }
    }

    /// `https://127.0.0.1:PORT`: the gate, where clients reach the server.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.gate.port())
    }

    /// The server's own address, where the harness sends its requests.
    pub fn direct_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.process.port())
    }

    /// The kubeconfig file of `user` (server [`KubeApiServer::url`] of the first server,
    /// its certificate authority, the user's token, namespace [`NAMESPACE`]).
    pub fn kubeconfig(&self, user: User) -> PathBuf {
        self.files.kubeconfig(user)
    }

    /// The bearer token of `user`.
    pub fn token(&self, user: User) -> &str {
        self.files.token(user)
    }

    /// The PEM file of the certificate authority that signed the serving certificate.
    pub fn ca_file(&self) -> &Path {
        self.files.ca_file()
    }

    /// Breaks every client connection (every watch ends mid-stream); the server stays up and
    /// clients may connect again at once.
    pub fn break_connections(&self) {
        self.gate.break_connections();
    }

    /// Closes the gate (breaking every client connection) and kills the API server
    /// (SIGKILL), leaving it down; etcd keeps running.
    pub fn stop(&mut self) {
        self.gate.close();
        self.process.kill();
    }

    /// Starts the API server again on the same port, certificate and etcd, waits until it is
    /// ready, and only then opens the gate. Works after [`KubeApiServer::stop`], or stops a
    /// running one first.
    pub fn start_again(&mut self) {
        self.stop();
        self.process.respawn(&process::binary(), &self.files, &self.etcd.endpoint);
        self.gate.open(self.process.port());
    }

    /// Whether the API server process is running (not stopped, not exited).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// The last `lines` lines of this API server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The directory of this server's files (tokens, keys, kubeconfigs, logs).
    pub fn dir(&self) -> &Path {
        self.files.dir()
    }
}
