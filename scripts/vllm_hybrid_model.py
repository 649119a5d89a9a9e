"""A pure-Python model of vLLM 0.32's prefix-cache hit rule for hybrid KV cache groups, checked
against real recordings (tests/fixtures/vllm-hybrid, made by scripts/vllm-record-hybrid.sh).

    python3 scripts/vllm_hybrid_model.py [DIR...] [--verbose] [--json]

(Python 3 only, no packages: it carries its own msgpack decoder.) For each recording it replays
live.jsonl in seq order into a per-group residency map, `(engine block hash, group_idx) -> number
of copies` (BlockStored adds one copy of each listed hash, BlockRemoved takes one away,
AllBlocksCleared empties it). Before each request it applies the batches up to the request's
`seq_before` and predicts vLLM's `cached_tokens` with vLLM's rule:
- the prompt's block hashes are vLLM's own (sha256 of the pickled `(parent, tokens, None)`, the
  first parent derived from the seed "vllm-none-hash"; the event hash is its low 64 bits);
- the lookup length is capped at `len(prompt) - 1` (kv_cache_manager.py:295);
- groups of the same kind and window are looked up together, full attention first; a
  full-attention group hits the longest run of cached blocks from block 0; a sliding-window
  group (window W) hits at the right end of the rightmost run of `cdiv(W-1, BS)` cached blocks
  within the current length, else the run of cached blocks starting at block 0
  (single_type_kv_cache_manager.py:943-1051); with two spec groups, full attention first, one
  pass, else repeated until no group shortens it (kv_cache_coordinator.py:796-931).
It prints each request's prediction next to vLLM's, explains each difference, gives the
agreement of simpler rules for comparison (`union`: group_idx ignored; `full-only`; `every-group`
from block 0), and reports (--json) what the event stream showed (group order within a batch, duplicate stores, removal shapes, where the
sliding group's hashes sit in its token range).
"""

import argparse
import glob
import hashlib
import json
import os
import pickle
import struct
import sys
from collections import Counter

NONE_SEED = "vllm-none-hash"
FULL_KINDS = ("full_attention", "mla_attention", "sink_full_attention")
SLIDING_KINDS = ("sliding_window", "sliding_window_mla")


# --- a minimal msgpack decoder (what vLLM's msgspec encoder emits) --------------------------
def unpack(data):
    value, end = _unpack(data, 0)
    assert end == len(data), "trailing bytes"
    return value


def _unpack(b, i):
    t = b[i]
    i += 1
    if t <= 0x7F:
        return t, i
    if 0x80 <= t <= 0x8F:
        return _map(b, i, t & 0x0F)
    if 0x90 <= t <= 0x9F:
        return _array(b, i, t & 0x0F)
    if 0xA0 <= t <= 0xBF:
        n = t & 0x1F
        return b[i:i + n].decode(), i + n
    if t >= 0xE0:
        return t - 0x100, i
    if t == 0xC0:
        return None, i
    if t == 0xC2:
        return False, i
    if t == 0xC3:
        return True, i
    fixed = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
             0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if t in fixed:
        fmt = fixed[t]
        n = struct.calcsize(fmt)
        return struct.unpack(fmt, b[i:i + n])[0], i + n
    sized = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4,
             0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
    if t in sized:
        w = sized[t]
        n = int.from_bytes(b[i:i + w], "big")
        i += w
        if t in (0xC4, 0xC5, 0xC6):
            return bytes(b[i:i + n]), i + n
        if t in (0xD9, 0xDA, 0xDB):
            return b[i:i + n].decode(), i + n
        if t in (0xDC, 0xDD):
            return _array(b, i, n)
        return _map(b, i, n)
    raise ValueError(f"msgpack type 0x{t:02x} not handled")


def _array(b, i, n):
    out = []
    for _ in range(n):
        v, i = _unpack(b, i)
        out.append(v)
    return out, i


def _map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = _unpack(b, i)
        v, i = _unpack(b, i)
        out[k] = v
    return out, i


def event_dict(e):
    """A map event as is; a positional one named by vLLM 0.32's declared field order."""
    if isinstance(e, dict):
        return e
    names = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                             "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                             "kv_cache_spec_kind", "kv_cache_spec_sliding_window"),
             "BlockRemoved": ("block_hashes", "medium", "group_idx")}
    return dict(zip(names.get(e[0], ()), e[1:]), type=e[0])


# --- vLLM's block hashes (kv_cache_utils.hash_block_tokens with utils.hashing.sha256) -------
def _sha(obj):
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = _sha(NONE_SEED)


def block_hashes(tokens, bs):
    """The 64-bit event hashes of every full block of `tokens` (no salt, LoRA or media)."""
    out, parent = [], NONE_HASH
    for k in range(len(tokens) // bs):
        parent = _sha((parent, tuple(tokens[k * bs:(k + 1) * bs]), None))
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out


def cdiv(a, b):
    return -(-a // b)


# --- the hit rule ------------------------------------------------------------------------------
class Residency:
    def __init__(self):
        self.copies = Counter()  # (hash, group) -> copies
        self.groups = {}  # group -> (kind, window, block size)
        self.anomalies = []

    def apply(self, seq, events):
        for e in events:
            kind = e["type"]
            if kind == "BlockStored":
                g = e.get("group_idx")
                self.groups.setdefault(g, (e.get("kv_cache_spec_kind"),
                                           e.get("kv_cache_spec_sliding_window"),
                                           e["block_size"]))
                for h in e["block_hashes"]:
                    self.copies[(h, g)] += 1
            elif kind == "BlockRemoved":
                g = e.get("group_idx")
                for h in e["block_hashes"]:
                    if self.copies[(h, g)] <= 0:
                        self.anomalies.append(f"seq {seq}: BlockRemoved of {h:#x} group {g} "
                                              "that holds no copy")
                        continue
                    self.copies[(h, g)] -= 1
                    if self.copies[(h, g)] == 0:
                        del self.copies[(h, g)]
            elif kind == "AllBlocksCleared":
                self.copies.clear()

    def cached(self, h, group_ids):
        return all(self.copies.get((h, g), 0) > 0 for g in group_ids)

    def spec_groups(self):
        """[(kind, window, bs, [group ids])], full attention first (a stable sort)."""
        merged = {}
        for g in sorted(self.groups):
            kind, window, bs = self.groups[g]
            merged.setdefault((kind, window, bs), []).append(g)
        out = [(k, w, bs, ids) for (k, w, bs), ids in merged.items()]
        out.sort(key=lambda s: s[0] not in FULL_KINDS)
        return out

    def hit(self, hashes, max_len, trace=None, rule="vllm"):
        """vLLM's hit length in tokens for a prompt with these block hashes; other rules, for
        comparison: "union" (any group's copy counts, contiguous from block 0: a reader that
        ignores group_idx), "full-only" (the full-attention groups alone) and "every-group"
        (every group must hold each block from block 0)."""
        specs = self.spec_groups()
        if not specs:
            return 0
        if rule != "vllm":
            bs = specs[0][2]
            if rule == "union":
                test = lambda h: any(self.copies.get((h, g), 0) > 0 for g in self.groups)
            elif rule == "full-only":
                full = [g for k, _, _, ids in specs if k in FULL_KINDS for g in ids]
                test = lambda h: bool(full) and self.cached(h, full)
            else:
                test = lambda h: self.cached(h, list(self.groups))
            n = 0
            while n < min(max_len // bs, len(hashes)) and test(hashes[n]):
                n += 1
            return n * bs
        simple = len(specs) == 2 and specs[0][0] in FULL_KINDS
        length = max_len
        full_hit = {}
        while True:
            cur = length
            for kind, window, bs, ids in specs:
                if kind in FULL_KINDS:
                    if (kind, window) not in full_hit:
                        n = 0
                        while n < min(cur // bs, len(hashes)) and self.cached(hashes[n], ids):
                            n += 1
                        full_hit[(kind, window)] = n * bs
                    cur = min(cur, full_hit[(kind, window)])
                elif kind in SLIDING_KINDS:
                    cur = self.sliding_hit(hashes, cur, window, bs, ids)
                else:
                    raise NotImplementedError(f"no rule for kind {kind}")
                if trace is not None:
                    trace.append((kind, window, ids, cur))
            if cur >= length:
                break
            length = cur
            if simple:
                break
        return length

    def sliding_hit(self, hashes, max_len, window, bs, ids):
        need = cdiv(window - 1, bs)
        run = 0
        for i in range(min(max_len // bs, len(hashes)) - 1, -1, -1):
            if self.cached(hashes[i], ids):
                run += 1
                if run >= need:
                    return (i + run) * bs
            else:
                run = 0
        return run * bs  # the run that starts at block 0 (shorter than the window)


# --- one recording ------------------------------------------------------------------------------
def load(path):
    live = []
    with open(os.path.join(path, "live.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            payload = unpack(bytes.fromhex(row["payload_hex"]))
            live.append((int(row["seq_hex"], 16), [event_dict(e) for e in payload[1]]))
    with open(os.path.join(path, "requests.jsonl")) as f:
        requests = [json.loads(line) for line in f]
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    return meta, live, requests


RULES = ("vllm", "union", "full-only", "every-group")


def check(path, verbose=False):
    meta, live, requests = load(path)
    bs = meta.get("block_size", 32)
    name = meta.get("name", os.path.basename(path.rstrip("/")))
    res = Residency()
    by_seq = dict(live)
    applied = -1
    tally = Counter()
    lines = []
    for r in requests:
        while applied < r["seq_before"]:
            applied += 1
            res.apply(applied, by_seq.get(applied, []))
        tokens = r["prompt_token_ids"]
        hashes = block_hashes(tokens, bs)
        trace = []
        predicted = res.hit(hashes, len(tokens) - 1, trace)
        actual = r["cached_tokens"]
        for rule in RULES[1:]:
            tally[(rule, cmp(res.hit(hashes, len(tokens) - 1, rule=rule), actual))] += 1
        verdict = "exact" if predicted == actual else ("over" if predicted > actual else "under")
        tally[verdict] += 1
        detail = " ".join(f"{k}{'' if w is None else '/' + str(w)}{ids}->{c}"
                          for k, w, ids, c in trace)
        line = (f"{name} req {r['n']:3} conv {r['conv']:2} turn {r['turn']} prompt "
                f"{len(tokens):4} vllm {actual:4} model {predicted:4} {verdict:5} [{detail}]")
        if verdict != "exact":
            line += " " + explain(res, hashes, r, actual, predicted, bs, live)
        lines.append(line)
        if verbose or verdict != "exact":
            print(line)
    while applied < len(live) - 1:
        applied += 1
        res.apply(applied, by_seq.get(applied, []))
    facts = stream_facts(live, requests, bs, res)
    others = {rule: {v: tally[(rule, v)] for v in ("exact", "under", "over")}
              for rule in RULES[1:]}
    summary = dict(name=name, requests=len(requests), exact=tally["exact"],
                   under=tally["under"], over=tally["over"], other_rules=others,
                   anomalies=res.anomalies[:20], facts=facts)
    return summary, lines


def cmp(predicted, actual):
    return "exact" if predicted == actual else ("over" if predicted > actual else "under")


def explain(res, hashes, r, actual, predicted, bs, live):
    """Which blocks each group holds, as a map of the prompt's blocks ('#' cached, '.' not)."""
    out = []
    for kind, window, _, ids in res.spec_groups():
        marks = "".join("#" if res.cached(h, ids) else "." for h in hashes)
        out.append(f"{kind}{'' if window is None else '/' + str(window)}: {marks}")
    after = [s for s in range(r["seqs"][0], r["seqs"][1] + 1)] if r["seqs"] else []
    return f"(blocks at send time: {'; '.join(out)}; its batches {after})"


def stream_facts(live, requests, bs, res):
    """What the event stream shows about group order, duplicates and removals."""
    # Every hash a request's prompt+completion could produce -> (request, block index).
    where = {}
    for r in requests:
        toks = r["prompt_token_ids"] + (r.get("completion_token_ids") or [])
        for k, h in enumerate(block_hashes(toks, bs)):
            where.setdefault(h, k)
    facts = Counter()
    store_orders = Counter()
    removal_sizes = Counter()
    sliding_shapes = Counter()
    dup_live = Counter()
    resident = Counter()
    unknown = 0
    for seq, events in live:
        order = []
        seen_removed_after_store = False
        for e in events:
            t = e["type"]
            if t == "BlockStored":
                g = e.get("group_idx")
                order.append(f"S{g}")
                n_blocks = len(e["token_ids"]) // e["block_size"]
                facts[f"stores group {g}"] += 1
                if not e["block_hashes"]:
                    facts[f"stores group {g} with no hash"] += 1
                if len(e["block_hashes"]) < n_blocks:
                    facts[f"stores group {g} with fewer hashes than token blocks"] += 1
                # Where the hashes sit in the token range (block offsets from the range start).
                start = None
                if e["parent_block_hash"] is None:
                    start = 0
                elif e["parent_block_hash"] in where:
                    start = where[e["parent_block_hash"]] + 1
                if start is not None:
                    pos = []
                    for h in e["block_hashes"]:
                        if h in where:
                            pos.append(where[h] - start)
                        else:
                            unknown += 1
                    if e.get("kv_cache_spec_kind") in SLIDING_KINDS:
                        shape = "".join("#" if i in pos else "." for i in range(n_blocks))
                        sliding_shapes[shape] += 1
                else:
                    facts[f"stores group {g} whose parent is not a known block"] += 1
                for h in e["block_hashes"]:
                    if resident[(h, g)] > 0:
                        dup_live[g] += 1
                    resident[(h, g)] += 1
            elif t == "BlockRemoved":
                g = e.get("group_idx")
                order.append(f"R{g}")
                removal_sizes[(len(e["block_hashes"]), g)] += 1
                for h in e["block_hashes"]:
                    resident[(h, g)] -= 1
                if any(o.startswith("S") for o in order[:-1]):
                    seen_removed_after_store = True
            else:
                order.append(t)
        if seen_removed_after_store:
            facts["batches with a removal after a store"] += 1
        # Compress: S0 S1 R1 R0 ... -> the distinct pattern of kinds in order.
        compact = []
        for o in order:
            if not compact or compact[-1] != o:
                compact.append(o)
        store_orders[" ".join(compact)] += 1
    return dict(
        counts=dict(facts),
        batch_shapes=dict(store_orders.most_common(12)),
        removals_by_size_and_group={f"{n} hash(es), group {g}": c
                                    for (n, g), c in sorted(removal_sizes.items())},
        stores_of_a_hash_the_group_already_held=dict(dup_live),
        sliding_hash_positions_in_range=dict(sliding_shapes.most_common(15)),
        stored_hashes_not_from_any_request=unknown,
    )


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = sorted(glob.glob(os.path.join(here, "..", "tests", "fixtures", "vllm-hybrid", "*",
                                            "live.jsonl")))
    p = argparse.ArgumentParser()
    p.add_argument("dirs", nargs="*", default=[os.path.dirname(d) for d in default])
    p.add_argument("--verbose", action="store_true", help="print every request")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = p.parse_args()
    summaries = []
    for d in args.dirs:
        summary, _ = check(d, args.verbose)
        summaries.append(summary)
        print(f"{summary['name']}: {summary['requests']} requests, {summary['exact']} exact, "
              f"{summary['under']} under, {summary['over']} over"
              + "".join(f"; rule {rule}: {t['exact']} exact, {t['under']} under, "
                        f"{t['over']} over" for rule, t in summary["other_rules"].items()))
        if args.json:
            print(json.dumps(summary, indent=1))
    bad = sum(s["under"] + s["over"] for s in summaries)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
