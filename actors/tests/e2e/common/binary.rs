//! Tests of the `kvdir` binary: spawning it (reading the address it prints) and requests with
//! the internal token.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};

use kvdir_testkit::http::Response;

/// The `kvdir` binary of this build.
pub fn kvdir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvdir"))
}

/// A turn for a load-tool test (`kvdir_bench` against this build's `kvdir`): the load tool picks
/// its engines' ports from the process id, which every test of this binary shares, so its runs
/// take turns rather than probe the same block of ports at once.
pub fn load_tool_turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A spawned `kvdir` that is killed (and reaped) when dropped, so a failing test leaves no
/// process behind.
pub struct Running {
    /// The process.
    pub child: Child,
    /// `host:port` it listens on.
    pub addr: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary, reads the address from its first line (after `prefix`), and keeps
/// draining its output so it never writes into a closed pipe.
pub fn spawn(args: &[&str], prefix: &str) -> Running {
    let mut cmd = kvdir();
    cmd.args(args);
    spawn_command(cmd, prefix)
}

/// [`spawn`] for a prepared command (environment variables, say).
pub fn spawn_command(mut cmd: Command, prefix: &str) -> Running {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let addr = match line.trim().strip_prefix(prefix) {
        Some(addr) => addr.to_string(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("expected {prefix:?} on the first line, got {line:?}");
        }
    };
    Running { child, addr }
}

/// One request; `token` goes in `X-Internal-Token`.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Response {
    let headers: Vec<(&str, &str)> = token.map(|t| ("X-Internal-Token", t)).into_iter().collect();
    kvdir_testkit::http::request(addr, method, path, &headers, body)
}

/// `POST` of a JSON body without a token; the response body.
pub fn post_to(addr: &str, path: &str, body: &str) -> String {
    request(addr, "POST", path, None, Some(body)).body
}
