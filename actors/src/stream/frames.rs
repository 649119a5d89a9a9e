//! [`Frames`]: one multipart message received into reused `zmq::Message`s, and the spare
//! [`Batch`] each I/O thread decodes into.
//!
//! A stream's live message used to cost four allocations on receipt (`recv_multipart`: a
//! vector and a copy of each frame) and a fresh batch to decode into. Here the frames are
//! received into messages kept from one receive to the next (`zmq_msg_recv` into an existing
//! message; libzmq hands over its receive buffer without a copy), read in place, and released
//! at once ([`Frames::release`]), so libzmq's receive buffer is free for its next read. The
//! batch an applied live message was decoded into comes back to its thread's spare
//! ([`keep_batch`]) and is cleared for the next message, keeping its capacity.

use std::cell::Cell;

use kvdir::wire::Batch;

/// Frames looked at in place without an allocation (a live message has three).
const INLINE_FRAMES: usize = 4;
/// A batch holding more than this (a snapshot reply) is freed, not kept as the spare.
const MAX_SPARE_BYTES: usize = 256 * 1024;

/// One multipart message, received into messages reused from one receive to the next.
#[derive(Default)]
pub struct Frames {
    msgs: Vec<zmq::Message>,
    count: usize,
}

impl Frames {
    /// Receives the next message without blocking: `Ok(false)` when none is waiting.
    pub fn recv(&mut self, socket: &zmq::Socket) -> Result<bool, zmq::Error> {
        self.release();
        loop {
            if self.msgs.len() == self.count {
                self.msgs.push(zmq::Message::new());
            }
            let flags = if self.count == 0 { zmq::DONTWAIT } else { 0 };
            match socket.recv(&mut self.msgs[self.count], flags) {
                Ok(()) => {}
                Err(zmq::Error::EAGAIN) if self.count == 0 => return Ok(false),
                Err(e) => return Err(e),
            }
            self.count += 1;
            if !self.msgs[self.count - 1].get_more() {
                return Ok(true);
            }
        }
    }

    /// Calls `f` with the frames as byte slices.
    pub fn with<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let msgs = &self.msgs[..self.count];
        if msgs.len() <= INLINE_FRAMES {
            let mut parts: [&[u8]; INLINE_FRAMES] = [&[]; INLINE_FRAMES];
            for (p, m) in parts.iter_mut().zip(msgs) {
                *p = m;
            }
            f(&parts[..msgs.len()])
        } else {
            f(&msgs.iter().map(|m| &m[..]).collect::<Vec<_>>())
        }
    }

    /// Gives the received frames back to libzmq (their receive buffer can be reused).
    pub fn release(&mut self) {
        for m in &mut self.msgs[..self.count] {
            *m = zmq::Message::new();
        }
        self.count = 0;
    }
}

thread_local! {
    /// The calling I/O thread's spare batch.
    static SPARE: Cell<Batch> = Cell::new(Batch::default());
}

/// The calling thread's spare batch (empty, with the capacity of the last one kept).
pub fn take_batch() -> Batch {
    SPARE.take()
}

/// Keeps `batch` as the calling thread's spare, cleared, unless it is large.
pub fn keep_batch(mut batch: Batch) {
    if batch.heap_bytes() <= MAX_SPARE_BYTES {
        batch.clear();
        SPARE.set(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_received_in_place_and_released() {
        let ctx = zmq::Context::new();
        let (push, pull) = (ctx.socket(zmq::PUSH).unwrap(), ctx.socket(zmq::PULL).unwrap());
        pull.bind("inproc://frames").unwrap();
        push.connect("inproc://frames").unwrap();
        let mut f = Frames::default();
        assert!(!f.recv(&pull).unwrap(), "nothing sent yet");
        let big = vec![7u8; 5000];
        push.send_multipart([&b"topic"[..], &[0, 1], &big], 0).unwrap();
        push.send_multipart([&b"a"[..], b"b", b"c", b"d", b"e"], 0).unwrap();
        push.send("one", 0).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !f.recv(&pull).unwrap() {
            assert!(std::time::Instant::now() < deadline, "the message never came");
        }
        f.with(|p| assert_eq!(p, [&b"topic"[..], &[0, 1], &big[..]]));
        assert!(f.recv(&pull).unwrap());
        f.with(|p| assert_eq!(p, [b"a", b"b", b"c", b"d", b"e"]));
        assert!(f.recv(&pull).unwrap());
        f.with(|p| assert_eq!(p, [&b"one"[..]]));
        f.release();
        f.with(|p| assert!(p.is_empty(), "released"));
    }

    #[test]
    fn the_spare_batch_keeps_its_capacity_empty() {
        use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord};
        use kvdir::wire::{decode_batch, encode_batch, Tier};
        let stored = StoredRecord::new(vec![1.into()], None, vec![5; 16], 16, Tier::Device);
        let events = vec![EventRecord::Stored(stored)];
        let record = BatchRecord { timestamp: 1.0, events, dp_rank: Some(0) };
        let payload = encode_batch(&record, BatchForm::Array, EventForm::Map);
        let mut b = take_batch();
        decode_batch(&payload, &mut b).unwrap();
        assert!(!b.events.is_empty());
        let bytes = b.heap_bytes();
        keep_batch(b);
        let again = take_batch();
        assert!(again.events.is_empty() && again.heap_bytes() == bytes);
    }
}
