//! kvdir's own ZMTP 3 reader for the streams it connects to (`tcp://IP:PORT` endpoints): a SUB
//! socket's side of the protocol with the NULL mechanism for live messages, and a DEALER's for
//! replay requests, read by the stream's I/O thread.
//!
//! Through libzmq, each live message woke libzmq's I/O thread (which read the connection and
//! signalled the SUB socket's mailbox) and then the pool thread (which read the mailbox and the
//! message): two wake-ups and about six system calls a message, most of a connected stream's
//! cost per batch. Here the pool thread reads the TCP connection itself, every connection that
//! became readable in one wake-up, one `read` each; a replay (every stream's periodic resync)
//! no longer has libzmq's I/O thread connect, greet and tear down a DEALER either. Publishers
//! stay libzmq (vLLM, SGLang and xLLM use pyzmq or libzmq PUB and ROUTER sockets); endpoints
//! naming a host still go through libzmq.
//!
//! - `codec.rs`: greeting, frames, READY, subscription, messages, PING's answer (pure).
//! - `conn.rs`: [`Conn`], a connection: handshake, read, reconnect with back-off.
//! - `open.rs`: connecting (a SUB, a DEALER), taking an accepted connection (the bind
//!   endpoint's ports), TCP keepalive.

mod codec;
mod conn;
mod open;

pub use conn::{Conn, Step};
pub use open::endpoint_addr;

#[cfg(test)]
mod tests;
