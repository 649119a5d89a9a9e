"""Chat traffic through kvdir's front door, compared request by request with real vLLM.

Run by scripts/vllm-e2e.sh (see there); runs in the vllm venv. For each request it compares
kvdir's predicted cached tokens on the engine it chose (`x-kvdir-cached-tokens`, else
`x-kvdir-kv-hit-ratio` times the prompt's tokens, rounded to the block) with vLLM's own
`usage.prompt_tokens_details.cached_tokens`, and prints one line. Rules:
- over-credit (predicted > vLLM) always fails, whatever the events show;
- a stream that is not synchronized gives no credit;
- on an exact stream the numbers agree, except an under-credit that the engine's own events
  explain. Each is replayed, in seq order, through vLLM 0.32's hit rule (per-group residency
  with copies counted, scripts/vllm_hybrid_model.py; the prompt's block hashes are vLLM's own,
  salt included) for dense, Gemma3 and windows-only models alike:
  - race: kvdir's credit is the rule over the batches up to a seq K that kvdir could have held
    when it routed (its stream sequence just before the send .. just after the answer) and
    vLLM's reuse is the rule over the batches up to a later seq S (vLLM publishes from a
    background thread, sometimes well after the answer: the tap gets EXPLAIN_WAIT_S);
  - unlocated (a windows-only model at default retention): at K the rule gives vLLM's reuse,
    but only from window stores that no store locates, which kvdir does not credit
    (docs/protocol.md 2.3);
  - dense only: a duplicate-store removal (kvdir drops the block at its first removal), or
    blocks of the prompt the engine stored while it was in flight (the token-range check);
- on a partial stream an under-credit is allowed (it credits only blocks it saw stored).
Named checks (stream start-up, tokenizer parity, salt, duplicate store, restart) count like
requests. Before the traffic: kvdir's parity check with each engine must agree (tokens,
block size, model; the gauge 0), and a second kvdir with a deliberately wrong chat template
must report the tokens as differing, WARN with the position and set the gauge to 1
(scripts/e2e_parity.py). With --announce (kvdir lists no engine; each announces itself on the
bound port) every engine must be listed with source "announce". At the end,
kvdir's own cache-truth audit (`cache_audit` in /v1/internal/instances: exact, under and over
answers per instance) must count what this script counted, request by request, since kvdir's
last start, and kvdir must have read each engine's prefill rate from its /metrics. It prints the
credit tally (exact, under by explanation, over) and ends with `N passed, M failed`; the exit
code is 0 only when M is 0.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import e2e_parity
import vllm_events as ve
from vllm_chat import (BLOCK, CREDITED, SYNCED, WORDS, Conversation, Engine, Kvdir, Results,
                       explain, http, in_flight, judge, predicted_tokens, stream_state)

# How long after an answer the engine's events may still explain a difference (s): vLLM
# publishes from a background thread, on 2 busy cores sometimes more than 0.5 s late.
EXPLAIN_WAIT_S = 3.0


class Driver:
    """The workload and its checks."""

    def __init__(self, args):
        self.args = args
        self.rng = random.Random(22)
        self.results = Results()
        self.engines = [Engine(spec, args.topic, args.bind) for spec in args.engine]
        self.kvdir = Kvdir(args.kvdir, self.engines)
        self.sent = 0
        # {engine: {"exact", "under", "over"}} of the answers through kvdir since its start.
        self.tally = {}
        self.settles = []  # seconds spent waiting for kvdir to apply what the engines published
        self.credit = {}  # outcome of every answered request's credit -> count
        self.systems = [self.text(self.rng.randrange(200, 420), f"System {i}.") for i in range(6)]
        self.pool = [self.new_conversation() for _ in range(6)]

    def text(self, words, head):
        return head + " " + " ".join(self.rng.choice(WORDS) for _ in range(words)) + "."

    def new_conversation(self, salt=None):
        return Conversation(self.rng.choice(self.systems), self.rng, salt,
                            self.rng.randrange(2, 6))

    def ask(self, conv, tag="", explained="", advance=True):
        """Sends the conversation's next turn, judges and prints it; returns (engine,
        predicted, vLLM's cached tokens), predicted None when kvdir did not answer."""
        messages = conv.messages()
        before = self.settle() if self.kvdir.up else {}
        reports = self.kvdir.streams() if self.kvdir.up else {}
        sent_at = {e.name: e.tap.count() for e in self.engines}
        sent = time.monotonic()
        engine, hdrs, body = self.kvdir.chat(messages, conv.salt)
        answered = time.monotonic()
        after = ({n: m.get("sequence") for n, m in self.kvdir.query([]).items()}
                 if self.kvdir.up else {})
        with self.results.lock:
            self.sent += 1
            number = self.sent
        label = f"req {number:3} conv {conv.id:3} turn {len(conv.turns)}"
        label += f" salt {conv.salt}" if conv.salt else ""
        label += f" [{tag}]" if tag else ""
        if not isinstance(body, dict) or "usage" not in body:
            self.results.add(False, f"{label}: no answer: {str(body)[:300]}")
            return None, None, 0
        usage = body["usage"]
        actual = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        predicted = None
        if engine is None or not hdrs:
            why = self.kvdir.why_down or (f"x-kvdir-instance {hdrs.get('x-kvdir-instance')!r} "
                                          "names no listed engine")
            self.results.add(False, f"{label}: vllm cached {actual} of "
                                    f"{usage['prompt_tokens']}; kvdir unavailable: {why}")
        else:
            state = stream_state(hdrs, reports.get(engine.name))
            predicted = predicted_tokens(hdrs, usage["prompt_tokens"])
            kind = note = ""
            if predicted != actual and state == "exact" and not explained:
                # vLLM publishes a step's events from a background thread, sometimes well after
                # the HTTP answer: the tap gets EXPLAIN_WAIT_S to show them.
                window = (before.get(engine.name), after.get(engine.name))
                kind, explained = self.rule_explanation(engine, messages, conv.salt, predicted,
                                                        actual, window, (sent, answered))
                if not kind and predicted < actual and self.args.model_kind == "dense" \
                        and not conv.salt:
                    # The rule did not explain it: the blocks the engine stored while it was in
                    # flight, by token ranges (the dense check of old).
                    low, high = predicted, actual
                    found = self.in_flight(engine, sent_at[engine.name], messages, low, high)
                    if "published" in found:
                        kind, explained = "in flight", found + "; " + explained
                    else:
                        note, explained = explained, ""
                elif not kind and predicted < actual:
                    note, explained = explained, ""
            elif predicted != actual and explained:
                kind = "duplicate store"
            if predicted is not None and "x-kvdir-cached-tokens" in hdrs:
                credited = int(hdrs["x-kvdir-cached-tokens"])
                outcome = ("exact" if credited == actual else
                           "under" if credited < actual else "over")
                with self.results.lock:
                    counts = self.tally.setdefault(engine.name, {})
                    counts[outcome] = counts.get(outcome, 0) + 1
            ok, verdict = judge(predicted, actual, state, explained)
            if not ok and predicted is not None and not conv.salt:
                verdict += "; " + self.diagnose(engine, sent_at[engine.name], messages,
                                                min(predicted, actual), max(predicted, actual))
            if not ok and note:
                verdict += "; " + note
            outcome = ("exact" if predicted == actual else "over" if predicted > actual else
                       f"under: {kind}" if ok and state == "exact" else
                       f"under: {state}" if ok else "under: unexplained")
            with self.results.lock:
                self.credit[outcome] = self.credit.get(outcome, 0) + 1
            self.results.add(ok, f"{label} -> {engine.name} [{state}] predicted {predicted} "
                                 f"vllm {actual} of {usage['prompt_tokens']}: {verdict}",
                             explained=verdict.startswith("explained"))
        if engine is not None:
            others = [c for c in engine.cached_prompts if c is not conv]
            engine.cached_prompts = (others + [conv])[-4:]
        if advance:
            conv.advance()
        return engine, predicted, actual

    def diagnose(self, engine, start, messages, low, high):
        """For a failed request: the engine's events about the prompt's blocks in (low, high]
        (seq and kind, `*` for those published while it was in flight) and what kvdir answers
        for the prompt now, with its stream's sequence."""
        history = engine.tap.since(0)
        prompt = engine.tokenize(messages)
        chains = ve.prefixes(history)
        notes = []
        for i, (_, seq, _, events) in enumerate(history):
            for e in events:
                hashes = e.get("block_hashes") or []
                for h in hashes:
                    chain = chains.get(h)
                    if chain and low < len(chain) <= high and prompt[:len(chain)] == chain:
                        mark = "*" if i >= start else ""
                        notes.append(f"{mark}{seq}:{e['type'][5:]}@{len(chain)}")
        now = self.kvdir.query(prompt).get(engine.name, {})
        return (f"engine events on (low, high]: {' '.join(notes[-12:]) or 'none'}; tap at "
                f"{history[-1][1] if history else None}; kvdir now {now.get('device_hit_tokens')}"
                f" at seq {now.get('sequence')}")

    def rule_explanation(self, engine, messages, salt, credit, actual, window, times):
        """(kind, text) of vLLM's rule over the engine's own events (vllm_chat.explain), polled
        for up to EXPLAIN_WAIT_S while the engine's late batches come in; over-credits get the
        rule's figures as evidence but are never excused."""
        tokens = engine.tokenize(messages)
        deadline = time.monotonic() + EXPLAIN_WAIT_S
        while True:
            messages_, arrived = engine.tap.record()
            kind, text = explain(messages_, arrived, tokens, salt, credit, actual, window, times)
            if credit > actual:
                return "", "evidence: " + text
            if kind or time.monotonic() > deadline:
                return kind, text
            time.sleep(0.1)

    def in_flight(self, engine, start, messages, low, high):
        """What the engine published about the prompt's blocks in (low, high] while the
        request was in flight (see vllm_chat.in_flight)."""
        history = engine.tap.since(0)
        prompt = engine.tokenize(messages)
        return in_flight(history, history[start:], prompt, low, high)

    def regular(self):
        """One turn of a random pooled conversation; finished ones are replaced."""
        i = self.rng.randrange(len(self.pool))
        conv = self.pool[i]
        self.ask(conv)
        if conv.done():
            self.pool[i] = self.new_conversation()

    # --- start-up ------------------------------------------------------------------------

    def wait_streams(self, started, deadline_s=10.0):
        """Times how long after kvdir's start each listed stream reaches live or partial;
        returns {name: (seconds, phase)} of those that did."""
        reached, reports = {}, {}
        while time.time() < started + deadline_s and len(reached) < len(self.engines):
            if self.args.kvdir_pid and not pid_alive(self.args.kvdir_pid):
                break
            reports = self.kvdir.streams()
            for e in self.engines:
                phase = reports.get(e.name, {}).get("phase")
                if phase in SYNCED and e.name not in reached:
                    reached[e.name] = (time.time() - started, phase)
            time.sleep(0.05)
        if not reports and not reached:
            self.kvdir.up = False
            self.kvdir.why_down = "kvdir did not answer /v1/internal/streams"
            log_tail(self.args.kvdir_log)
        for e in self.engines:
            if e.name in reached:
                secs, phase = reached[e.name]
                state = "exact" if phase == "live" else "partial"
                self.results.check(True, f"stream {e.name} synchronized",
                                   f"{phase} ({state}) {secs:.2f} s after kvdir started")
            else:
                r = reports.get(e.name, {})
                self.results.check(False, f"stream {e.name} synchronized",
                                   f"not live or partial within {deadline_s:.0f} s: phase "
                                   f"{r.get('phase')}, last fault {r.get('last_fault')}")
        return reached

    # --- burst and salt --------------------------------------------------------------------

    def burst(self, n=8):
        """n new conversations at once, on system prompts just warmed by one request each."""
        convs = [self.new_conversation() for _ in range(n)]
        for system in sorted({c.system for c in convs}):
            self.ask(Conversation(system, self.rng, max_turns=1), tag="warm")
        threads = [threading.Thread(target=self.ask, args=(c, "burst")) for c in convs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.pool[:len(convs)] = convs[:len(self.pool)]

    def salted(self, turns=3):
        """Two salts on the same messages: each salt's first turn is uncached (the other salt's
        blocks are not its own), and before each later turn kvdir's query with the salt
        credits the previous turn's blocks on the engine that served it, whichever engine CAR
        then picks."""
        credited = isolated = 0
        for salt in ("tenant-a", "tenant-b"):
            conv = Conversation(self.systems[0], random.Random(7), salt=salt, max_turns=turns)
            served = None
            for turn in range(turns):
                if served is not None:
                    credited += self.salted_credit(served, conv.messages(), salt)
                served, predicted, actual = self.ask(conv, tag="salted")
                isolated += turn == 0 and predicted == 0 and actual == 0
        detail = (f"{credited} of {2 * (turns - 1)} later salted turns credited by kvdir's "
                  "query with their salt")
        if self.args.model_kind == "sliding" and not self.args.retention:
            # Its window stores list only the blocks the window keeps, so no store locates a
            # long prompt's blocks and kvdir credits none of them, salted or not
            # (docs/protocol.md 2.3); the per-request check still compares every salted turn.
            print(f"     salted: {detail}; not checked: a windows-only model at default "
                  "retention gets no credit for window stores no store locates", flush=True)
        else:
            self.results.check(credited == 2 * (turns - 1), "salted turns credited", detail)
        self.results.check(isolated == 2, "salts kept apart",
                           f"{isolated} of 2 first turns uncached on both sides")

    # --- the duplicate-store sequence ------------------------------------------------------

    def block_aligned_conversation(self):
        """A new conversation whose first prompt is a whole number of blocks long."""
        conv = Conversation(self.text(300, f"Duplicate {self.sent}."), self.rng, max_turns=3)
        conv.next_user = conv.user_text(20)
        while len(self.engines[0].tokenize(conv.messages())) % BLOCK:
            conv.next_user = conv.next_user[:-1] + " " + self.rng.choice(WORDS) + "?"
        return conv

    def duplicate_store(self):
        """Sends a block-aligned prompt twice (vLLM stores its last block again), evicts the
        older copy only, then sends the next turn, whose blocks chain to that block."""
        if self.args.model_kind == "sliding":
            # A windows-only model's stores list only the blocks its window keeps, so the
            # block stored twice cannot be found by its tokens; kvdir counts copies per group
            # there, and every request's credit is still checked by vLLM's rule.
            print("     dup: skipped for a windows-only model (its window stores do not cover "
                  "their token blocks, so the duplicate cannot be found by its tokens)",
                  flush=True)
            return
        conv = self.block_aligned_conversation()
        tokens = self.engines[0].tokenize(conv.messages())
        before = self.kvdir.streams()
        first = self.ask(conv, tag="dup: first", advance=False)[0]
        second = self.ask(conv, tag="dup: again", advance=False)[0]
        engine = second or first or self.engines[0]
        last = tokens[-BLOCK:]
        stores = engine.tap.wait(
            lambda m: [b for b in ve.stored_blocks(m) if b[1] == last][1:], 10)
        self.results.check(bool(stores) and first is second, "vLLM stored the last block twice",
                           f"on {engine.name}, {len(tokens)} tokens")
        if not stores:
            return
        dup = stores[0][0]
        removed = self.evict_older_copy(engine, dup)
        # A dense stream drops a block at its first removal; a hybrid stream counts copies per
        # group, so there the child is judged by vLLM's rule like any request.
        why = (f"block {dup:#x} removed once, its other copy still cached"
               if removed == 1 and self.args.model_kind == "dense" else "")
        conv.advance()
        self.ask(conv, tag="dup: child", explained=why)
        self.check_not_invalidated(before, engine)

    def evict_older_copy(self, engine, dup):
        """One-block prompts straight to the engine (not counted) until the first copy of
        `dup` is evicted; returns how many removals of `dup` vLLM published."""
        fillers = 0
        while ve.removed_hashes(engine.tap.since(0)).count(dup) == 0 and fillers < 300:
            prompt = [self.rng.randrange(3, 2000) for _ in range(BLOCK)]
            start = engine.tap.count()
            http("POST", engine.url + "/v1/completions",
                 {"model": "model", "prompt": prompt, "max_tokens": 1, "temperature": 0})
            engine.tap.wait(lambda m: any(b[1] == prompt for b in ve.stored_blocks(m)), 5, start)
            fillers += 1
        removed = ve.removed_hashes(engine.tap.since(0)).count(dup)
        print(f"     dup: {fillers} one-block prompts sent to {engine.name} directly; "
              f"vLLM removed block {dup:#x} {removed} time(s)", flush=True)
        return removed

    def check_not_invalidated(self, before, engine):
        """No stream lost synchronization or counted a gap across the sequence."""
        deadline = time.time() + 5
        while time.time() < deadline and engine.tap.count() and not self.kvdir_caught_up(engine):
            time.sleep(0.05)
        after = self.kvdir.streams()
        bad = []
        for name, b in before.items():
            a = after.get(name, {})
            for key in ("gaps", "snapshot_failures", "restarts"):
                if a.get(key, 0) != b.get(key, 0):
                    bad.append(f"{name} {key} {b.get(key)} -> {a.get(key)}")
            if a.get("phase") not in CREDITED or a.get("last_fault") != b.get("last_fault"):
                bad.append(f"{name} phase {a.get('phase')}, last fault {a.get('last_fault')}")
        self.results.check(bool(before) and not bad, "no stream invalidated by the duplicate "
                           "stores", "; ".join(bad) or ("" if before else "kvdir unavailable"))

    def salted_credit(self, served, messages, salt):
        """Whether kvdir's query with `salt` credits the served engine with part of `messages`
        within EXPLAIN_WAIT_S (polling): vLLM publishes a step's stores from a background
        thread, sometimes after the next request could be sent."""
        prompt = served.tokenize(messages)
        deadline = time.monotonic() + EXPLAIN_WAIT_S
        while True:
            hits = self.kvdir.query(prompt, salt).get(served.name, {})
            if (hits.get("device_hit_tokens") or 0) > 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def settle(self, deadline_s=2.0):
        """Waits (polling, with a deadline) until kvdir has applied every batch the engines
        have published so far, so that a request is judged against the events published
        before it; records how often kvdir was behind and for how long. Events published after
        the request was sent are the in-flight explanations' business. Returns kvdir's stream
        sequences by engine name at the last poll (a lower bound of what it routes with)."""
        started = time.monotonic()
        seqs = {}
        while time.monotonic() < started + deadline_s:
            seqs = {name: m.get("sequence") for name, m in self.kvdir.query([]).items()}
            behind = [e for e in self.engines
                      if e.tap.last_seq() is not None and seqs.get(e.name) is not None
                      and seqs[e.name] < e.tap.last_seq()]
            if not behind:
                break
            time.sleep(0.002)
        waited = time.monotonic() - started
        with self.results.lock:
            self.settles.append(waited)
        return seqs

    def kvdir_caught_up(self, engine):
        """Whether kvdir has received as many live messages from the engine as the tap (both
        subscribed long before, so kvdir's count is at least the tap's once it caught up).
        Bound, the tap also holds what was published before kvdir listened: kvdir has caught
        up once its stream is at the tap's newest sequence."""
        if self.args.bind:
            seq = self.kvdir.query([]).get(engine.name, {}).get("sequence")
            return seq is not None and seq >= (engine.tap.last_seq() or 0)
        report = self.kvdir.streams().get(engine.name, {})
        return report.get("messages", 0) >= engine.tap.count()

    # --- restart ---------------------------------------------------------------------------

    def restart(self, engine):
        """Kills one vLLM and starts it again with the same flags. While it is gone and
        until kvdir synchronizes its stream again, the engine gets no credit; then exact."""
        victims = list(engine.cached_prompts)
        with open(engine.pidfile) as f:
            os.killpg(int(f.read().strip()), signal.SIGKILL)
        killed = time.time()
        withdrawn, phase = self.wait_phase(engine, lambda p: p not in CREDITED, killed + 10)
        self.results.check(withdrawn, f"{engine.name} credit withdrawn after the kill",
                           f"phase {phase} after {time.time() - killed:.2f} s")
        while engine.healthy():
            time.sleep(0.1)
        subprocess.Popen(["bash", engine.launcher], start_new_session=True)
        while not engine.healthy():
            if time.time() > killed + 300:
                self.results.check(False, f"{engine.name} restarted", "no /health in 300 s")
                return
            time.sleep(0.5)
        healthy = time.time()
        print(f"     restart: {engine.name} healthy again {healthy - killed:.1f} s after "
              f"the kill", flush=True)
        # At once, before kvdir has caught up: its old blocks must not be credited.
        for conv in victims:
            self.ask(conv, tag="after restart", advance=False)
        exact, phase = self.wait_phase(engine, lambda p: p == "live", healthy + 10)
        self.results.check(exact, f"{engine.name} exact again after the restart",
                           f"phase {phase} {time.time() - healthy:.2f} s after its /health")
        for conv in victims:
            self.ask(conv, tag="after resync")

    def restart_kvdir(self):
        """Stops kvdir and starts it again while the engines run. vLLM 0 still buffers its
        whole history, so its stream is exact again; vLLM 1 buffers only its last
        --buffer-steps batches, so once it has published more its stream is partial
        (under-credit allowed) until its next AllBlocksCleared, which /reset_prefix_cache
        brings."""
        pidfile = os.path.join(os.path.dirname(self.args.kvdir_launcher), "kvdir.pid")
        with open(pidfile) as f:
            pid = int(f.read().strip())
        os.kill(pid, signal.SIGTERM)
        while pid_alive(pid):
            time.sleep(0.05)
        started = time.time()
        self.tally = {}  # a new kvdir audits from zero
        self.args.kvdir_pid = subprocess.Popen(["bash", self.args.kvdir_launcher]).pid
        print("     kvdir restarted while the engines run", flush=True)
        if self.args.announce:
            self.wait_kvdir_health()
            self.announce()
        reached = self.wait_streams(started, deadline_s=25.0 if self.args.announce else 10.0)
        for e in self.engines:
            seq = e.tap.last_seq()
            truncated = e is self.engines[-1] and (seq or 0) >= self.args.buffer_steps
            want = "partial" if truncated else "live"
            got = reached.get(e.name, (None, None))[1]
            self.results.check(got == want, f"{e.name} after kvdir's restart is {want}",
                               f"phase {got}; the engine is at seq {seq}")
        engine = self.engines[-1]
        http("POST", engine.url + "/reset_prefix_cache")
        # vLLM publishes the clear with its next step: one request straight to the engine.
        body = {"model": "model", "prompt": "Reset.", "max_tokens": 1}
        http("POST", engine.url + "/v1/completions", body)
        exact, phase = self.wait_phase(engine, lambda p: p == "live", time.time() + 10)
        self.results.check(exact, f"{engine.name} exact again after its cache reset",
                           f"phase {phase}")

    def save_taps(self):
        """Every engine's tapped messages, as evidence beside the logs: one JSON line per
        message, `{"seq", "arrived" (s, monotonic), "events"}` in events-N.jsonl."""
        if not self.args.kvdir_launcher:
            return
        folder = os.path.dirname(self.args.kvdir_launcher)
        for i, e in enumerate(self.engines):
            messages, arrived = e.tap.record()
            with open(os.path.join(folder, f"events-{i}.jsonl"), "w") as f:
                for (_, seq, _, events), at in zip(messages, arrived):
                    f.write(json.dumps({"seq": seq, "arrived": round(at, 4),
                                        "events": events}, default=str) + "\n")

    def check_audit(self, deadline_s=5.0):
        """kvdir's cache audit per engine against this script's own comparison (kvdir records
        an answer when it has relayed its end, so it is polled briefly)."""
        if not self.kvdir.up:
            return
        keys = ("exact", "under", "over")
        deadline = time.time() + deadline_s
        while True:
            status, _, body = http("GET", self.kvdir.url + "/v1/internal/instances")
            listed = (body.get("cache_audit") or {}) if status == 200 else {}
            seen = {e.name: {k: listed.get(e.name, {}).get(k, 0) for k in keys}
                    for e in self.engines}
            want = {e.name: {k: self.tally.get(e.name, {}).get(k, 0) for k in keys}
                    for e in self.engines}
            if seen == want or time.time() > deadline:
                break
            time.sleep(0.1)
        for e in self.engines:
            audit = listed.get(e.name, {})
            detail = (f"kvdir {seen[e.name]}, script {want[e.name]}; not reported "
                      f"{audit.get('not_reported')}, warning {audit.get('warning_kind')}")
            self.results.check(seen[e.name] == want[e.name],
                               f"{e.name} cache audit agrees with vLLM's answers", detail)

    def check_prefill_rate(self, deadline_s=5.0):
        """Each engine's prefill rate, read by kvdir from vLLM's own prefill histograms
        (`engine.prefill_tokens_per_s` in /v1/internal/instances), once traffic has run."""
        if not self.kvdir.up:
            return
        deadline = time.time() + deadline_s
        while True:
            status, _, body = http("GET", self.kvdir.url + "/v1/internal/instances")
            listed = {i["name"]: (i.get("engine") or {}).get("prefill_tokens_per_s")
                      for i in (body.get("instances") or [])} if status == 200 else {}
            rates = {e.name: listed.get(e.name) for e in self.engines}
            if all(r for r in rates.values()) or time.time() > deadline:
                break
            time.sleep(0.1)
        for e in self.engines:
            rate = rates[e.name]
            self.results.check(bool(rate) and rate > 0,
                               f"{e.name} prefill rate read from vLLM's /metrics",
                               f"{rate} tokens/s")

    def wait_kvdir_health(self, deadline_s=60.0):
        """Waits for kvdir's /health (after its restart)."""
        deadline = time.time() + deadline_s
        while time.time() < deadline:
            try:
                if http("GET", self.kvdir.url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)

    def wait_phase(self, engine, want, deadline):
        """Polls the engine's stream until want(phase) or the deadline; returns whether it
        came and the last phase seen (None: kvdir does not report the stream)."""
        while True:
            phase = self.kvdir.streams().get(engine.name, {}).get("phase")
            if phase is not None and want(phase):
                return True, phase
            if time.time() > deadline:
                return False, phase
            time.sleep(0.05)

    # --- tokenizer parity (issue 32) and announced engines --------------------------------

    def parity(self):
        """kvdir's parity check with each engine agrees (tokens, block size, model; the gauge
        0); then a second kvdir with a deliberately wrong chat template must report the tokens
        as differing, WARN with the position and set the gauge to 1 (scripts/e2e_parity.py)."""
        names = [e.name for e in self.engines]
        if self.kvdir.up:
            e2e_parity.check_agree(self.results, self.kvdir.url, names)
        if self.args.wrong_template_launcher:
            e2e_parity.check_wrong_template(
                self.results, self.args.wrong_template_launcher, self.args.wrong_template_url,
                self.args.wrong_template_log, names)

    def announce(self):
        """With --announce kvdir lists no engine: one only learns of an engine from a message
        under its topic, and an idle vLLM publishes nothing. So one request goes straight to
        each engine (not counted), which stores its prompt and publishes; kvdir then lists it
        (source "announce") and replays its history."""
        if not self.args.announce:
            return
        for e in self.engines:
            body = {"model": "model", "prompt": f"Announce {e.name} {time.time()}.",
                    "max_tokens": 1}
            http("POST", e.url + "/v1/completions", body)
        deadline = time.time() + 15
        while True:
            listed = e2e_parity.instances(self.kvdir.url) if self.kvdir.up else {}
            sources = {e.name: ((listed.get(e.name) or {}).get("engine") or {}).get("source")
                       for e in self.engines}
            if all(v == "announce" for v in sources.values()) or time.time() > deadline:
                break
            time.sleep(0.1)
        for e in self.engines:
            self.results.check(sources[e.name] == "announce",
                               f"{e.name} listed by its announcement",
                               f"engine.source {sources[e.name]!r}; kvdir lists "
                               f"{sorted(n for n in listed if n)}")

    # --- the run ---------------------------------------------------------------------------

    def run(self):
        n = self.args.requests
        self.announce()
        self.wait_streams(self.args.kvdir_started, deadline_s=25.0 if self.args.announce
                          else 10.0)
        self.parity()
        steps = {n // 4: self.burst, n * 3 // 8: self.salted, n // 2: self.duplicate_store,
                 n * 5 // 8: lambda: self.restart(self.engines[-1]),
                 n * 7 // 8: self.restart_kvdir}
        if self.args.bind:
            # A killed engine's PUB shares kvdir's bound socket with the others: kvdir sees no
            # disconnect of its own for that stream, so the restart check does not apply.
            print("     bound engines: the engine restart step is skipped", flush=True)
            del steps[n * 5 // 8]
        done = set()
        while self.sent < n:
            due = [k for k in steps if k <= self.sent and k not in done]
            if due:
                done.add(due[0])
                steps[due[0]]()
            else:
                self.regular()
        for e in self.engines:
            e.tap.close()
        self.save_taps()
        self.check_audit()
        self.check_prefill_rate()
        if self.results.explained:
            print(f"explained under-credits ({len(self.results.explained)}):")
            for line in self.results.explained:
                print("  " + line)
        waits = sorted(self.settles)
        if waits:
            slow = sum(w > 0.01 for w in waits)
            print(f"kvdir behind the engines' published events before {slow} of {len(waits)} "
                  f"requests (waited > 10 ms); wait p50 {waits[len(waits) // 2] * 1000:.1f} ms, "
                  f"max {waits[-1] * 1000:.1f} ms")
        answered = sum(self.credit.values())
        exact = self.credit.get("exact", 0)
        unders = {k[7:]: v for k, v in sorted(self.credit.items()) if k.startswith("under")}
        print(f"credit per request ({self.args.model_kind}, retention "
              f"{self.args.retention if self.args.retention is not None else 'default'}): "
              f"{answered} answered through kvdir, {exact} exact "
              f"({100 * exact / max(answered, 1):.1f}%), "
              f"{sum(unders.values())} under ({', '.join(f'{k} {v}' for k, v in unders.items()) or 'none'}), "
              f"{self.credit.get('over', 0)} over-credits")
        print(f"{self.results.passed} passed, {self.results.failed} failed", flush=True)
        return 0 if self.results.failed == 0 else 1


def pid_alive(pid):
    try:
        os.kill(int(pid), 0)
        return True
    except OSError:
        return False


def log_tail(path, lines=5):
    try:
        with open(path) as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return
    print(f"     kvdir is not answering; the end of {path}:")
    for line in tail:
        print("       " + line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvdir", required=True, help="kvdir's base URL")
    p.add_argument("--kvdir-started", type=float, required=True, help="its start, Unix time")
    p.add_argument("--kvdir-pid", help="its process id, to notice an early exit")
    p.add_argument("--kvdir-log", default="", help="its log, shown when it does not answer")
    p.add_argument("--engine", action="append", required=True,
                   help="NAME,URL,EVENTS,LAUNCHER of one vLLM (repeat)")
    p.add_argument("--kvdir-launcher", help="a script that starts kvdir again (writing "
                   "kvdir.pid beside itself)")
    p.add_argument("--buffer-steps", type=int, default=16,
                   help="how many batches the last engine keeps for replay")
    p.add_argument("--topic", default="kv")
    p.add_argument("--bind", action="store_true",
                   help="the engines connect to kvdir's kv_events_bind; EVENTS is then each "
                   "engine's replay endpoint (read by the tap)")
    p.add_argument("--announce", action="store_true",
                   help="with --bind: kvdir lists no engine; each announces itself by its topic")
    p.add_argument("--wrong-template-launcher", default="",
                   help="a script that execs a second kvdir with a wrong --chat_template "
                   "(the parity step; none: the step is skipped)")
    p.add_argument("--wrong-template-url", default="", help="that kvdir's base URL")
    p.add_argument("--wrong-template-log", default="", help="that kvdir's log")
    p.add_argument("--requests", type=int, default=320)
    p.add_argument("--model-kind", choices=("dense", "gemma3", "sliding"), default="dense",
                   help="the engines' model (scripts/vllm_make_model.py --kind)")
    p.add_argument("--retention", type=int, default=None,
                   help="the engines' --prefix-cache-retention-interval (default: not given)")
    args = p.parse_args()
    if args.requests < 40:
        sys.exit("--requests must be at least 40 (the issue asks for 300)")
    sys.exit(Driver(args).run())


if __name__ == "__main__":
    main()
