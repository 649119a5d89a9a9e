//! The etcd side of discovery: list the registry keys, then watch from the next revision; when
//! the watch ends (etcd restarted, the watch was cancelled or compacted), list again. etcd being
//! down never stops the service: the loop retries with back-off and reports each failure.
//! Also the `/health` probe that decides between LEASE_LOST and SUSPECT.

use std::time::Duration;

use actix::Addr;
use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::discovery::{Change, DiscoveryActor, EtcdDown, EtcdListed};

/// Retry delays after a failure, doubling.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Lists and watches `<prefix>XLLM:` forever, feeding `discovery`.
pub async fn run(discovery: Addr<DiscoveryActor>, endpoint: String, prefix: String) {
    let mut backoff = BACKOFF_MIN;
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
            backoff = BACKOFF_MIN;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One list-then-watch cycle; returns why it ended.
async fn watch_once(
    discovery: &Addr<DiscoveryActor>,
    endpoint: &str,
    prefix: &str,
) -> Result<String, String> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    let err = |e: etcd_client::Error| format!("etcd {endpoint}: {e}");
    let mut client = Client::connect([endpoint], Some(opts)).await.map_err(err)?;
    let key = format!("{prefix}XLLM:");
    let resp =
        client.get(key.as_str(), Some(GetOptions::new().with_prefix())).await.map_err(err)?;
    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    let kvs = resp
        .kvs()
        .iter()
        .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec()))
        .collect();
    discovery.send(EtcdListed { kvs, revision }).await.map_err(|e| e.to_string())?;
    let wopts =
        WatchOptions::new().with_prefix().with_start_revision(revision + 1).with_progress_notify();
    let mut stream = client.watch(key.as_str(), Some(wopts)).await.map_err(err)?;
    loop {
        let Some(resp) = stream.message().await.map_err(err)? else {
            return Ok("etcd watch ended; listing again".into());
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            return Ok(format!("etcd watch cancelled ({}); listing again", resp.cancel_reason()));
        }
        let changes: Vec<Change> = resp
            .events()
            .iter()
            .filter_map(|ev| {
                let kv = ev.kv()?;
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                Some(match ev.event_type() {
                    EventType::Put => Change::Put(key, kv.value().to_vec()),
                    EventType::Delete => Change::Delete(key),
                })
            })
            .collect();
        if !changes.is_empty() {
            discovery.send(changes_msg(changes)).await.map_err(|e| e.to_string())?;
        }
    }
}

fn changes_msg(changes: Vec<Change>) -> crate::discovery::EtcdChanged {
    crate::discovery::EtcdChanged(changes)
}

/// `GET http://<name>/health`, up to 2 tries of 1000 ms each; true on a 200.
pub async fn probe_health(name: &str) -> bool {
    for _ in 0..2 {
        let attempt = tokio::time::timeout(Duration::from_millis(1000), get_health(name)).await;
        if let Ok(Ok(true)) = attempt {
            return true;
        }
    }
    false
}

async fn get_health(name: &str) -> std::io::Result<bool> {
    let mut s = tokio::net::TcpStream::connect(name).await?;
    let req = format!("GET /health HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let m = s.read(&mut buf[n..]).await?;
        if m == 0 {
            break;
        }
        n += m;
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    Ok(head.split_whitespace().nth(1) == Some("200"))
}
