"""Records a real vLLM's KV event frames for CI (tests/fixtures/vllm-history).

    python scripts/vllm_record.py --out DIR --engine URL --events TCP --replay TCP --topic T

Run by `bash scripts/vllm-e2e.sh --record` against a freshly started vLLM (block size 32). It
subscribes to the live PUB before the first request, drives a short deterministic workload with
token-id prompts through /v1/completions (max_tokens 1), then asks the replay ROUTER for
history from seq 0 and from a middle seq, and saves:
- live.jsonl: one `{"topic_hex", "seq_hex", "payload_hex"}` per live message;
- replay-from-0.jsonl, replay-from-middle.jsonl: one `{"frames_hex": [...]}` per reply
  message, the end marker included;
- workload.json: each step with the seqs it produced and the facts the tests check;
- metrics.txt: the engine's /metrics text after the workload.
"""

import argparse
import json
import os
import random
import time
import urllib.request

import vllm_events as ve

BLOCK = 32
SALT = "fixture-salt"


def post(url, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        text = resp.read()
    return json.loads(text) if text.strip() else None


class Recorder:
    def __init__(self, args):
        self.engine = args.engine
        self.tap = ve.Tap(args.events, args.topic)
        self.rng = random.Random(22)
        self.steps = []

    def tokens(self, n):
        """n distinct-looking token ids, avoiding the 3 special tokens."""
        return [self.rng.randrange(3, 2000) for _ in range(n)]

    def complete(self, prompt, salt=None):
        """One completion; waits until the batch with its stores has arrived."""
        body = {"model": "model", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        start = self.tap.count()
        usage = post(self.engine + "/v1/completions", body)["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        full = len(prompt) // BLOCK
        if cached < full * BLOCK:
            last = prompt[(full - 1) * BLOCK:full * BLOCK]
            self.tap.wait(lambda m: any(b[1] == last for b in ve.stored_blocks(m)), 10, start)
        return cached

    def step(self, name, action, **facts):
        start = self.tap.count()
        facts.update(action() or {})
        msgs = self.tap.since(start)
        seqs = [m[1] for m in msgs]
        self.steps.append(dict(name=name, seqs=[min(seqs), max(seqs)] if seqs else [], **facts))
        print(f"{name}: seqs {self.steps[-1]['seqs']} {facts}")

    def run(self):
        a = self.tokens(3 * BLOCK)
        self.step("three blocks", lambda: {"cached": self.complete(a)})
        ext = a + self.tokens(40)
        self.step("extension of the three blocks", lambda: {"cached": self.complete(ext)})
        self.step("salted copy of the three blocks",
                  lambda: {"cached": self.complete(a, SALT)}, salt=SALT)
        self.step("salted again", lambda: {"cached": self.complete(a + [5, 6], SALT)}, salt=SALT)
        d = self.tokens(2 * BLOCK)
        self.step("duplicate store: first", lambda: {"cached": self.complete(d)})
        self.step("duplicate store: again", lambda: {"cached": self.complete(d)})
        dup = self.dup_hash(d)
        self.step("evict the older copy", lambda: self.evict_one_copy(dup), dup_hash=dup)
        self.step("late child of the removed block",
                  lambda: {"cached": self.complete(d + self.tokens(BLOCK))})
        self.step("reset_prefix_cache, then the three blocks again", lambda: self.reset(a))

    def dup_hash(self, d):
        stores = [b for b in ve.stored_blocks(self.tap.since(0)) if b[1] == d[BLOCK:]]
        assert len(stores) == 2, f"expected two stores of the repeated block, got {len(stores)}"
        assert stores[0][0] == stores[1][0], "the repeated block changed hash"
        return stores[0][0]

    def evict_one_copy(self, dup):
        """Fills the cache from the head of vLLM's free queue until the older copy of `dup`
        is removed: 8-block prompts while nothing is evicted, then one block at a time."""
        fillers = 0
        while ve.removed_hashes(self.tap.since(0)).count(dup) == 0:
            size = BLOCK if ve.removed_hashes(self.tap.since(0)) else 8 * BLOCK
            self.complete(self.tokens(size))
            fillers += 1
            assert fillers < 400, "the repeated block was never evicted"
        removed = ve.removed_hashes(self.tap.since(0)).count(dup)
        return {"fillers": fillers, "dup_removals": removed}

    def reset(self, prompt):
        """vLLM queues AllBlocksCleared until its next step: the next request publishes it."""
        start = self.tap.count()
        post(self.engine + "/reset_prefix_cache")
        cached = self.complete(prompt)
        cleared = any(e["type"] == "AllBlocksCleared" for m in self.tap.since(start) for e in m[3])
        assert cleared, "no AllBlocksCleared after /reset_prefix_cache and a request"
        return {"cached": cached}


def hexframes(frames):
    return {"frames_hex": [f.hex() for f in frames]}


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main():
    p = argparse.ArgumentParser()
    for flag in ("--out", "--engine", "--events", "--replay", "--topic"):
        p.add_argument(flag, required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args)
    time.sleep(1.0)  # PUB/SUB: let the subscription reach the engine before its first batch
    rec.run()
    live = rec.tap.since(0)
    rec.tap.close()
    assert live and live[0][1] == 0, "the live recording does not start at seq 0"
    write_jsonl(os.path.join(args.out, "live.jsonl"),
                [{"topic_hex": t.hex(), "seq_hex": s.to_bytes(8, "big").hex(),
                  "payload_hex": p.hex()} for t, s, p, _ in live])
    middle = live[len(live) // 2][1]
    for name, start in (("replay-from-0", 0), ("replay-from-middle", middle)):
        write_jsonl(os.path.join(args.out, name + ".jsonl"),
                    [hexframes(f) for f in ve.replay(args.replay, start)])
    with urllib.request.urlopen(args.engine + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    with open(os.path.join(args.out, "metrics.txt"), "w") as f:
        f.write(metrics)
    with open(os.path.join(args.out, "workload.json"), "w") as f:
        json.dump({"block_size": BLOCK, "topic": args.topic, "live_messages": len(live),
                   "replay_middle_seq": middle, "steps": rec.steps}, f, indent=1)
    print(f"recorded {len(live)} live messages into {args.out}")


if __name__ == "__main__":
    main()
