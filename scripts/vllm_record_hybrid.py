"""Records a real vLLM's KV events with chat traffic, for hybrid (multi-group) models
(tests/fixtures/vllm-hybrid).

    python scripts/vllm_record_hybrid.py --out DIR --engine URL --events TCP [--topic kv]
        [--conversations N] [--seed S] [--meta JSON]

Run by `bash scripts/vllm-record-hybrid.sh` against a freshly started vLLM (block size 32,
prefix caching, KV events, `--enable-prompt-tokens-details`). It subscribes to the live PUB
before the first request and sends chat requests one at a time to /v1/chat/completions
(`return_token_ids`, temperature 0, max_tokens 4): conversations over a few shared system
prompts, each continued for several turns, interleaved so that the small cache evicts; then one
chat sent twice, a block-aligned token-id prompt sent twice to /v1/completions and once
extended, a token-id prompt followed by two of its prefixes (tags "fallback ..."), and two cold
chats sent at the same time, twice (tag "concurrent"). After each answer
it waits until the engine has published nothing for QUIET_S, so every batch is assigned to the
request that caused it (a concurrent pair shares its `seq_before` and `seqs`). It saves:
- live.jsonl: one `{"topic_hex", "seq_hex", "payload_hex"}` per live message (as
  tests/fixtures/vllm-history/live.jsonl);
- requests.jsonl: one line per request, in order: `n`, `conv`, `turn`, `system` (which shared
  system prompt), `seq_before` (the newest live seq received before the request was sent, -1
  for none: replay the batches with seq <= seq_before, then look the prompt up), `seqs`
  ([first, last] seq of the batches published while it ran, [] for none), `prompt_token_ids`
  (vLLM's own, from `return_token_ids`), `prompt_tokens`, `cached_tokens`
  (usage.prompt_tokens_details.cached_tokens), `completion_token_ids`;
- meta.json: the engine's command line and settings as passed by --meta, the KV cache groups
  seen in the events (group_idx -> kv_cache_spec_kind, kv_cache_spec_sliding_window, block
  size), counts.
"""

import argparse
import json
import os
import random
import threading
import time

import vllm_events as ve
from vllm_chat import WORDS, http

QUIET_S = 0.4  # no live message for this long after an answer: the request's batches are in
MAX_TOKENS = 4


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Conv:
    def __init__(self, cid, system_idx, system, rng):
        self.id, self.system_idx, self.system, self.rng = cid, system_idx, system, rng
        self.turns = []
        self.next_user = self.user()

    def user(self):
        return f"Question {self.id}.{len(self.turns)}: {words(self.rng, self.rng.randrange(15, 45))}?"

    def messages(self):
        out = [{"role": "system", "content": self.system}]
        for u, a in self.turns:
            out += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        return out + [{"role": "user", "content": self.next_user}]

    def advance(self, answer):
        self.turns.append((self.next_user, answer))
        self.next_user = self.user()


class Recorder:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.tap = ve.Tap(args.events, args.topic)
        self.requests = []

    def quiet(self, timeout=10.0):
        """Waits until no live message arrived for QUIET_S (at most timeout s)."""
        deadline = time.monotonic() + timeout
        count, since = self.tap.count(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.tap.count()
            if now != count:
                count, since = now, time.monotonic()
            elif time.monotonic() - since >= QUIET_S:
                return
        print("warning: the engine kept publishing; going on")

    def post(self, conv, tokens=None):
        """One request: chat messages, or a token-id prompt to /v1/completions.
        Returns (prompt token ids, usage, completion token ids)."""
        body = {"model": "model", "max_tokens": MAX_TOKENS, "temperature": 0,
                "return_token_ids": True}
        if tokens is None:
            body["messages"] = conv.messages()
            status, _, resp = http("POST", self.args.engine + "/v1/chat/completions", body)
        else:
            body["prompt"] = tokens
            status, _, resp = http("POST", self.args.engine + "/v1/completions", body)
        assert status == 200, f"request failed: {status} {str(resp)[:300]}"
        choice = resp["choices"][0]
        prompt = resp.get("prompt_token_ids") or choice.get("prompt_token_ids") or tokens
        return prompt, resp["usage"], choice.get("token_ids")

    def row(self, conv, tag, seq_before, seqs, prompt, usage, completion):
        row = dict(n=len(self.requests), conv=conv.id, turn=len(conv.turns),
                   system=conv.system_idx, tag=tag,
                   seq_before=-1 if seq_before is None else seq_before,
                   seqs=[min(seqs), max(seqs)] if seqs else [],
                   prompt_token_ids=prompt,
                   prompt_tokens=usage["prompt_tokens"],
                   cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                   completion_token_ids=completion)
        assert len(row["prompt_token_ids"]) == row["prompt_tokens"]
        self.requests.append(row)
        print(f"req {row['n']:3} conv {conv.id:2} turn {row['turn']} sys {conv.system_idx} "
              f"prompt {row['prompt_tokens']:4} cached {row['cached_tokens']:4} "
              f"seqs {row['seqs']} {tag}", flush=True)
        return row

    def send(self, conv, tag="", tokens=None, advance=True):
        """Sends one request alone, once the engine is quiet, and records it."""
        self.quiet()
        start = self.tap.count()
        seq_before = self.tap.last_seq()
        prompt, usage, completion = self.post(conv, tokens)
        self.quiet()
        seqs = [m[1] for m in self.tap.since(start)]
        row = self.row(conv, tag, seq_before, seqs, prompt, usage, completion)
        if advance:
            conv.advance(f"Answer {conv.id}.{len(conv.turns)}.")
        return row

    def send_together(self, convs, tag):
        """Sends requests at the same time (their batches interleave); `seqs` of each is the
        whole burst's."""
        self.quiet()
        start = self.tap.count()
        seq_before = self.tap.last_seq()
        out = [None] * len(convs)

        def one(i):
            out[i] = self.post(convs[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(convs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.quiet()
        seqs = [m[1] for m in self.tap.since(start)]
        for conv, result in zip(convs, out):
            self.row(conv, tag, seq_before, seqs, *result)
            conv.advance(f"Answer {conv.id}.{len(conv.turns)}.")

    def run(self):
        rng = self.rng
        # Shared system prompts of about 5..10 blocks of 32 tokens.
        systems = [f"System {i}. " + words(rng, rng.randrange(60, 150)) + "."
                   for i in range(4)]
        convs = []
        for cid in range(self.args.conversations):
            s = cid % len(systems) if cid < len(systems) else rng.randrange(len(systems))
            convs.append(Conv(cid, s, systems[s], random.Random(rng.random())))
        # Open conversations two at a time; each active one gets a turn in random order, so
        # continuations, siblings on the same system prompt and cold prompts interleave.
        active, pending = [], list(convs)
        while active or pending:
            while len(active) < 3 and pending:
                active.append((pending.pop(0), rng.randrange(2, 5)))
            i = rng.randrange(len(active))
            conv, turns = active[i]
            self.send(conv)
            if len(conv.turns) >= turns:
                active.pop(i)
        # The same chat twice in a row (the n-1 cap).
        again = convs[0]
        again.turns = again.turns[:1]
        again.next_user = "Question again: " + words(random.Random(5), 30) + "?"
        self.send(again, "resend first", advance=False)
        self.send(again, "resend second", advance=False)
        # A block-aligned token-id prompt twice (vLLM recomputes the last block into a second
        # copy of the same hash in every group that stored it), then once more extended.
        aligned = self.requests[-1]["prompt_token_ids"]
        aligned = aligned[:len(aligned) // 32 * 32]
        self.send(again, "aligned first", tokens=aligned, advance=False)
        self.send(again, "aligned second", tokens=aligned, advance=False)
        self.send(again, "aligned extended", tokens=aligned + aligned[-20:], advance=False)
        # A sliding-window hit shorter than the window, from block 0: a new 300-token prompt
        # (its sliding group keeps only its tail), its first 50 tokens (block 0 is stored as
        # the replay tail), then its first 200 tokens: the full group holds 6 blocks, the
        # sliding group only block 0 (with retention 0), so vLLM reuses 32 tokens.
        x = [self.rng.randrange(3, 2000) for _ in range(300)]
        solo = Conv(200, 20, "", random.Random(1))
        self.send(solo, "fallback long", tokens=x, advance=False)
        self.send(solo, "fallback short", tokens=x[:50], advance=False)
        self.send(solo, "fallback middle", tokens=x[:200], advance=False)
        # Two cold conversations at once on new system prompts: the batch order of two
        # requests' stores and removals.
        cold = [Conv(100 + k, 10 + k, f"System {10 + k}. " + words(rng, 80) + ".",
                     random.Random(rng.random())) for k in range(2)]
        self.send_together(cold, "concurrent")
        self.send_together(cold, "concurrent")


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def groups_seen(live):
    out = {}
    for _, _, _, events in live:
        for e in events:
            if e["type"] != "BlockStored":
                continue
            g = out.setdefault(str(e.get("group_idx")), {
                "kv_cache_spec_kind": e.get("kv_cache_spec_kind"),
                "kv_cache_spec_sliding_window": e.get("kv_cache_spec_sliding_window"),
                "block_size": e.get("block_size"), "stores": 0, "hashes": 0})
            g["stores"] += 1
            g["hashes"] += len(e["block_hashes"])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--topic", default="kv")
    p.add_argument("--conversations", type=int, default=14)
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--meta", default="{}", help="JSON merged into meta.json")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args)
    time.sleep(1.0)  # PUB/SUB: let the subscription reach the engine before its first batch
    rec.run()
    rec.quiet()
    live = rec.tap.since(0)
    rec.tap.close()
    assert live and live[0][1] == 0, "the live recording does not start at seq 0"
    seqs = [m[1] for m in live]
    assert seqs == list(range(len(seqs))), "the live recording has gaps"
    write_jsonl(os.path.join(args.out, "live.jsonl"),
                [{"topic_hex": t.hex(), "seq_hex": s.to_bytes(8, "big").hex(),
                  "payload_hex": pl.hex()} for t, s, pl, _ in live])
    write_jsonl(os.path.join(args.out, "requests.jsonl"), rec.requests)
    meta = json.loads(args.meta)
    meta.update(topic=args.topic, live_messages=len(live), requests=len(rec.requests),
                seed=args.seed, conversations=args.conversations, max_tokens=MAX_TOKENS,
                groups=groups_seen(live))
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"recorded {len(live)} live messages and {len(rec.requests)} requests into {args.out}")


if __name__ == "__main__":
    main()
