//! The address clients of a test's API server use: a TCP forwarder on 127.0.0.1 that passes
//! connections to the server only while it is open, as a load balancer in front of a cluster's
//! API servers passes them only to a server whose `/readyz` answers.
//!
//! Without it a client that retries while the server starts reaches it before it is ready
//! (kube-apiserver listens before its RBAC caches are filled, and answers 403 then): what a
//! test sees would depend on when the client retried. The bytes pass unchanged (TLS is between
//! the client and the server). Closing the gate breaks every connection through it at once:
//! every watch ends mid-stream.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long the gate tries to reach the server for one connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A forwarder from its own port to the API server's.
#[derive(Debug)]
pub(super) struct Gate {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Whether connections pass.
    open: AtomicBool,
    /// The gate is being dropped.
    done: AtomicBool,
    /// The API server's port.
    target: AtomicU16,
    /// Both ends of every connection passing now.
    passing: Mutex<Vec<TcpStream>>,
}

impl Gate {
    /// A closed gate on a free 127.0.0.1 port, to the server on `target`.
    pub(super) fn new(target: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("cannot bind the API server's gate on 127.0.0.1: {e}"));
        let port = listener.local_addr().map(|a| a.port()).expect("a bound address");
        let shared = Arc::new(Shared::default());
        shared.target.store(target, Ordering::SeqCst);
        let accepting = Arc::clone(&shared);
        let accept = thread::spawn(move || accept_loop(&listener, &accepting));
        Gate { port, shared, accept: Some(accept) }
    }

    /// The port clients connect to.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// Lets new connections through to the server on `target`.
    pub(super) fn open(&self, target: u16) {
        self.shared.target.store(target, Ordering::SeqCst);
        self.shared.open.store(true, Ordering::SeqCst);
    }

    /// Refuses new connections (they are closed at once) and breaks every one passing now.
    pub(super) fn close(&self) {
        self.shared.open.store(false, Ordering::SeqCst);
        self.break_connections();
    }

    /// Breaks every connection passing now; new ones pass if the gate is open.
    pub(super) fn break_connections(&self) {
        let passing = std::mem::take(&mut *self.shared.lock());
        for stream in passing {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::SeqCst);
        self.close();
        // Wakes the accept loop, which then sees `done`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
        self.passing.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Accepts until the gate is dropped; each connection passes (on threads of its own) while the
/// gate is open, and is closed at once otherwise.
fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.done.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if !shared.open.load(Ordering::SeqCst) {
            continue; // dropped: closed
        }
        let target = SocketAddr::from(([127, 0, 0, 1], shared.target.load(Ordering::SeqCst)));
        let Ok(server) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else { continue };
        if let Err(e) = pass(client, server, shared) {
            eprintln!("the API server's gate could not pass a connection: {e}");
        }
    }
}

/// Copies both ways between `client` and `server` until either side ends or the gate breaks
/// the connection.
fn pass(client: TcpStream, server: TcpStream, shared: &Arc<Shared>) -> io::Result<()> {
    let mut passing = shared.lock();
    // Connections that ended on their own no longer have a peer.
    passing.retain(|s| s.peer_addr().is_ok());
    passing.extend([client.try_clone()?, server.try_clone()?]);
    drop(passing);
    let (client_in, server_in) = (client.try_clone()?, server.try_clone()?);
    thread::spawn(move || copy(client_in, server));
    thread::spawn(move || copy(server_in, client));
    Ok(())
}

/// Copies `from` into `to`, then shuts both down (so the other direction ends too).
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
