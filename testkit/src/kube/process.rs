//! The files and the process of a test's kube-apiserver.
//!
//! - [`Files`]: the directory (tokens, the service-account key made by `openssl genrsa`, the
//!   serving certificate the server makes in `certs/` on its first start, the certificate
//!   authority taken from it, a kubeconfig per user). Removed when the last server drops it.
//! - [`Process`]: one kube-apiserver on a free 127.0.0.1 port, started and polled on
//!   `/readyz` (admin token) until ready, within [`START_DEADLINE`]; killed on drop.

use std::collections::hash_map::RandomState;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{api, User, ENV_VAR, NAMESPACE, RECIPE, START_DEADLINE};
use crate::scratch::{free_port, fresh_dir};

/// Start attempts with a fresh port (a free port can be taken between probe and bind).
const START_ATTEMPTS: u32 = 3;
/// How often a starting server is polled.
const POLL: Duration = Duration::from_millis(100);
/// The longest `openssl genrsa` may take.
const OPENSSL_DEADLINE: Duration = Duration::from_secs(30);

/// The kube-apiserver binary: `KVDIR_KUBE_APISERVER`, else the one the script caches. Panics
/// with the fix when it is missing, or when the recipe stamp beside it (required in the cache,
/// checked when present elsewhere) is not [`RECIPE`].
pub(super) fn binary() -> PathBuf {
    let from_env = std::env::var_os(ENV_VAR).filter(|p| !p.is_empty()).map(PathBuf::from);
    let path = from_env.clone().unwrap_or_else(|| {
        let home = std::env::var_os("HOME").unwrap_or_default();
        Path::new(&home).join(".cache/kvdir/kube-apiserver/kube-apiserver")
    });
    let fix = "run scripts/kube-apiserver.sh (it builds and caches kube-apiserver)";
    let named = if from_env.is_some() { format!(" ({ENV_VAR})") } else { String::new() };
    assert!(path.is_file(), "no kube-apiserver at {}{named}: {fix}", path.display());
    let stamp = fs::read_to_string(path.with_file_name("kube-apiserver.recipe"));
    let stamp = match (stamp, from_env.is_some()) {
        (Ok(stamp), _) => stamp.trim().to_string(),
        (Err(_), true) => return path,
        (Err(_), false) => "none".to_string(),
    };
    assert!(
        stamp == RECIPE,
        "{} was built by recipe {stamp}, the tests need recipe {RECIPE}: {fix}",
        path.display()
    );
    path
}

/// The files of one test's API servers.
#[derive(Debug)]
pub(super) struct Files {
    dir: PathBuf,
    ca: PathBuf,
    tokens: [String; 3],
}

impl Files {
    /// A fresh directory with the token file and the service-account key.
    pub(super) fn create() -> Files {
        let dir = fresh_dir("kube");
        let tokens = User::ALL.map(|_| random_token());
        let files = Files { ca: dir.join("ca.crt"), dir, tokens };
        let lines: Vec<String> = User::ALL
            .iter()
            .map(|&user| {
                let groups = if user == User::Admin { ",\"system:masters\"" } else { "" };
                let name = user.name();
                format!("{},{name},{name}-uid{groups}\n", files.token(user))
            })
            .collect();
        write(&files.dir.join("tokens.csv"), &lines.concat());
        files.generate_key();
        files
    }

    fn generate_key(&self) {
        let key = self.dir.join("sa.key");
        let mut cmd = Command::new("openssl");
        cmd.args(["genrsa", "-out"]).arg(&key).arg("2048");
        run_bounded(cmd, OPENSSL_DEADLINE, "openssl genrsa (apt-get install openssl)");
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn token(&self, user: User) -> &str {
        &self.tokens[user as usize]
    }

    /// The certificate authority's PEM file (present once a server has started).
    pub(super) fn ca_file(&self) -> &Path {
        &self.ca
    }

    /// The serving certificate and key the first server made.
    pub(super) fn serving_cert(&self) -> (PathBuf, PathBuf) {
        let certs = self.dir.join("certs");
        (certs.join("apiserver.crt"), certs.join("apiserver.key"))
    }

    /// Takes the certificate authority (the last certificate of the server's chain) into
    /// `ca.crt`, once the server has written its certificate; whether it has.
    fn extract_ca(&self) -> bool {
        if self.ca.is_file() {
            return true;
        }
        let Ok(chain) = fs::read_to_string(self.serving_cert().0) else { return false };
        let Some(start) = chain.rfind("-----BEGIN CERTIFICATE-----") else { return false };
        if !chain[start..].contains("-----END CERTIFICATE-----") {
            return false;
        }
        let tmp = self.dir.join("ca.crt.tmp");
        write(&tmp, &chain[start..]);
        fs::rename(&tmp, &self.ca).unwrap_or_else(|e| panic!("cannot write the CA file: {e}"));
        true
    }

    pub(super) fn kubeconfig(&self, user: User) -> PathBuf {
        self.dir.join(format!("kubeconfig-{}.yaml", user.name()))
    }

    /// A kubeconfig file per user for the server at `url`.
    pub(super) fn write_kubeconfigs(&self, url: &str) {
        for user in User::ALL {
            let text = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kvdir-test\n  cluster:\n    \
                 server: {url}\n    certificate-authority: {ca}\nusers:\n- name: {name}\n  \
                 user:\n    token: {token}\ncontexts:\n- name: kvdir-test\n  context:\n    \
                 cluster: kvdir-test\n    user: {name}\n    namespace: {NAMESPACE}\n\
                 current-context: kvdir-test\n",
                ca = self.ca.display(),
                name = user.name(),
                token = self.token(user),
            );
            write(&self.kubeconfig(user), &text);
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One kube-apiserver process.
#[derive(Debug)]
pub(super) struct Process {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
    /// `--tls-cert-file` and `--tls-private-key-file`; none: the server makes its own in
    /// `certs/`.
    cert: Option<(PathBuf, PathBuf)>,
}

impl Process {
    /// Starts a server on a free port and waits until it is ready; panics when it never is.
    pub(super) fn start(
        binary: &Path,
        files: &Files,
        etcd: &str,
        cert: Option<(PathBuf, PathBuf)>,
    ) -> Process {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let log = files.dir.join(format!("kube-apiserver-{port}.log"));
            let mut process = Process { child: None, port, log, cert: cert.clone() };
            match process.spawn_ready(binary, files, etcd) {
                Ok(()) => return process,
                Err(e) => failures.push(format!("{e}; log tail:\n{}", process.log_tail(30))),
            }
        }
        panic!("kube-apiserver did not start:\n{}", failures.join("\n"));
    }

    /// Starts the server again on its port; panics when it is not ready in time.
    pub(super) fn respawn(&mut self, binary: &Path, files: &Files, etcd: &str) {
        if let Err(e) = self.spawn_ready(binary, files, etcd) {
            panic!("kube-apiserver did not restart: {e}; log tail:\n{}", self.log_tail(30));
        }
    }

    pub(super) fn port(&self) -> u16 {
        self.port
    }

    pub(super) fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills and reaps the process, if any.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(super) fn log_tail(&self, lines: usize) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn spawn_ready(&mut self, binary: &Path, files: &Files, etcd: &str) -> Result<(), String> {
        self.child = Some(self.spawn(binary, files, etcd)?);
        let ready = self.wait_ready(files);
        if ready.is_err() {
            self.kill();
        }
        ready
    }

    fn spawn(&self, binary: &Path, files: &Files, etcd: &str) -> Result<Child, String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("cannot open {}: {e}", self.log.display()))?;
        let dir = &files.dir;
        let path = |name: &str| dir.join(name).display().to_string();
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--etcd-servers=http://{etcd}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.port))
            .arg("--insecure-port=0")
            .arg(format!("--token-auth-file={}", path("tokens.csv")))
            .arg("--authorization-mode=RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!("--service-account-key-file={}", path("sa.key")))
            .arg(format!("--service-account-signing-key-file={}", path("sa.key")))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            // No controller manager makes the `default` service account a Pod needs with this
            // admission plugin; no endpoint of the server itself is published (no Service
            // reaches it).
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false");
        match &self.cert {
            Some((cert, key)) => cmd
                .arg(format!("--tls-cert-file={}", cert.display()))
                .arg(format!("--tls-private-key-file={}", key.display())),
            None => cmd.arg(format!("--cert-dir={}", path("certs"))),
        };
        cmd.stdin(Stdio::null()).stdout(log.try_clone().map_err(|e| e.to_string())?).stderr(log);
        cmd.spawn().map_err(|e| format!("spawning {} failed: {e}", binary.display()))
    }

    /// Polls until the certificate is written and `/readyz` answers 200 to the admin.
    fn wait_ready(&mut self, files: &Files) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        let url = format!("https://127.0.0.1:{}/readyz", self.port);
        let mut client = None;
        let mut last = "no certificate written yet".to_string();
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("kube-apiserver on port {} exited with {status}", self.port));
            }
            if client.is_none() && files.extract_ca() {
                client = Some(api::client(&files.ca));
            }
            if let Some(client) = &client {
                let token = files.token(User::Admin);
                let auth = format!("Bearer {token}");
                match client.get(&url).header("Authorization", &auth).call() {
                    Ok(r) if r.status().as_u16() == 200 => return Ok(()),
                    Ok(r) => last = format!("/readyz answered {}", r.status()),
                    Err(e) => last = format!("/readyz: {e}"),
                }
            }
            thread::sleep(POLL);
        }
        Err(format!("not ready within {START_DEADLINE:?} on port {}: {last}", self.port))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` to completion within `deadline`; panics naming `what` when it fails.
fn run_bounded(mut cmd: Command, deadline: Duration, what: &str) {
    let mut child = match cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!("{what}: not found"),
        Err(e) => panic!("{what}: {e}"),
    };
    let end = Instant::now() + deadline;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return,
            Ok(Some(status)) => panic!("{what} failed: {status}"),
            Ok(None) if Instant::now() < end => thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not finish within {deadline:?}");
            }
        }
    }
}

/// A token nobody could guess within a test's life.
fn random_token() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    let a = hasher.finish();
    hasher.write_u64(a);
    format!("{a:016x}{:016x}", hasher.finish())
}

/// Writes a file, panicking with its path.
fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
