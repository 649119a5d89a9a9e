"""kvdir against one real vLLM launched with --data-parallel-size 2 (scripts/vllm-e2e.sh --dp).

vLLM's default DP launch: two engine cores (ranks 0 and 1, events on port and port + 1), two
API servers, Prometheus in multiprocess mode (no process_start_time_seconds), and its own
round-robin balancer unless a request names its rank in X-data-parallel-rank.

The run, with one workload played twice on the same engine (the same conversations, in the same
order, the prefix cache reset in between):
1. kvdir has the engine's process identity from its events and both rank streams live.
2. Round robin: every request straight to vLLM, which picks the rank. Before each, kvdir's index
   is asked what the rank that then serves it holds; that must equal vLLM's cached_tokens.
3. The cache is reset (/reset_prefix_cache reaches both ranks); kvdir's credit for every rank
   must fall to 0.
4. kvdir's front door: every request through kvdir, which chooses the rank. Its credit
   (x-kvdir-cached-tokens) must equal vLLM's cached_tokens, and its rank (x-kvdir-dp-rank) the
   rank that served (vLLM's per-engine request counter).
It prints the cached share of both passes and ends with `N passed, M failed`.
"""

import argparse
import random
import sys
import time

import vllm_events as ve
from vllm_chat import BLOCK, MAX_TOKENS, WORDS, Conversation, Results, http

RANKS = 2


class Dp:
    """The engine, its taps (one per rank) and kvdir."""

    def __init__(self, args):
        self.args, self.results = args, Results()
        self.name = args.instance
        self.taps = [ve.Tap(f"tcp://127.0.0.1:{args.events_port + r}", "kv")
                     for r in range(RANKS)]
        self.settles = []

    # --- the engine's side -------------------------------------------------------------------

    def served_counts(self):
        """Finished requests by rank, from vLLM's `vllm:request_success_total{engine="r"}`."""
        _, _, text = http("GET", self.args.engine + "/metrics", timeout=10)
        counts = [0.0] * RANKS
        for line in str(text).splitlines():
            if line.startswith("vllm:request_success_total{"):
                labels, value = line.rsplit(" ", 1)
                for r in range(RANKS):
                    if f'engine="{r}"' in labels:
                        counts[r] += float(value)
        return counts

    def serving_rank(self, before, deadline_s=5.0):
        """The one rank whose counter moved since `before` (polled: the API servers write
        their metrics as the response ends); None when it is not exactly one."""
        end = time.monotonic() + deadline_s
        while True:
            moved = [r for r, (b, a) in enumerate(zip(before, self.served_counts())) if a > b]
            if len(moved) == 1 or time.monotonic() > end:
                return moved[0] if len(moved) == 1 else None
            time.sleep(0.02)

    def tokenize(self, messages):
        body = {"model": "model", "messages": messages, "add_generation_prompt": True}
        return http("POST", self.args.engine + "/tokenize", body)[2]["tokens"]

    # --- kvdir's side ------------------------------------------------------------------------

    def kvdir_ranks(self, tokens):
        """kvdir's query answer for `tokens`, by rank of this engine."""
        try:
            status, _, resp = http("POST", self.args.kvdir + "/v1/internal/kv-cache/query",
                                   {"token_ids": tokens}, timeout=5)
        except OSError:
            return {}
        if status != 200:
            return {}
        return {m["dp_rank"]: m for m in resp.get("matches", [])
                if m["instance_name"] == self.name}

    def settle(self, deadline_s=3.0):
        """Polls until kvdir has applied every batch the ranks have published so far."""
        started = time.monotonic()
        while time.monotonic() < started + deadline_s:
            seqs = {r: m.get("sequence") for r, m in self.kvdir_ranks([]).items()}
            behind = [r for r, tap in enumerate(self.taps)
                      if tap.last_seq() is not None
                      and (seqs.get(r) is None or seqs[r] < tap.last_seq())]
            if not behind:
                break
            time.sleep(0.005)
        self.settles.append(time.monotonic() - started)

    def wait_ready(self, deadline_s=120.0):
        """Both rank streams live and the engine's identity known (from its events: this
        launch publishes no process_start_time_seconds)."""
        end = time.monotonic() + deadline_s
        phases, engine = {}, {}
        while time.monotonic() < end:
            try:
                _, _, streams = http("GET", self.args.kvdir + "/v1/internal/streams", timeout=2)
                _, _, inst = http("GET", self.args.kvdir + "/v1/internal/instances", timeout=2)
            except OSError:
                time.sleep(0.2)
                continue
            phases = {s["dp_rank"]: s["phase"] for s in streams.get("streams", [])
                      if s["instance_name"] == self.name}
            engine = next((i.get("engine", {}) for i in inst.get("instances", [])
                           if i["name"] == self.name), {})
            if engine.get("identity_known") and [phases.get(r) for r in range(RANKS)] \
                    == ["live"] * RANKS:
                break
            time.sleep(0.2)
        self.results.check(engine.get("identity_known") is True,
                           "the default DP launch has an identity",
                           f"identity_known {engine.get('identity_known')}")
        self.results.check([phases.get(r) for r in range(RANKS)] == ["live"] * RANKS,
                           "both rank streams live", f"phases {phases}")

    # --- the two passes ----------------------------------------------------------------------

    def workload(self):
        """The same conversations in the same order, for either pass: a few shared system
        prompts, several users each, turns interleaved as concurrent users' would be."""
        rng = random.Random(self.args.seed)
        systems = [f"System {k}: " + " ".join(rng.choice(WORDS) for _ in range(150))
                   for k in range(self.args.systems)]
        Conversation.counter = 0
        convs = [Conversation(systems[k % len(systems)], random.Random(k), max_turns=4)
                 for k in range(self.args.requests // 4)]
        order = [c for c in convs for _ in range(c.max_turns)]
        rng.shuffle(order)
        return order

    def chat_body(self, conv):
        return {"model": "model", "messages": conv.messages(), "max_tokens": MAX_TOKENS,
                "temperature": 0}

    def play(self, label, url, before_send, judge):
        """Sends the workload to `url` one request at a time, each once kvdir has applied
        every batch published before it; `before_send(conv)` gives what `judge(that, headers,
        serving rank, cached_tokens)` compares, and judge returns (ok, line). Returns the cached
        and the prompt tokens."""
        cached = prompt = 0
        for n, conv in enumerate(self.workload()):
            self.settle()
            context = before_send(conv)
            before = self.served_counts()
            status, hdrs, resp = http("POST", url + "/v1/chat/completions", self.chat_body(conv))
            if status != 200:
                self.results.add(False, f"{label} {n}: answered {status}: {str(resp)[:200]}")
                continue
            usage = resp["usage"]
            actual = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            ok, line = judge(context, hdrs, self.serving_rank(before), actual)
            self.results.add(ok, f"{label} {n}: {line}")
            cached, prompt = cached + actual, prompt + usage["prompt_tokens"]
            conv.advance()
        return cached, prompt

    def round_robin(self):
        """Every request straight to vLLM; kvdir's index checked against the serving rank."""
        def held(conv):
            tokens = self.tokenize(conv.messages())
            # A hit is at most the whole blocks within the prompt's first n - 1 tokens.
            return self.kvdir_ranks(tokens), (len(tokens) - 1) // BLOCK * BLOCK

        def judge(context, _hdrs, rank, actual):
            (ranks, cap) = context
            index = min(ranks.get(rank, {}).get("device_hit_tokens", -1), cap)
            return (rank is not None and index == actual,
                    f"rank {rank} cached {actual}, kvdir's index held {index} on that rank")
        return self.play("rr", self.args.engine, held, judge)

    def reset(self):
        """/reset_prefix_cache on every rank; each publishes its clear with its next step, so
        one tiny request per rank. kvdir's credit must fall to 0 on both ranks."""
        probe = self.tokenize(Conversation("System 0: reset probe", random.Random(0)).messages())
        status = http("POST", self.args.engine + "/reset_prefix_cache")[0]
        self.results.check(status == 200, "vLLM's /reset_prefix_cache", f"status {status}")
        for r in range(RANKS):
            http("POST", self.args.engine + "/v1/completions",
                 {"model": "model", "prompt": "Reset.", "max_tokens": 1},
                 headers={"X-data-parallel-rank": str(r)})
        self.settle(deadline_s=10.0)
        end, held = time.monotonic() + 10, {}
        while time.monotonic() < end:
            held = {r: m.get("device_hit_tokens") for r, m in self.kvdir_ranks(probe).items()}
            if held and all(v == 0 for v in held.values()):
                break
            time.sleep(0.05)
        self.results.check(bool(held) and all(v == 0 for v in held.values()),
                           "kvdir credits nothing after the reset", f"hits {held}")

    def through_kvdir(self):
        """Every request through kvdir's front door, which chooses the rank."""
        def judge(_context, hdrs, served, actual):
            chosen, credit = hdrs.get("x-kvdir-dp-rank"), hdrs.get("x-kvdir-cached-tokens")
            return (chosen == str(served) and credit == str(actual),
                    f"chose rank {chosen}, served by {served}; credit {credit}, cached {actual}")
        return self.play("kvdir", self.args.kvdir, lambda _conv: None, judge)

    def run(self):
        self.wait_ready()
        rr = self.round_robin()
        self.reset()
        routed = self.through_kvdir()
        share = [c / p if p else 0.0 for c, p in (rr, routed)]
        print(f"cached share: vLLM round robin {share[0]:.1%} ({rr[0]} of {rr[1]} prompt "
              f"tokens), kvdir rank routing {share[1]:.1%} ({routed[0]} of {routed[1]})")
        self.results.check(routed[0] > rr[0], "rank routing reuses more than round robin",
                           f"{routed[0]} against {rr[0]} cached tokens")
        self.settles.sort()
        if self.settles:
            print(f"settle: p50 {self.settles[len(self.settles) // 2] * 1e3:.1f} ms, max "
                  f"{self.settles[-1] * 1e3:.1f} ms")
        for tap in self.taps:
            tap.close()
        print(f"{self.results.passed} passed, {self.results.failed} failed", flush=True)
        return self.results.failed == 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvdir", required=True, help="kvdir's base URL")
    p.add_argument("--engine", required=True, help="vLLM's base URL")
    p.add_argument("--instance", required=True, help="the engine's name in kvdir")
    p.add_argument("--events-port", type=int, required=True, help="rank 0's event port")
    p.add_argument("--requests", type=int, default=160, help="requests in each pass")
    p.add_argument("--systems", type=int, default=4, help="shared system prompts")
    p.add_argument("--seed", type=int, default=7)
    sys.exit(0 if Dp(p.parse_args()).run() else 1)


if __name__ == "__main__":
    main()
