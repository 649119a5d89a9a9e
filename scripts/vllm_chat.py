"""The pieces of scripts/vllm_e2e.py: HTTP, the engines, kvdir's client, conversations, and
the rules that judge one request.

kvdir's predicted cached tokens on the engine it chose are its `x-kvdir-cached-tokens` header,
else `x-kvdir-kv-hit-ratio` times the prompt's tokens rounded to the block; the stream's state is
its `x-kvdir-stream-state` header, else the stream's phase just before the request.
"""

import json
import threading
import urllib.error
import urllib.request
import zlib

import vllm_events as ve

BLOCK = 32
MAX_TOKENS = 4
SYNCED = ("live", "partial")
# Phases with credit: a periodic resync keeps applying live batches.
CREDITED = ("live", "resyncing", "partial")
WORDS = ("software license copyright notice permission granted free charge person obtaining copy "
         "documentation files deal without restriction including limitation rights use modify "
         "merge publish distribute sublicense sell copies subject following conditions above "
         "shall included all substantial portions provided warranty express implied "
         "merchantability fitness particular purpose noninfringement event authors holders "
         "liable claim damages "
         "other liability whether action contract tort otherwise arising from connection program "
         "source code object form work derivative works version general public library terms "
         "redistribution binary modification contributors may used endorse promote products "
         "written prior apache foundation grant patent trademark notice file").split()


def http(method, url, body=None, headers=None, timeout=120):
    """(status, headers as a lower-case dict, parsed JSON body or text)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, hdrs, text = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, e.headers, e.read()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text.decode(errors="replace")
    return status, {k.lower(): v for k, v in hdrs.items()}, parsed


class Engine:
    """One vLLM server: its name in kvdir, URL, live tap and launcher."""

    def __init__(self, spec, topic, bound=False):
        self.name, self.url, self.events, self.launcher = spec.split(",")
        self.pidfile = self.launcher[:-3] + ".pid"
        # Bound (kv_events_bind): EVENTS is the replay endpoint, the only one left to read.
        self.tap = (ve.ReplayTap if bound else ve.Tap)(self.events, topic)
        self.cached_prompts = []  # recent conversations routed here, for the restart

    def healthy(self):
        try:
            return http("GET", self.url + "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def tokenize(self, messages):
        body = {"model": "model", "messages": messages, "add_generation_prompt": True}
        return http("POST", self.url + "/tokenize", body)[2]["tokens"]


class Results:
    """Pass/fail lines, printed as they come."""

    def __init__(self):
        self.passed = self.failed = 0
        self.explained = []
        self.lock = threading.Lock()

    def add(self, ok, line, explained=False):
        with self.lock:
            if ok:
                self.passed += 1
            else:
                self.failed += 1
            if explained:
                self.explained.append(line)
            print(("ok   " if ok else "FAIL ") + line, flush=True)

    def check(self, ok, name, detail=""):
        self.add(ok, f"check {name}: {'pass' if ok else 'fail'} {detail}".rstrip())


class Conversation:
    """A chat: a system prompt, past turns and a salt."""

    counter = 0

    def __init__(self, system, rng, salt=None, max_turns=4):
        Conversation.counter += 1
        self.id, self.system, self.rng, self.salt = Conversation.counter, system, rng, salt
        self.turns, self.max_turns = [], max_turns
        self.next_user = self.user_text()

    def user_text(self, words=None):
        n = words or self.rng.randrange(40, 100)
        body = " ".join(self.rng.choice(WORDS) for _ in range(n))
        return f"Question {self.id}.{len(self.turns)}: {body}?"

    def messages(self):
        out = [{"role": "system", "content": self.system}]
        for user, assistant in self.turns:
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return out + [{"role": "user", "content": self.next_user}]

    def advance(self):
        self.turns.append((self.next_user, f"Answer {self.id}.{len(self.turns)}."))
        self.next_user = self.user_text()

    def done(self):
        return len(self.turns) >= self.max_turns


class Kvdir:
    """kvdir's front door and streams endpoint; falls back to the engines when it is down."""

    def __init__(self, url, engines):
        self.url, self.engines = url, engines
        self.up, self.why_down = True, ""

    def streams(self):
        """Stream reports by instance name; {} when kvdir does not answer."""
        try:
            status, _, body = http("GET", self.url + "/v1/internal/streams", timeout=2)
        except OSError:
            return {}
        if status != 200 or not isinstance(body, dict):
            return {}
        return {s.get("instance_name", s.get("name")): s for s in body.get("streams", [])}

    def chat(self, messages, salt=None):
        """(engine, headers, body) of one chat request; through kvdir when it is up, else
        straight to an engine (chosen by the system prompt, so a conversation stays on one
        engine) so that the rest of the run still shows vLLM's side."""
        body = {"model": "model", "messages": messages, "max_tokens": MAX_TOKENS,
                "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        if self.up:
            try:
                status, hdrs, resp = http("POST", self.url + "/v1/chat/completions", body)
            except OSError as e:
                status, hdrs, resp = 0, {}, str(e)
            if status == 200:
                return self.by_name(hdrs.get("x-kvdir-instance")), hdrs, resp
            return None, hdrs, f"kvdir answered {status}: {str(resp)[:200]}"
        engine = self.engines[zlib.crc32(messages[0]["content"].encode()) % len(self.engines)]
        return engine, {}, http("POST", engine.url + "/v1/chat/completions", body)[2]

    def query(self, tokens, salt=None):
        """kvdir's query answer for `tokens` (with `cache_salt` `salt`), by instance name
        (rank 0)."""
        try:
            body = {"token_ids": tokens}
            if salt:
                body["cache_salt"] = salt
            status, _, resp = http("POST", self.url + "/v1/internal/kv-cache/query", body)
        except OSError:
            return {}
        if status != 200 or not isinstance(resp, dict):
            return {}
        return {m["instance_name"]: m for m in resp.get("matches", []) if m["dp_rank"] == 0}

    def by_name(self, name):
        return next((e for e in self.engines if e.name == name), None)


def predicted_tokens(hdrs, prompt_tokens):
    """kvdir's predicted cached tokens: its header, else the hit ratio rounded to the block."""
    if "x-kvdir-cached-tokens" in hdrs:
        return int(hdrs["x-kvdir-cached-tokens"])
    ratio = float(hdrs.get("x-kvdir-kv-hit-ratio", "0"))
    return round(ratio * prompt_tokens / BLOCK) * BLOCK


def stream_state(hdrs, report):
    """exact | partial | unsynchronized: kvdir's header, else the stream's phase just before
    the request."""
    if "x-kvdir-stream-state" in hdrs:
        return hdrs["x-kvdir-stream-state"]
    phase = (report or {}).get("phase")
    return {"live": "exact", "resyncing": "exact", "partial": "partial"}.get(phase,
                                                                          "unsynchronized")


def in_flight(history, during, prompt, low, high):
    """Why kvdir's credit and vLLM's reuse differ for a prompt whose blocks in token range
    (low, high] changed while the request was in flight: `during` holds the engine's messages
    published from the request's send on (`history` everything up to their end). A block of
    that range stored during it was published after kvdir routed (under-credit); one removed
    during it was evicted after kvdir routed (over-credit). "" when neither."""
    chains = ve.prefixes(history)
    def in_range(h):
        chain = chains.get(h)
        return chain is not None and low < len(chain) <= high and prompt[:len(chain)] == chain
    stored = [b[0] for b in ve.stored_blocks(during) if in_range(b[0])]
    removed = [h for h in ve.removed_hashes(during) if in_range(h)]
    if removed:
        return f"{len(removed)} block(s) of the prompt evicted while it was in flight"
    if stored:
        return f"{len(stored)} block(s) of the prompt published only while it was in flight"
    return ""


def judge(predicted, actual, state, explained):
    """(ok, verdict) of one request by the rules in the module doc."""
    if predicted > actual and explained and "evicted" in explained:
        return True, "explained over-credit (" + explained + ")"
    if predicted > actual:
        return False, "OVER-CREDIT"
    if state == "unsynchronized" and predicted > 0:
        return False, "credit while unsynchronized"
    if predicted == actual:
        return True, "agree"
    if state == "exact" and explained:
        return True, "explained under-credit (" + explained + ")"
    if state == "exact":
        return False, "under-credit on an exact stream"
    return True, f"under-credit allowed ({state})"
