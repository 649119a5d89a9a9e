"""vLLM's KV events as a test sees them: a live tap, a replay request and the event fields.

Shared by scripts/vllm_e2e.py and scripts/vllm_record.py; runs in the vllm venv (pyzmq,
msgspec). The wire format (vllm/distributed/kv_events.py, 0.32.0):
- live: PUB `[topic, seq as 8 bytes big-endian, msgpack batch]`;
- replay: a ROUTER; a DEALER sends `["", start_seq as 8 bytes big-endian]` and gets
  `["", topic, seq, payload]` per buffered batch with seq >= start_seq, then
  `["", "", 8 bytes of 0xFF, ""]`;
- batch: `[ts, [events...], dp_rank]`, each event a map with a `type` key (what vLLM 0.32.0
  sends) or a tagged array in the declared field order
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, ...]`,
  `["BlockRemoved", block_hashes, medium, group_idx, ...]` or `["AllBlocksCleared"]`.
A sliding-window group's `BlockStored` (hybrid models) lists hashes only for some of the blocks
its `token_ids` cover, so its hashes cannot be matched to token blocks by position:
`stored_blocks` and `prefixes` skip such events (tests/fixtures/vllm-hybrid/README.md).
"""

import threading
import time

import msgspec
import zmq

END_SEQ = b"\xff" * 8
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window")


def event_dict(event):
    """One decoded event as a dict with a `type` (positional or map form)."""
    if isinstance(event, dict):
        return dict(event, type=event.get("type", "?"))
    kind, fields = event[0], list(event[1:])
    names = {"BlockStored": STORED_FIELDS,
             "BlockRemoved": ("block_hashes", "medium", "group_idx")}
    out = {"type": kind}
    for name, value in zip(names.get(kind, ()), fields):
        out[name] = value
    return out


def decode_batch(payload):
    """`(ts, [event dicts], dp_rank)` of one msgpack batch."""
    batch = msgspec.msgpack.decode(payload)
    rank = batch[2] if len(batch) > 2 else None
    return batch[0], [event_dict(e) for e in batch[1]], rank


class Tap:
    """A SUB socket on one engine's live endpoint, keeping every message in a thread."""

    def __init__(self, endpoint, topic):
        self.endpoint = endpoint
        self.messages = []  # (topic, seq, payload, [event dicts])
        self.arrived = []  # time.monotonic() at which each message was received
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            if not self._sub.poll(100):
                continue
            frames = self._sub.recv_multipart()
            if len(frames) != 3:
                continue
            topic, seq, payload = frames
            events = decode_batch(payload)[1]
            with self._lock:
                self.messages.append((topic, int.from_bytes(seq, "big"), payload, events))
                self.arrived.append(time.monotonic())

    def close(self):
        self._stop.set()
        self._thread.join()
        self._sub.close(linger=0)

    def count(self):
        with self._lock:
            return len(self.messages)

    def last_seq(self):
        """The sequence number of the newest message, or None."""
        with self._lock:
            return self.messages[-1][1] if self.messages else None

    def since(self, start):
        """Messages from index `start` on."""
        with self._lock:
            return list(self.messages[start:])

    def record(self):
        """(every message, the time.monotonic() each was received), read together."""
        with self._lock:
            return list(self.messages), list(self.arrived)

    def wait(self, predicate, timeout, start=0):
        """Polls until predicate(messages since start) is true; returns it or None."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate(self.since(start))
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.02)


class ReplayTap(Tap):
    """The same record as a Tap, read from the engine's replay ROUTER instead: for an engine
    whose PUB connects to kvdir (`kv_events_bind`), where no one else can subscribe. It asks
    for the batches after the newest it has every 20 ms, so it also holds the batches
    published before kvdir listened (a live tap holds those published after it subscribed)."""

    def __init__(self, endpoint, topic):  # pylint: disable=super-init-not-called
        self.endpoint = endpoint
        self.messages = []
        self.arrived = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.DEALER)  # closed by Tap.close
        self._sub.connect(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            start = 0 if self.last_seq() is None else self.last_seq() + 1
            self._sub.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not self._stop.is_set():
                if not self._sub.poll(100):
                    continue
                frames = self._sub.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                _, topic, seq, payload = frames
                events = decode_batch(payload)[1]
                with self._lock:
                    self.messages.append((topic, int.from_bytes(seq, "big"), payload, events))
                    self.arrived.append(time.monotonic())


def stored_blocks(messages):
    """Every stored block as (hash, tokens of its block, extra_key, parent) in order. Events
    whose hashes do not cover every token block (a sliding-window group's) are skipped."""
    out = []
    for _, _, _, events in messages:
        for e in events:
            if e["type"] != "BlockStored":
                continue
            size, tokens = e["block_size"], e["token_ids"]
            if len(e["block_hashes"]) != len(tokens) // size:
                continue
            extra = e.get("extra_keys") or [None] * len(e["block_hashes"])
            parent = e["parent_block_hash"]
            for i, h in enumerate(e["block_hashes"]):
                out.append((h, tokens[i * size:(i + 1) * size], extra[i], parent))
                parent = h
    return out


def prefixes(messages):
    """Every stored block's hash -> the token ids from the root to the end of that block,
    chained through the parents the engine named."""
    out = {}
    for h, tokens, _, parent in stored_blocks(messages):
        out[h] = out.get(parent, []) + list(tokens) if parent is not None else list(tokens)
    return out


def removed_hashes(messages):
    """Every removed block hash in order."""
    return [h for _, _, _, events in messages for e in events if e["type"] == "BlockRemoved"
            for h in e["block_hashes"]]


def replay(endpoint, start_seq, timeout=5.0):
    """Asks the replay ROUTER from start_seq; returns every reply message's frames, end
    marker included. Raises TimeoutError when the end marker does not come."""
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        replies, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not dealer.poll(100):
                continue
            frames = dealer.recv_multipart()
            replies.append(frames)
            if len(frames) >= 3 and frames[2] == END_SEQ:
                return replies
        raise TimeoutError(f"no end marker from {endpoint} within {timeout} s "
                           f"({len(replies)} replies)")
    finally:
        dealer.close(linger=0)
