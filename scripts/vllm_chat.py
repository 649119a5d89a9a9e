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
from collections import Counter

import vllm_events as ve
import vllm_hybrid_model as hm

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
    """(ok, verdict) of one request by the rules in the module doc: an over-credit always
    fails, whatever the events show (`explained` is then only printed)."""
    if predicted > actual:
        return False, "OVER-CREDIT" + (f" ({explained})" if explained else "")
    if state == "unsynchronized" and predicted > 0:
        return False, "credit while unsynchronized"
    if predicted == actual:
        return True, "agree"
    if state == "exact" and explained:
        return True, "explained under-credit (" + explained + ")"
    if state == "exact":
        return False, "under-credit on an exact stream"
    return True, f"under-credit allowed ({state})"


# --- vLLM's own hit rule over the engine's own events (scripts/vllm_hybrid_model.py) ----------
# A difference between kvdir's credit and vLLM's cached_tokens is explained only from the events
# the engine published: the events are replayed in seq order into vLLM's per-group residency
# (copies counted per (hash, group)) and the prompt is looked up with vLLM 0.32's rule (dense,
# Gemma3 and windows-only models alike), once as vLLM holds the blocks and once as kvdir can
# credit them (a window store's hash no store located gives no credit, docs/protocol.md 2.3).

def prompt_hashes(tokens, salt=None, bs=BLOCK):
    """vLLM's 64-bit event hashes of the prompt's full blocks; a cache_salt is the first block's
    extra key (`("cache_salt", salt)`, vllm/v1/core/kv_cache_utils.py)."""
    out, parent = [], hm.NONE_HASH
    for k in range(len(tokens) // bs):
        extra = (("cache_salt", salt),) if salt and k == 0 else None
        parent = hm._sha((parent, tuple(tokens[k * bs:(k + 1) * bs]), extra))  # pylint: disable=protected-access
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out


def normalized(e):
    """An event with its group (absent: 0) and a store's kind (absent: full attention)."""
    if e["type"] == "BlockStored":
        return dict(e, group_idx=e.get("group_idx") or 0,
                    kv_cache_spec_kind=e.get("kv_cache_spec_kind") or "full_attention")
    if e["type"] == "BlockRemoved":
        return dict(e, group_idx=e.get("group_idx") or 0)
    return e


class Located(hm.Residency):
    """The residency kvdir can credit. A dense stream (group 0 of full attention alone) holds a
    block or not: its first removal drops it, even when vLLM stored it twice and still holds a
    copy (src/index/apply/removal.rs). A hybrid stream (from its first event of another group
    on) counts copies per group: a store whose token ids cover its hashes exactly locates them
    when its parent is located (or it has none); a window store listing fewer hashes, or one
    whose parent no store located (a windows-only model's), locates each hash only by a hash
    some store located before, else the copy waits unlocated (no credit) until one does
    (src/index/apply/hybrid.rs). So at default retention a windows-only stream locates only
    prompts short enough that the window keeps every block."""

    def __init__(self):
        super().__init__()
        self.located = set()
        self.waiting = {}  # hash -> Counter(group -> unlocated copies)
        self.dense = True

    def apply(self, seq, events):
        for e in events:
            kind = e["type"]
            if kind == "BlockStored":
                g = e.get("group_idx")
                if self.dense and (g != 0 or e.get("kv_cache_spec_kind") != "full_attention"):
                    self.dense = False  # kvdir's become_hybrid: one copy of each block
                    for key in self.copies:
                        self.copies[key] = 1
                self.groups.setdefault(g, (e.get("kv_cache_spec_kind"),
                                           e.get("kv_cache_spec_sliding_window"),
                                           e["block_size"]))
                hashes, tokens = e["block_hashes"], e.get("token_ids") or []
                exact = bool(tokens) and len(tokens) == len(hashes) * e["block_size"]
                parent = e.get("parent_block_hash")
                if exact and (parent is None or parent in self.located):
                    self.located.update(hashes)
                for h in hashes:
                    if h in self.located:
                        self.copies[(h, g)] += 1
                        for wg, n in self.waiting.pop(h, Counter()).items():
                            self.copies[(h, wg)] += n
                    else:
                        self.waiting.setdefault(h, Counter())[g] += 1
            elif kind == "BlockRemoved":
                g = e.get("group_idx")
                for h in e["block_hashes"]:
                    waiting = self.waiting.get(h, Counter())
                    if self.dense:
                        self.copies.pop((h, g), None)
                    elif waiting[g] > 0:
                        waiting[g] -= 1
                        if not +waiting:
                            del self.waiting[h]
                    elif self.copies[(h, g)] > 0:
                        self.copies[(h, g)] -= 1
                        if not self.copies[(h, g)]:
                            del self.copies[(h, g)]
            elif kind == "AllBlocksCleared":
                self.copies.clear()
                self.waiting.clear()


def step_boundary(before, after):
    """Whether a request of the same engine step may have been looked up between two events of
    one batch: vLLM looks a request up, then evicts for it (its removals), then caches its blocks
    in every group at once (its stores, in group order). So a lookup falls between one
    request's last store and the next request's first removal or first store (a store of a
    group no higher than the one before it), never inside one request's events."""
    if before["type"] != "BlockStored":
        return False
    if after["type"] == "BlockRemoved":
        return True
    return after["type"] == "BlockStored" and after["group_idx"] <= before["group_idx"]


def rule_states(messages, tokens, salt):
    """For each point of the engine's current run (a seq regression starts a new run: a
    restarted engine), `(index, seq, events applied of that batch or None for all, vLLM's hit,
    kvdir-creditable hit)`, after each whole batch and at each step_boundary inside one:
    requests scheduled in one engine step each see the blocks of those scheduled before them,
    whose events come first in the step's batch. The first point (seq None) is before the run's
    first message."""
    start = 0
    for i in range(1, len(messages)):
        if messages[i][1] <= messages[i - 1][1]:
            start = i
    hashes = prompt_hashes(tokens, salt)
    limit = len(tokens) - 1
    held, creditable = hm.Residency(), Located()
    out = [(start - 1, None, None, 0, 0)]
    for i in range(start, len(messages)):
        _, seq, _, events = messages[i]
        events = [normalized(e) for e in events]
        for j, e in enumerate(events):
            held.apply(seq, [e])
            creditable.apply(seq, [e])
            if j == len(events) - 1 or step_boundary(e, events[j + 1]):
                part = None if j == len(events) - 1 else j + 1
                out.append((i, seq, part, held.hit(hashes, limit),
                            creditable.hit(hashes, limit)))
        if not events:
            out.append((i, seq, None, held.hit(hashes, limit), creditable.hit(hashes, limit)))
    kinds = {k for k, _, _ in held.groups.values()}
    return out, kinds, creditable.dense


def explain(messages, arrived, tokens, salt, credit, actual, kvdir_seqs, times):
    """Whether vLLM's rule over the engine's own events explains an under-credit:
    - a race: kvdir's credit is the rule over the batches up to some seq K it could have held
      when it routed (from kvdir's stream sequence just before the request was sent to its
      sequence just after the answer), and vLLM's reuse is the rule over the batches up to a
      later seq S, which kvdir had not received at K;
    - unlocated (a windows-only model): at that K vLLM's rule gives vLLM's reuse but the hashes
      that make it were stored only by window stores no store located.
    Returns (kind, text); kind "" when not explained (text then says what the rule gives)."""
    states, kinds, dense = rule_states(messages, tokens, salt)
    low, high = kvdir_seqs
    def in_window(seq):
        if seq is None:
            return low is None or low < 0
        return (low is None or seq >= low) and (high is None or seq <= high)
    candidates = [p for p, s in enumerate(states) if s[2] is None and in_window(s[1])]
    sent, answered = times
    def when(i):
        if i < 0 or i >= len(arrived):
            return "?"
        return (f"arrived {1000 * (arrived[i] - sent):+.0f} ms after the send, "
                f"{1000 * (arrived[i] - answered):+.0f} ms after the answer")
    def point(s):
        if s[2] is None:
            return f"seq <= {s[1]}"
        total = len(messages[s[0]][3])
        return f"seq < {s[1]} and the first {s[2]} of seq {s[1]}'s {total} events"
    for pk in reversed(candidates):
        k = states[pk]
        if k[4] != credit:
            continue
        later = [s for s in states[pk + 1:] if s[3] == actual] if k[3] != actual else [k]
        if not later:
            continue
        s = later[0]
        if s is not k:
            return "race", (f"vLLM's rule gives kvdir's {credit} over seq <= {k[1]} and vLLM's "
                            f"{actual} over {point(s)}; kvdir was at seq {low}..{high} "
                            f"around the request; seq {s[1]} {when(s[0])}")
        if not kinds & set(hm.FULL_KINDS):
            return "unlocated", (f"at seq {k[1]} vLLM's rule gives vLLM's {actual} but only "
                                 f"{credit} over window stores some store located (a "
                                 "windows-only model: kvdir credits no unlocated block)")
        if dense:
            return "duplicate removal", (
                f"at seq {k[1]} vLLM's rule gives vLLM's {actual} from a block it stored twice "
                f"and removed once, and {credit} without it (a dense stream drops a block at its "
                "first removal)")
    at = [f"{states[p][1]}:{states[p][3]}/{states[p][4]}" for p in candidates[-4:]]
    return "", (f"not explained by vLLM's rule: seq:vLLM-rule/creditable in kvdir's window "
                f"{low}..{high}: {' '.join(at) or 'none'}; last {states[-1][1]}:{states[-1][3]}/"
                f"{states[-1][4]}")
