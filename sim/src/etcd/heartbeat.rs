//! Heartbeats to kvdir (protocol.md section 5.2): one task per registration on the shared
//! etcd runtime ([`super::worker::runtime`]) POSTs `/v1/internal/heartbeat` every interval
//! while the registration is not paused, and records the HTTP status of each answer. All
//! registrations of the process share that one thread and one HTTP client (connection pool).
//! The task stops when its [`Heartbeat`] is dropped.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::debug;

use super::worker::runtime;
use super::{RegistrationOptions, Shared};
use crate::SimError;

/// Upper bound of one heartbeat exchange (connect, write, read).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// The kvdir endpoint.
pub(crate) const HEARTBEAT_PATH: &str = "/v1/internal/heartbeat";

/// Where and what to send.
pub(crate) struct Target {
    url: String,
    name: String,
    incarnation_id: String,
    token: Option<String>,
    interval: Duration,
}

impl Target {
    pub(crate) fn new(addr: &str, name: &str, incarnation: &str, o: &RegistrationOptions) -> Self {
        let addr = addr.trim_start_matches("http://");
        Target {
            url: format!("http://{addr}{HEARTBEAT_PATH}"),
            name: name.to_string(),
            incarnation_id: incarnation.to_string(),
            token: o.internal_token.clone(),
            interval: o.heartbeat_interval,
        }
    }

    async fn send(&self, client: &reqwest::Client, shared: &Shared) {
        let body = json!({
            "name": self.name,
            "incarnation_id": self.incarnation_id,
            "load_metrics": shared.load().to_json(),
        })
        .to_string();
        let mut request = client
            .post(&self.url)
            .header(CONTENT_TYPE, "application/json")
            .timeout(HEARTBEAT_TIMEOUT)
            .body(body);
        if let Some(token) = &self.token {
            request = request.header("X-Internal-Token", token);
        }
        match request.send().await {
            Ok(response) => {
                shared.last_status.store(u64::from(response.status().as_u16()), Ordering::SeqCst);
                shared.answered.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => debug!(to = %self.url, error = %e, "heartbeat not delivered"),
        }
    }
}

/// The client every heartbeat of the process uses.
fn client() -> Result<&'static reqwest::Client, SimError> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client);
    }
    let built = reqwest::Client::builder().no_proxy().build();
    let built =
        built.map_err(|e| SimError::Registration(vec![format!("heartbeat client: {e}")]))?;
    Ok(CLIENT.get_or_init(|| built))
}

/// The running heartbeat task; dropping it stops the task.
pub(crate) struct Heartbeat {
    task: JoinHandle<()>,
}

impl Heartbeat {
    pub(crate) fn spawn(target: Target, shared: Arc<Shared>) -> Result<Self, SimError> {
        let client = client()?;
        let task = runtime()?.spawn(async move {
            let mut ticks = tokio::time::interval(target.interval);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticks.tick().await; // The first tick is immediate; the first beat is one interval on.
            loop {
                ticks.tick().await;
                if !shared.paused.load(Ordering::SeqCst) {
                    target.send(client, &shared).await;
                }
            }
        });
        Ok(Heartbeat { task })
    }
}

impl Drop for Heartbeat {
    /// Cancels the task at its next await: no heartbeat starts after the drop.
    fn drop(&mut self) {
        self.task.abort();
    }
}
