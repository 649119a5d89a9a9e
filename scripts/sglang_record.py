"""Records a real SGLang's KV event frames for kvdir's tests (tests/fixtures/sglang).

    python scripts/sglang_record.py --out DIR --engine URL --events TCP --replay TCP --topic T \
        --page 16 --launcher ENGINE_SH

Run by `bash scripts/sglang-e2e.sh --record` against a freshly started SGLang (page size 16).
It subscribes to the live PUB before the first request, drives a short deterministic workload
with token-id prompts through SGLang's native /generate (`input_ids`), then asks the replay
ROUTER for history from seq 0, from a middle seq and from beyond the newest batch, and saves:
- live.jsonl: one `{"topic_hex", "seq_hex", "payload_hex"}` per live message;
- replay-from-0.jsonl, replay-from-middle.jsonl, replay-beyond-end.jsonl: one
  `{"frames_hex": [...]}` per reply message, the end marker included;
- workload.json: each step with the seqs it produced and the facts the tests check;
- metrics.txt and server_info.json: the engine's /metrics and /server_info after the workload.
Runs in the SGLang venv (pyzmq, msgspec); the wire helpers are scripts/vllm_events.py's, as
SGLang's live and replay framing is vLLM's.
"""

import argparse
import json
import os
import random
import time
import urllib.request

import vllm_events as ve

SALT = "fixture-salt"


def post(url, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        text = resp.read()
    try:
        return json.loads(text)
    except ValueError:
        return text.decode(errors="replace")


def get(url):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


class Recorder:
    def __init__(self, args):
        self.engine = args.engine
        self.page = args.page
        self.tap = ve.Tap(args.events, args.topic)
        self.rng = random.Random(32)
        self.steps = []

    def tokens(self, n):
        """n token ids from a seeded generator, avoiding the 3 special tokens."""
        return [self.rng.randrange(3, 2000) for _ in range(n)]

    def generate(self, prompt, new_tokens=1, salt=None):
        """One /generate; returns SGLang's cached_tokens once the batch with the prompt's last
        whole page has arrived (SGLang publishes a step's events after it answers)."""
        body = {"input_ids": prompt,
                "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}}
        if salt:
            body["cache_salt"] = salt
        start = self.tap.count()
        meta = post(self.engine + "/generate", body)["meta_info"]
        cached = meta["cached_tokens"]
        full = len(prompt) // self.page
        if full and cached < full * self.page and not salt:
            last = prompt[(full - 1) * self.page:full * self.page]
            self.tap.wait(lambda m: any(b[1] == last for b in ve.stored_blocks(m)), 10, start)
        time.sleep(0.3)  # the finished request's own store (a page completed by output)
        return cached

    def step(self, name, action, **facts):
        start = self.tap.count()
        facts.update(action() or {})
        msgs = self.tap.since(start)
        seqs = [m[1] for m in msgs]
        kinds = sorted({e["type"] for m in msgs for e in m[3]})
        self.steps.append(dict(name=name, seqs=[min(seqs), max(seqs)] if seqs else [],
                               events=kinds, **facts))
        print(f"{name}: seqs {self.steps[-1]['seqs']} {kinds} {facts}", flush=True)

    def run(self):
        p = self.page
        a = self.tokens(3 * p + 5)
        self.step("three pages and 5 tokens", lambda: {"cached": self.generate(a),
                                                       "prompt_tokens": len(a)})
        self.step("the same prompt again", lambda: {"cached": self.generate(a)})
        ext = a + self.tokens(2 * p)
        self.step("extension by two pages", lambda: {"cached": self.generate(ext),
                                                     "prompt_tokens": len(ext)})
        out = self.tokens(2 * p - 1)
        self.step("a page completed by output tokens",
                  lambda: {"cached": self.generate(out, new_tokens=3),
                           "prompt_tokens": len(out), "max_new_tokens": 3})
        self.step("the three pages with cache_salt",
                  lambda: {"cached": self.generate(a, salt=SALT)}, salt=SALT)
        self.step("salted again", lambda: {"cached": self.generate(a, salt=SALT)}, salt=SALT)
        self.step("evictions: 1000-token fillers until the three pages are removed",
                  lambda: self.evict(a))
        self.step("after the evictions, the three pages again",
                  lambda: {"cached": self.generate(a)})
        self.step("/flush_cache, then the three pages", lambda: self.flush(a))

    def evict(self, a):
        """Fills SGLang's 4096-token pool with 1000-token prompts until one of a's pages is
        removed (SGLang evicts leaves first, least recently used)."""
        first = [b[0] for b in ve.stored_blocks(self.tap.since(0)) if b[1] == a[:self.page]]
        fillers = 0
        while not set(first) & set(ve.removed_hashes(self.tap.since(0))):
            self.generate(self.tokens(1000))
            fillers += 1
            assert fillers < 20, "the three pages were never evicted"
        return {"fillers": fillers, "removed": len(ve.removed_hashes(self.tap.since(0)))}

    def flush(self, a):
        """SGLang publishes AllBlocksCleared when it flushes (an idle engine only)."""
        answer = post(self.engine + "/flush_cache")
        cleared = self.tap.wait(lambda m: any(e["type"] == "AllBlocksCleared" for x in m
                                              for e in x[3]), 10, len(self.tap.since(0)) - 1)
        assert cleared, f"no AllBlocksCleared after /flush_cache ({answer!r})"
        return {"flush_answer": str(answer).strip()[:40], "cached": self.generate(a)}


def hexframes(frames):
    return {"frames_hex": [f.hex() for f in frames]}


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main():
    p = argparse.ArgumentParser()
    for flag in ("--out", "--engine", "--events", "--replay", "--topic", "--launcher"):
        p.add_argument(flag, required=True)
    p.add_argument("--page", type=int, default=16)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args)
    time.sleep(1.0)  # PUB/SUB: let the subscription reach the engine before its first batch
    rec.run()
    live = rec.tap.since(0)
    rec.tap.close()
    write_jsonl(os.path.join(args.out, "live.jsonl"),
                [{"topic_hex": t.hex(), "seq_hex": s.to_bytes(8, "big").hex(),
                  "payload_hex": pl.hex()} for t, s, pl, _ in live])
    middle = live[len(live) // 2][1]
    beyond = live[-1][1] + 5
    for name, start in (("replay-from-0", 0), ("replay-from-middle", middle),
                        ("replay-beyond-end", beyond)):
        write_jsonl(os.path.join(args.out, name + ".jsonl"),
                    [hexframes(f) for f in ve.replay(args.replay, start)])
    with open(os.path.join(args.out, "metrics.txt"), "w") as f:
        f.write(get(args.engine + "/metrics"))
    info = json.loads(get(args.engine + "/server_info"))
    keep = {k: info.get(k) for k in ("kv_events", "page_size", "version", "max_total_num_tokens",
                                     "kv_event_sources", "enable_cache_report",
                                     "enable_metrics", "kv_events_config") if k in info}
    with open(os.path.join(args.out, "server_info.json"), "w") as f:
        json.dump(keep, f, indent=1)
    with open(os.path.join(args.out, "workload.json"), "w") as f:
        json.dump({"page_size": args.page, "topic": args.topic, "live_messages": len(live),
                   "first_live_seq": live[0][1], "replay_middle_seq": middle,
                   "replay_beyond_seq": beyond, "steps": rec.steps}, f, indent=1)
    print(f"recorded {len(live)} live messages (seqs {live[0][1]}..{live[-1][1]}) into "
          f"{args.out}")


if __name__ == "__main__":
    main()
