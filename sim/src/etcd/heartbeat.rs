//! Heartbeats to kvdir (protocol.md section 5.2): a std thread that POSTs
//! `/v1/internal/heartbeat` every interval while the registration is not paused, and records
//! the HTTP status of each answer. It stops when its [`Heartbeat`] is dropped.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::json;
use tracing::debug;

use super::{RegistrationOptions, Shared};
use crate::http;
use crate::SimError;

/// Upper bound of one heartbeat exchange (connect, write, read).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// The kvdir endpoint.
pub(crate) const HEARTBEAT_PATH: &str = "/v1/internal/heartbeat";

/// Where and what to send.
pub(crate) struct Target {
    addr: String,
    name: String,
    incarnation_id: String,
    token: Option<String>,
    interval: Duration,
}

impl Target {
    pub(crate) fn new(addr: &str, name: &str, incarnation: &str, o: &RegistrationOptions) -> Self {
        Target {
            addr: addr.to_string(),
            name: name.to_string(),
            incarnation_id: incarnation.to_string(),
            token: o.internal_token.clone(),
            interval: o.heartbeat_interval,
        }
    }

    fn send(&self, shared: &Shared) {
        let body = json!({
            "name": self.name,
            "incarnation_id": self.incarnation_id,
            "load_metrics": shared.load().to_json(),
        })
        .to_string();
        let headers: Vec<(&str, &str)> =
            self.token.iter().map(|t| ("X-Internal-Token", t.as_str())).collect();
        let sent = http::request(
            &self.addr,
            "POST",
            HEARTBEAT_PATH,
            &headers,
            Some(&body),
            HEARTBEAT_TIMEOUT,
        );
        match sent {
            Ok(response) => {
                shared.last_status.store(u64::from(response.status), Ordering::SeqCst);
                shared.answered.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => debug!(to = %self.addr, error = %e, "heartbeat not delivered"),
        }
    }
}

/// The running heartbeat thread; dropping it stops and joins the thread.
pub(crate) struct Heartbeat {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    pub(crate) fn spawn(target: Target, shared: Arc<Shared>, name: &str) -> Result<Self, SimError> {
        let (stop, stopped) = mpsc::channel();
        let addr = target.addr.clone();
        let thread = thread::Builder::new()
            .name(format!("sim-{name}-heartbeat"))
            .spawn(move || beat(&target, &shared, &stopped))
            .map_err(|e| SimError::Registration(vec![format!("heartbeats to {addr}: {e}")]))?;
        Ok(Heartbeat { stop: Some(stop), thread: Some(thread) })
    }
}

/// Sends a heartbeat every interval until `stopped` gets a message or its sender is dropped.
fn beat(target: &Target, shared: &Shared, stopped: &Receiver<()>) {
    loop {
        match stopped.recv_timeout(target.interval) {
            Err(RecvTimeoutError::Timeout) => {
                if !shared.paused.load(Ordering::SeqCst) {
                    target.send(shared);
                }
            }
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            // A panicked heartbeat thread has nothing left to clean up.
            let _ = thread.join();
        }
    }
}
