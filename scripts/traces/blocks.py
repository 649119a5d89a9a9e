"""Turns prompts into Mooncake-format trace lines (the format of sim/data/mooncake).

A prompt is a list of segments `(key, tokens)`: `key` names the segment's content (two
segments with the same key hold the same tokens), `tokens` is its length. The prompt's token
stream is the segments one after another, cut into 512-token blocks. Block i's id is a chained
hash of block i-1's id and the pieces of segments that block i covers, so two prompts share
block i's id exactly when their first 512 * (i + 1) tokens are the same segments: a shared
prefix gives shared ids, as an engine's prefix cache sees it. Ids are numbered in order of
first appearance. The last block may be partial; the replay never shares a partial block.

Only the standard library: the traces are reproducible offline.
"""

import hashlib
import json

BLOCK = 512


class BlockIds:
    """Numbers block digests in order of first appearance."""

    def __init__(self):
        self.ids = {}

    def hash_ids(self, segments):
        """The ids of the prompt's blocks and its length in tokens."""
        pieces, ids, filled, total = [], [], 0, 0
        previous = b""
        for key, tokens in segments:
            offset = 0
            while offset < tokens:
                take = min(tokens - offset, BLOCK - filled)
                pieces.append(f"{key}:{offset}:{take}")
                offset += take
                filled += take
                total += take
                if filled == BLOCK:
                    previous = self._block(previous, pieces, ids)
                    pieces, filled = [], 0
        if filled:
            self._block(previous, pieces, ids)
        return ids, total

    def _block(self, previous, pieces, ids):
        digest = hashlib.sha1(previous + "|".join(pieces).encode()).digest()
        ids.append(self.ids.setdefault(digest, len(self.ids)))
        return digest


def write(path, requests):
    """Writes `requests`, dicts with `timestamp` (ms), `segments` and `output_length`, sorted
    by time (ties in the given order), as JSONL; returns the lines' count and input tokens."""
    numbering = BlockIds()
    ordered = sorted(enumerate(requests), key=lambda r: (r[1]["timestamp"], r[0]))
    tokens = 0
    with open(path, "w") as f:
        for _, r in ordered:
            ids, length = numbering.hash_ids(r["segments"])
            tokens += length
            line = {
                "timestamp": int(r["timestamp"]),
                "input_length": length,
                "output_length": int(r["output_length"]),
                "hash_ids": ids,
            }
            f.write(json.dumps(line, separators=(", ", ": ")) + "\n")
    return len(ordered), tokens


def lognormal(rng, median, sigma, low, high):
    """A whole number drawn from a log-normal of this median and sigma, clamped."""
    return int(min(high, max(low, round(rng.lognormvariate(0, sigma) * median))))
