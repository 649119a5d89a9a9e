//! The etcd side of discovery: list the registry keys, then watch from the next revision; when
//! the watch ends (etcd restarted, the watch was cancelled or compacted), list again. etcd being
//! down never stops the service: the loop retries with back-off and reports each failure.
//! Also the `/health` probe that decides between LEASE_LOST and SUSPECT.

use std::time::Duration;

use actix::Addr;
use kvdir::backoff::Backoff;
use kvdir::registry::{watched_prefixes, watched_range};
use kvdir_etcd::{Client, Event};

use super::{Change, DiscoveryActor, EtcdDown, EtcdListed};

/// Retry delays after a failure, doubling.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Upper bound of one etcd call (a listing page).
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);

/// Lists the registry prefixes ([`watched_prefixes`]) under `prefix` and watches
/// [`watched_range`], forever, feeding `discovery`.
pub async fn run(discovery: Addr<DiscoveryActor>, endpoint: String, prefix: String) {
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    loop {
        let listed_before = std::time::Instant::now();
        let error = match watch_once(&discovery, &endpoint, &prefix).await {
            Ok(reason) | Err(reason) => reason,
        };
        if discovery.connected() {
            discovery.do_send(EtcdDown { error });
        } else {
            return;
        }
        if listed_before.elapsed() > Duration::from_secs(10) {
            backoff.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// One list-then-watch cycle; returns why it ended. The prefixes are listed at one revision
/// (the first listing's), instances before loads, then one range covering them is watched
/// from the next revision (one watcher, so changes arrive in revision order).
async fn watch_once(
    discovery: &Addr<DiscoveryActor>,
    endpoint: &str,
    prefix: &str,
) -> Result<String, String> {
    let client = Client::new(endpoint, ETCD_TIMEOUT).map_err(|e| e.to_string())?;
    let prefixes = watched_prefixes(prefix);
    let mut revision = 0;
    let mut kvs = Vec::new();
    for p in &prefixes {
        let range = client.range_prefix(p.as_bytes(), revision).await.map_err(|e| e.to_string())?;
        revision = range.revision;
        kvs.extend(range.kvs.into_iter().map(|kv| (kv.key_str(), kv.value)));
    }
    discovery.send(EtcdListed { kvs, revision }).await.map_err(|e| e.to_string())?;
    let range = [watched_range(prefix)];
    let mut watch =
        client.watch_ranges(&range, revision + 1, true).await.map_err(|e| e.to_string())?;
    loop {
        let Some(resp) = watch.next().await.map_err(|e| e.to_string())? else {
            return Ok("etcd watch ended; listing again".into());
        };
        if resp.canceled || resp.compact_revision > 0 {
            let reason = if resp.compact_revision > 0 {
                format!("revision {} was compacted", resp.compact_revision)
            } else {
                resp.cancel_reason
            };
            return Ok(format!("etcd watch cancelled ({reason}); listing again"));
        }
        let changes: Vec<Change> = resp
            .events
            .into_iter()
            .map(|event| match event {
                Event::Put(kv) => Change::Put(kv.key_str(), kv.value),
                Event::Delete(kv) => Change::Delete(kv.key_str()),
            })
            .collect();
        if !changes.is_empty() {
            discovery.send(changes_msg(changes)).await.map_err(|e| e.to_string())?;
        }
    }
}

fn changes_msg(changes: Vec<Change>) -> super::EtcdChanged {
    super::EtcdChanged(changes)
}

/// `GET http://<name>/health`, up to 2 tries of 1000 ms each; true on a 200.
pub async fn probe_health(client: &reqwest::Client, name: &str) -> bool {
    let url = format!("http://{name}/health");
    for _ in 0..2 {
        let answer = client.get(&url).timeout(Duration::from_millis(1000)).send().await;
        if answer.is_ok_and(|r| r.status() == reqwest::StatusCode::OK) {
            return true;
        }
    }
    false
}
