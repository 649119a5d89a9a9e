"""kvdir's benefit on two real vLLM servers: TTFT p50/p99 and cached share per front-door policy.

Run by scripts/vllm-benefit.sh, which starts the engines and writes kvdir's launcher; alone:

    python scripts/vllm_benefit.py --engine URL --engine URL --kvdir-launcher kvdir.sh \
        --kvdir URL --model DIR --out DIR [--policies TTFT,CAR,RR] [--duration S] [--rate R]

1. Calibration, straight to the engines (no kvdir): fresh prompts of two sizes, streamed one at
   a time, give one request's prefill time and the engine's prefill rate (TTFT = fixed +
   uncached tokens / rate, fitted on medians). The first requests also warm the engines up.
2. The workload, made once from --seed and the same for every policy: --system-prompts shared
   system prompts, chats of --turns turns (a fixed pseudo-answer per turn, so every prompt is
   known in advance), --slots chats in flight. Arrivals are Poisson at --rate requests per
   second over all engines, --duration seconds; each arrival goes to a random slot among those
   idle for at least --slots / 2 arrivals, whose chat takes its next turn (a new chat after the
   last), so consecutive turns of a chat are about --slots arrivals apart (--slots / --rate
   seconds) in no fixed order a round robin could fall into step with (with slot k mod --slots
   and an even --slots, round robin would keep every chat on one engine). Without --rate it is
   chosen so that
   round robin keeps each engine busy --utilization of the time (the calibrated prefill time of
   each request's uncached tokens under round robin with an unbounded cache, simulated).
3. Each policy: POST /reset_prefix_cache on both engines (VLLM_SERVER_DEV_MODE=1), so every
   policy starts cold, and one request shorter than a block (vLLM publishes the reset's
   AllBlocksCleared only with its next step), then kvdir is started with --frontend_policy
   POLICY, waited for (both engines ACTIVE with a load report and both streams live), checked
   cold (its hits for every prompt of the workload sum to 0), and sent the workload through its
   front door: every request streamed (TTFT from the arrival, i.e. when it was due, to the
   first `data:` line, which vLLM sends once the first token exists) with
   stream_options.include_usage, so the engine's usage.prompt_tokens_details.cached_tokens
   comes back. Open loop: a request is sent when due whether or not the chat's previous turn
   has been answered (its prompt does not depend on the answer); such overlaps are counted.
   Then kvdir is stopped.
4. The report: per policy requests, errors, TTFT p50/p99, cached share (cached_tokens summed
   over prompt_tokens summed), the ratios to RR, requests per engine; JSON in OUT/benefit.json
   and a Markdown table on stdout and in OUT/benefit.md.
"""

import argparse
import http.client
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

BLOCK = 32
WORDS = ("software license copyright notice permission granted free charge person obtaining copy "
         "documentation files deal without restriction including limitation rights use modify "
         "merge publish distribute sublicense sell copies subject following conditions above "
         "shall included all substantial portions provided warranty express implied "
         "merchantability fitness particular purpose noninfringement event authors holders "
         "liable claim damages other liability whether action contract tort otherwise arising "
         "from connection program source code object form work derivative works version general "
         "public library terms redistribution binary modification contributors may used endorse "
         "promote products written prior apache foundation grant patent trademark file").split()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- HTTP ---------------------------------------------------------------------------------------

def http_json(method, url, body=None, timeout=30):
    """(status, parsed body or text); OSError when nothing answers."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text.decode(errors="replace")
    finally:
        conn.close()


def stream_chat(base, messages, max_tokens, t0, timeout=600):
    """One streamed chat request to BASE (kvdir or an engine); times count from t0 (the
    request's arrival). Returns a dict: status, ttft (first `data:` line), ttft_content (first
    chunk with non-empty content), latency, prompt_tokens, cached_tokens, the kvdir headers."""
    u = urllib.parse.urlsplit(base)
    body = {"model": "model", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    out = {"status": 0, "ttft": None, "ttft_content": None, "latency": None,
           "prompt_tokens": None, "cached_tokens": None, "error": ""}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        out["sent"] = time.time() - t0
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        for h in ("x-kvdir-instance", "x-kvdir-cached-tokens", "x-kvdir-policy",
                  "x-kvdir-stream-state", "x-kvdir-dp-rank"):
            if resp.getheader(h) is not None:
                out[h] = resp.getheader(h)
        if resp.status != 200:
            out["error"] = resp.read()[:300].decode(errors="replace")
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            now = time.time() - t0
            if out["ttft"] is None:
                out["ttft"] = now
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            for choice in chunk.get("choices") or []:
                if out["ttft_content"] is None and (choice.get("delta") or {}).get("content"):
                    out["ttft_content"] = now
            usage = chunk.get("usage")
            if usage:
                out["prompt_tokens"] = usage.get("prompt_tokens")
                out["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get(
                    "cached_tokens") or 0
        out["latency"] = time.time() - t0
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


# --- the workload -------------------------------------------------------------------------------

def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Workload:
    """Every request's arrival time and messages, made from the seed alone."""

    def __init__(self, args, rate, n):
        rng = random.Random(args.seed)
        self.systems = [f"System prompt {s}. You are assistant number {s}. "
                        + words(rng, args.system_words) for s in range(args.system_prompts)]
        t, self.arrivals = 0.0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            self.arrivals.append(t)
        self.requests = []  # (arrival, chat id, turn, messages)
        chats = 0
        slots = [None] * args.slots  # per slot: [chat id, system, past turns]
        last = [-args.slots] * args.slots  # per slot: the arrival of its latest turn
        gap = max(1, args.slots // 2)
        for k, arrival in enumerate(self.arrivals):
            # A random slot among those idle for at least half of --slots arrivals: turns of a
            # chat are --slots arrivals apart on average, never fewer than half that, and
            # their order carries no pattern a round robin could fall into step with.
            s = rng.choice([j for j in range(args.slots) if k - last[j] >= gap])
            last[s] = k
            if slots[s] is None or len(slots[s][2]) >= args.turns:
                chats += 1
                slots[s] = [chats, rng.randrange(args.system_prompts), []]
            chat, system, past = slots[s]
            user = (f"Question {chat}.{len(past)}: "
                    + words(rng, rng.randrange(args.user_words // 2, args.user_words * 3 // 2))
                    + "?")
            messages = [{"role": "system", "content": self.systems[system]}]
            for q, a in past:
                messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            messages.append({"role": "user", "content": user})
            self.requests.append((arrival, chat, len(past), messages))
            past.append((user, f"Answer {chat}.{len(past)}: " + words(rng, args.answer_words)))
        self.chats = chats


def block_keys(tokens):
    """Chained keys of the prompt's whole blocks within its first n - 1 tokens (what vLLM can
    reuse: never the last token)."""
    keys, h = [], 0
    for k in range((len(tokens) - 1) // BLOCK):
        h = hash((h, tuple(tokens[k * BLOCK:(k + 1) * BLOCK])))
        keys.append(h)
    return keys


def simulate(token_lists, choose):
    """Uncached tokens per request when request i goes to engine choose(i, keys) and each
    engine keeps every block it ever computed (no eviction)."""
    held = [set(), set()]
    uncached = []
    for i, tokens in enumerate(token_lists):
        keys = block_keys(tokens)
        e = choose(i, keys, held)
        hit = 0
        for key in keys:
            if key not in held[e]:
                break
            hit += 1
        uncached.append(len(tokens) - hit * BLOCK)
        held[e].update(keys)
    return uncached


def best_of(i, keys, held):
    """The engine holding the longer prefix (ties alternate): an ideal cache-aware router."""
    hits = []
    for h in held:
        n = 0
        for key in keys:
            if key not in h:
                break
            n += 1
        hits.append(n)
    if hits[0] == hits[1]:
        return i % 2
    return 0 if hits[0] > hits[1] else 1


def chat_tokens(tokenizer, messages):
    """The prompt's token ids as vLLM makes them: the chat template rendered, then encoded
    without added special tokens."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


# --- calibration --------------------------------------------------------------------------------

def calibrate(args, engines, tokenizer):
    """(fixed seconds, prefill tokens per second, one long request's TTFT, samples): fresh
    prompts of two sizes sent one at a time to each engine, after one warm-up each."""
    rng = random.Random(args.seed + 1)
    sizes = (args.calibrate_short, args.calibrate_long)
    samples = {s: [] for s in sizes}
    def prompt(n_words):
        text = f"Calibration {rng.random()}: " + words(rng, n_words)
        return [{"role": "user", "content": text}]
    def tokens_of(messages):
        return len(chat_tokens(tokenizer, messages))
    # Words per token of this text, so the calibration prompts have the sizes asked for.
    probe = prompt(400)
    per_word = tokens_of(probe) / 400
    for e in engines:
        r = stream_chat(e, prompt(int(sizes[1] / per_word)), 1, time.time())
        log(f"warm-up on {e}: status {r['status']}, TTFT {r['ttft']}")
    for _ in range(args.calibrate_rounds):
        for e in engines:
            for s in sizes:
                messages = prompt(int(s / per_word))
                n = tokens_of(messages)
                r = stream_chat(e, messages, 1, time.time())
                if r["status"] != 200 or r["ttft"] is None:
                    sys.exit(f"calibration request to {e} failed: {r}")
                samples[s].append((n, r["ttft"], r["cached_tokens"]))
                log(f"calibration {e}: {n} tokens ({r['cached_tokens']} cached), TTFT "
                    f"{r['ttft']:.3f} s")
    short = statistics.median(t for _, t, _ in samples[sizes[0]])
    long_ = statistics.median(t for _, t, _ in samples[sizes[1]])
    n_short = statistics.median(n for n, _, _ in samples[sizes[0]])
    n_long = statistics.median(n for n, _, _ in samples[sizes[1]])
    rate = (n_long - n_short) / max(long_ - short, 1e-6)
    fixed = max(short - n_short / rate, 0.0)
    return fixed, rate, long_, n_long, samples


# --- kvdir --------------------------------------------------------------------------------------

class Kvdir:
    """One kvdir process, started through the launcher with the phase's policy."""

    def __init__(self, args, policy):
        self.args, self.policy = args, policy
        self.proc = subprocess.Popen(["bash", args.kvdir_launcher, policy],
                                     start_new_session=True)
        self.started = time.time()

    def wait_ready(self, engines, timeout=120):
        deadline = time.time() + timeout
        why = "no answer"
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"kvdir ({self.policy}) exited with {self.proc.returncode}; see its log")
            try:
                s1, inst = http_json("GET", self.args.kvdir + "/v1/internal/instances", timeout=3)
                s2, streams = http_json("GET", self.args.kvdir + "/v1/internal/streams",
                                        timeout=3)
            except OSError as e:
                why = str(e)
                time.sleep(0.5)
                continue
            if s1 == 200 and s2 == 200:
                active = [i for i in inst.get("instances", [])
                          if i.get("state") == "ACTIVE" and (i.get("engine") or {}).get(
                              "identity_known") and (i.get("engine") or {}).get("polls", 0) > 0]
                live = [s for s in streams.get("streams", []) if s.get("phase") == "live"]
                if len(active) >= len(engines) and len(live) >= len(engines):
                    return time.time() - self.started
                why = (f"{len(active)} engines ACTIVE, {len(live)} streams live: "
                       f"{[(s.get('instance_name'), s.get('phase')) for s in streams.get('streams', [])]}")
            time.sleep(0.5)
        sys.exit(f"kvdir ({self.policy}) not ready in {timeout} s: {why}")

    def snapshot(self):
        """Its instances and streams reports, for the record."""
        out = {}
        for path in ("/v1/internal/instances", "/v1/internal/streams"):
            try:
                out[path] = http_json("GET", self.args.kvdir + path, timeout=5)[1]
            except OSError as e:
                out[path] = str(e)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The launcher's pid file (beside it), read by the shell script's exit trap.
        try:
            os.remove(os.path.join(os.path.dirname(self.args.kvdir_launcher), "kvdir.pid"))
        except OSError:
            pass


def reset_engines(engines):
    """POST /reset_prefix_cache on every engine (VLLM_SERVER_DEV_MODE=1); retried while the
    engine still holds blocks (vLLM answers {"success": false} then). vLLM queues the reset's
    AllBlocksCleared event and publishes it only with its next engine step, so an idle engine
    would keep it back and a kvdir started now would replay a history that still holds every
    block: a request shorter than one block (nothing cached) makes that step."""
    for e in engines:
        for _ in range(60):
            status, body = http_json("POST", e + "/reset_prefix_cache", timeout=30)
            if status == 200 and isinstance(body, dict) and body.get("success"):
                break
            time.sleep(1)
        else:
            sys.exit(f"{e}/reset_prefix_cache answered {status}: {body}")
        flush = {"model": "model", "max_tokens": 1,
                 "messages": [{"role": "user", "content": "flush"}]}
        status, _ = http_json("POST", e + "/v1/chat/completions", flush, timeout=120)
        log(f"reset_prefix_cache on {e}: {body}; one-token request {status}")


def check_cold(args, tokenizer, workload):
    """kvdir's hits for every distinct prompt of the workload, summed over the engines: 0 when
    the phase starts cold."""
    total = 0
    for _, _, _, messages in workload.requests:
        ids = chat_tokens(tokenizer, messages)
        status, body = http_json("POST", args.kvdir + "/v1/internal/kv-cache/query",
                                 {"token_ids": ids}, timeout=10)
        if status == 200 and isinstance(body, dict):
            total += sum(m.get("device_hit_tokens", 0) + m.get("host_only_hit_tokens", 0)
                         for m in body.get("matches", []))
    return total


# --- one phase ----------------------------------------------------------------------------------

def run_phase(args, policy, workload, engines, tokenizer):
    reset_engines(engines)
    kvdir = Kvdir(args, policy)
    try:
        ready = kvdir.wait_ready(engines)
        stale = check_cold(args, tokenizer, workload)
        log(f"{policy}: kvdir ready {ready:.1f} s after its start; its hits for the workload's "
            f"prompts before the phase: {stale} tokens (0: cold)")
        results = [None] * len(workload.requests)
        answered = {}  # (chat, turn) -> time answered (from t0)
        overlaps = [0]
        lock = threading.Lock()
        def send(i, t0):
            arrival, chat, turn, messages = workload.requests[i]
            with lock:
                if turn > 0 and (chat, turn - 1) not in answered:
                    overlaps[0] += 1
            r = stream_chat(args.kvdir, messages, args.max_tokens, t0 + arrival)
            r.update(i=i, chat=chat, turn=turn, arrival=arrival)
            with lock:
                answered[(chat, turn)] = time.time() - t0
            results[i] = r
        pool = ThreadPoolExecutor(max_workers=args.max_in_flight)
        t0 = time.time() + 1.0
        late = 0.0
        for i, (arrival, _, _, _) in enumerate(workload.requests):
            wait = t0 + arrival - time.time()
            if wait > 0:
                time.sleep(wait)
            late = max(late, -wait)
            pool.submit(send, i, t0)
        last = time.time()
        pool.shutdown(wait=False)
        deadline = last + args.drain
        while any(r is None for r in results) and time.time() < deadline:
            time.sleep(0.2)
        missing = sum(r is None for r in results)
        end = time.time() - t0
        snap = kvdir.snapshot()
    finally:
        kvdir.stop()
    if missing:
        log(f"{policy}: {missing} requests unanswered after {args.drain} s of drain; "
            "counted as errors")
    # A request without a first token counts in the percentiles with its wait until the end.
    censored = [r["ttft"] if r and r["ttft"] is not None else end - workload.requests[i][0]
                for i, r in enumerate(results)]
    phase = summarize(policy, censored, results, overlaps[0], late, end, snap)
    phase["stale_hit_tokens_at_start"] = stale
    return phase


def pct(values, q):
    """The q-quantile by linear interpolation (numpy's default)."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def answered_ok(r):
    return bool(r) and r["status"] == 200 and r["ttft"] is not None \
        and r["prompt_tokens"] is not None


def summarize(policy, ttft, results, overlaps, late, elapsed, snap):
    """TTFT percentiles over every request (`ttft`: a request that never got a first token
    counts with its wait until the phase ended); the rest over the answered ones."""
    ok = [r for r in results if answered_ok(r)]
    errors = len(results) - len(ok)
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    predicted = sum(int(r.get("x-kvdir-cached-tokens") or 0) for r in ok)
    per_engine = {}
    for r in ok:
        per_engine[r.get("x-kvdir-instance", "?")] = per_engine.get(r.get("x-kvdir-instance",
                                                                          "?"), 0) + 1
    by_turn = {}
    for r in ok:
        by_turn.setdefault(r["turn"], []).append(r["ttft"])
    content_gap = [r["ttft_content"] - r["ttft"] for r in ok if r["ttft_content"] is not None]
    return {
        "policy": policy, "requests": len(results), "ok": len(ok), "errors": errors,
        "error_samples": [(r["status"], r["error"]) if r else "unanswered"
                          for r in results if not answered_ok(r)][:5],
        "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9), "ttft_p99": pct(ttft, 0.99),
        "ttft_mean": statistics.fmean(ttft) if ttft else float("nan"),
        "ttft_max": max(ttft) if ttft else float("nan"),
        "latency_p50": pct([r["latency"] for r in ok], 0.5),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else float("nan"),
        "kvdir_predicted_tokens": predicted,
        "per_engine": per_engine,
        "ttft_p50_by_turn": {t: pct(v, 0.5) for t, v in sorted(by_turn.items())},
        "first_content_after_first_data_p50": pct(content_gap, 0.5),
        "overlaps": overlaps, "max_send_late_s": late, "elapsed_s": elapsed,
        "policy_headers": sorted({r.get("x-kvdir-policy", "") for r in ok}),
        "stream_states": sorted({r.get("x-kvdir-stream-state", "") for r in ok}),
        "kvdir_audit": (snap.get("/v1/internal/instances") or {}).get("cache_audit")
        if isinstance(snap.get("/v1/internal/instances"), dict) else None,
        "results": results,
    }


def table(phases):
    rr = next((p for p in phases if p["policy"] == "RR"), None)
    def ratio(p, key):
        if rr is None or not rr[key]:
            return "-"
        return f"{p[key] / rr[key]:.2f}"
    lines = ["| policy | requests (ok) | TTFT p50 s | TTFT p99 s | cached share | "
             "p50 / RR | p99 / RR | requests per engine |",
             "|---|---|---|---|---|---|---|---|"]
    for p in phases:
        engines = ", ".join(f"{v}" for _, v in sorted(p["per_engine"].items()))
        lines.append(f"| {p['policy']} | {p['requests']} ({p['ok']}) | {p['ttft_p50']:.3f} | "
                     f"{p['ttft_p99']:.3f} | {100 * p['cached_share']:.1f} % | "
                     f"{ratio(p, 'ttft_p50')} | {ratio(p, 'ttft_p99')} | {engines} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", action="append", required=True, help="a vLLM base URL (twice)")
    p.add_argument("--kvdir", required=True, help="kvdir's base URL")
    p.add_argument("--kvdir-launcher", required=True,
                   help="a script that runs kvdir in the foreground with --frontend_policy $1")
    p.add_argument("--model", required=True, help="the model directory (its tokenizer)")
    p.add_argument("--out", required=True, help="directory for benefit.json and benefit.md")
    p.add_argument("--policies", default="TTFT,CAR,RR",
                   help="front-door policies, run in this order (default TTFT,CAR,RR)")
    p.add_argument("--duration", type=float, default=180,
                   help="seconds of arrivals per policy (default 180)")
    p.add_argument("--drain", type=float, default=60,
                   help="at most this many seconds after the last arrival (default 60)")
    p.add_argument("--rate", type=float, default=0,
                   help="arrivals per second over both engines (default: from --utilization)")
    p.add_argument("--utilization", type=float, default=0.65,
                   help="without --rate: the share of time round robin keeps each engine "
                   "prefilling, from the calibration (default 0.65)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-words", type=int, default=200,
                   help="words of a system prompt (about 1.8 tokens each; default 200)")
    p.add_argument("--user-words", type=int, default=60,
                   help="mean words of a user turn (uniform over half to 1.5 times)")
    p.add_argument("--answer-words", type=int, default=8,
                   help="words of the fixed pseudo-answer of each past turn (default 8: vLLM "
                   "caches the answer it generated, not this text, so this part of the "
                   "history is never reusable)")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--slots", type=int, default=12, help="chats in flight")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-in-flight", type=int, default=128)
    p.add_argument("--calibrate-short", type=int, default=128)
    p.add_argument("--calibrate-long", type=int, default=1024)
    p.add_argument("--calibrate-rounds", type=int, default=3)
    p.add_argument("--dry-run", action="store_true",
                   help="make the workload and simulate it (needs --rate and --model), no "
                   "requests")
    args = p.parse_args()
    policies = [x.strip().upper() for x in args.policies.split(",") if x.strip()]
    bad = [x for x in policies if x not in ("TTFT", "CAR", "RR", "SLO_AWARE")]
    if bad:
        p.error(f"unknown policy {bad}")
    os.makedirs(args.out, exist_ok=True)
    from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def tokens(messages):
        return chat_tokens(tokenizer, messages)

    report = {"args": vars(args)}
    if args.dry_run:
        if not args.rate:
            p.error("--dry-run needs --rate")
        fixed, tok_rate = 0.05, 1000.0
    else:
        log("calibrating: one request at a time, straight to the engines")
        fixed, tok_rate, one, n_one, samples = calibrate(args, args.engine, tokenizer)
        log(f"calibration: fixed {fixed:.3f} s, prefill {tok_rate:.0f} tokens/s; one "
            f"uncached {n_one:.0f}-token prompt: TTFT {one:.3f} s")
        report["calibration"] = {"fixed_s": fixed, "prefill_tokens_per_s": tok_rate,
                                 "long_prompt_tokens": n_one, "long_prompt_ttft_s": one,
                                 "samples": samples}
        reset_engines(args.engine)

    # The workload's shape at a nominal rate (arrival times scale with the rate; the prompts
    # depend on the seed and the request count only).
    n_nominal = 400
    shape = Workload(args, 1.0, n_nominal)
    lists = [tokens(m) for _, _, _, m in shape.requests]
    rr = simulate(lists, lambda i, keys, held: i % 2)
    best = simulate(lists, best_of)
    mean_tokens = statistics.fmean(len(t) for t in lists)
    service_rr = fixed + statistics.fmean(rr) / tok_rate
    service_best = fixed + statistics.fmean(best) / tok_rate
    rate = args.rate or round(args.utilization * 2 / service_rr, 2)
    n = max(20, int(rate * args.duration))
    workload = Workload(args, rate, n)
    lists = [tokens(m) for _, _, _, m in workload.requests]
    sim = {"prompt_tokens_mean": statistics.fmean(len(t) for t in lists),
           "prompt_tokens_max": max(len(t) for t in lists),
           "uncached_mean_rr": statistics.fmean(simulate(lists, lambda i, k, h: i % 2)),
           "uncached_mean_affinity": statistics.fmean(simulate(lists, best_of)),
           "service_s_rr": service_rr, "service_s_affinity": service_best,
           "utilization_rr": rate / 2 * service_rr,
           "utilization_affinity": rate / 2 * service_best}
    report.update(rate=rate, requests=n, chats=workload.chats, simulated=sim)
    log(f"workload: {n} requests at {rate} /s (Poisson, {args.duration:.0f} s), {workload.chats} "
        f"chats of up to {args.turns} turns over {args.system_prompts} system prompts, "
        f"{args.slots} in flight; prompts {sim['prompt_tokens_mean']:.0f} tokens on average "
        f"(max {sim['prompt_tokens_max']}, nominal shape {mean_tokens:.0f}); simulated uncached "
        f"{sim['uncached_mean_rr']:.0f} tokens/request under RR, "
        f"{sim['uncached_mean_affinity']:.0f} under ideal affinity; calibrated utilization "
        f"RR {sim['utilization_rr']:.2f}, affinity {sim['utilization_affinity']:.2f}")
    if args.dry_run:
        print(json.dumps(report, indent=1, default=str))
        return 0
    phases = []
    for policy in policies:
        log(f"phase {policy}")
        phase = run_phase(args, policy, workload, args.engine, tokenizer)
        phases.append(phase)
        log(f"{policy}: {phase['ok']}/{phase['requests']} ok, TTFT p50 {phase['ttft_p50']:.3f} s "
            f"p99 {phase['ttft_p99']:.3f} s, cached share {100 * phase['cached_share']:.1f} % "
            f"(kvdir credited {phase['kvdir_predicted_tokens']} of {phase['cached_tokens']} "
            f"cached tokens), per engine {phase['per_engine']}, overlaps {phase['overlaps']}, "
            f"sends late by at most {phase['max_send_late_s']:.3f} s, "
            f"p50 by turn { {t: round(v, 3) for t, v in phase['ttft_p50_by_turn'].items()} }")
        with open(os.path.join(args.out, "benefit.json"), "w") as f:
            json.dump(dict(report, phases=phases), f, indent=1, default=str)
    md = table(phases)
    with open(os.path.join(args.out, "benefit.md"), "w") as f:
        f.write(md + "\n")
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
