//! The client against a real etcd (`KVDIR_TEST_ETCD`, else a private server): every call
//! kvdir and the simulator make, with the answers a user of etcd would see.

use std::time::{Duration, Instant};

use kvdir_etcd::{prefix_end, Client, EtcdError, Event};
use kvdir_testkit::etcd::{etcd_endpoint, EtcdServer};

const TIMEOUT: Duration = Duration::from_secs(2);

/// A key prefix no other test (or earlier run) uses.
fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    format!("/gateway-{test}-{}-{}/", std::process::id(), nanos.as_nanos())
}

fn client(etcd: &EtcdServer) -> Client {
    Client::new(&etcd.endpoint, TIMEOUT).expect("a valid endpoint")
}

#[tokio::test]
async fn put_get_range_in_pages_and_delete() {
    let etcd = etcd_endpoint();
    let client = client(&etcd);
    let p = unique("kv");
    for i in 0..1005 {
        client.put(format!("{p}k{i:05}").as_bytes(), b"v", 0).await.unwrap();
    }
    client.put(format!("{p}x").as_bytes(), &[0, 255, 1], 0).await.unwrap();
    let range = client.range_prefix(p.as_bytes(), 0).await.unwrap();
    assert_eq!(range.kvs.len(), 1006, "paged past the first 1000 keys");
    assert!(range.kvs.windows(2).all(|w| w[0].key < w[1].key), "in key order");
    assert_eq!(range.kvs[1005].value, vec![0, 255, 1], "binary values survive base64");
    assert!(range.revision >= range.kvs.iter().map(|kv| kv.mod_revision).max().unwrap());

    // A range at a past revision is that snapshot, and says so (not etcd's current revision).
    client.put(format!("{p}later").as_bytes(), b"v", 0).await.unwrap();
    let pinned = client.range_prefix(p.as_bytes(), range.revision).await.unwrap();
    assert_eq!(pinned.revision, range.revision);
    assert_eq!(pinned.kvs, range.kvs, "the key put later is not in the old snapshot");
    assert_eq!(client.delete(format!("{p}later").as_bytes()).await.unwrap(), 1);

    let one = client.get(format!("{p}k00007").as_bytes()).await.unwrap().expect("present");
    assert_eq!(one.key_str(), format!("{p}k00007"));
    assert_eq!(client.get(format!("{p}none").as_bytes()).await.unwrap(), None);
    assert_eq!(client.delete(format!("{p}x").as_bytes()).await.unwrap(), 1);
    assert_eq!(client.delete_prefix(p.as_bytes()).await.unwrap(), 1005);
    assert!(client.range_prefix(p.as_bytes(), 0).await.unwrap().kvs.is_empty());
}

#[tokio::test]
async fn leases_keep_keys_alive_until_revoked() {
    let etcd = etcd_endpoint();
    let client = client(&etcd);
    let key = format!("{}leased", unique("lease"));
    let lease = client.lease_grant(5).await.unwrap();
    client.put(key.as_bytes(), b"up", lease).await.unwrap();
    assert_eq!(client.get(key.as_bytes()).await.unwrap().unwrap().lease, lease);
    assert!(client.lease_keep_alive(lease).await.unwrap() > 0);
    assert!(client.lease_revoke(lease).await.unwrap(), "the lease existed");
    assert_eq!(client.get(key.as_bytes()).await.unwrap(), None, "its key went with it");
    assert_eq!(client.lease_keep_alive(lease).await.unwrap(), 0, "a gone lease has TTL 0");
    assert!(!client.lease_revoke(lease).await.unwrap(), "revoking again finds nothing");
}

#[tokio::test]
async fn one_watch_follows_several_prefixes_from_a_revision() {
    let etcd = etcd_endpoint();
    let client = client(&etcd);
    let p = unique("watch");
    let (a, b, other) = (format!("{p}A:"), format!("{p}B:"), format!("{p}C:"));
    let before = client.put(format!("{a}1").as_bytes(), b"old", 0).await.unwrap();
    let ranges =
        [(a.as_bytes(), prefix_end(a.as_bytes())), (b.as_bytes(), prefix_end(b.as_bytes()))];
    let mut watch = client.watch_ranges(&ranges, before, false).await.unwrap();
    client.put(format!("{other}1").as_bytes(), b"unwatched", 0).await.unwrap();
    client.put(format!("{b}1").as_bytes(), b"new", 0).await.unwrap();
    client.delete(format!("{a}1").as_bytes()).await.unwrap();

    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 && Instant::now() < deadline {
        let next = tokio::time::timeout(Duration::from_secs(5), watch.next()).await;
        let message = next.expect("a message in time").unwrap().expect("the stream is open");
        for event in message.events {
            seen.push(match event {
                Event::Put(kv) => {
                    format!("put {} {}", kv.key_str(), String::from_utf8_lossy(&kv.value))
                }
                Event::Delete(kv) => format!("delete {}", kv.key_str()),
            });
        }
    }
    // etcd orders events within one watcher (one prefix), not across watchers.
    let of = |prefix: &str| -> Vec<String> {
        seen.iter().filter(|s| s.contains(prefix)).cloned().collect()
    };
    assert_eq!(of(&a), [format!("put {a}1 old"), format!("delete {a}1")], "{seen:?}");
    assert_eq!(of(&b), [format!("put {b}1 new")], "{seen:?}");
    assert_eq!(seen.len(), 3, "nothing from the unwatched prefix: {seen:?}");
}

#[tokio::test]
async fn a_compacted_start_revision_cancels_the_watch() {
    let etcd = etcd_endpoint();
    let client = client(&etcd);
    let p = unique("compact");
    let first = client.put(format!("{p}k").as_bytes(), b"1", 0).await.unwrap();
    let last = client.put(format!("{p}k").as_bytes(), b"2", 0).await.unwrap();
    client.compact(last).await.unwrap();
    let range = [(p.as_bytes(), prefix_end(p.as_bytes()))];
    let mut watch = client.watch_ranges(&range, first, false).await.unwrap();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(5), watch.next()).await;
        let message = next.expect("a message in time").unwrap().expect("the stream is open");
        if message.canceled {
            assert!(message.compact_revision >= last, "{message:?}");
            break;
        }
        assert!(message.created, "only the creation comes before the cancellation");
    }
}

#[tokio::test]
async fn errors_name_the_endpoint_and_the_operation() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let down = Client::new(&format!("127.0.0.1:{port}"), TIMEOUT).unwrap();
    let e = down.range_prefix(b"XLLM:", 0).await.unwrap_err();
    assert!(matches!(e, EtcdError::Transport { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")) && text.contains("range"), "{text}");
    for bad in ["", "no-port", "http://h:1/path"] {
        let e = Client::new(bad, TIMEOUT).unwrap_err();
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
    assert_eq!(
        Client::new("http://127.0.0.1:2379/", TIMEOUT).unwrap().endpoint(),
        "127.0.0.1:2379"
    );
}
