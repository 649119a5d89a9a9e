"""Generates sim/data/agent/agent_trace.jsonl: coding-agent sessions, a tool-calling loop on
long shared prompts with a growing context (rules in sim/data/agent/README.md).

    python3 scripts/traces/agent.py [--out sim/data/agent/agent_trace.jsonl] [--seed 34]

Pure generation with a fixed seed and the standard library: the same file every time.
"""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blocks import lognormal, write  # noqa: E402

KINDS = [(3000, 0.4), (6000, 0.3), (9000, 0.2), (14000, 0.1)]  # system tokens, share
REPOS = 48
SESSIONS = 300
SESSION_RATE = 0.4  # sessions per second, Poisson
COMPACT_AT = 40_000  # tokens: the context is summarized beyond this
MEAN_STEPS = 14
MAX_STEPS = 60
DECODE_MS_PER_TOKEN = 20


def zipf_weights(n, s):
    return [1.0 / (k + 1) ** s for k in range(n)]


def session(rng, n, start_ms, repo_tokens):
    """The requests of session n, which starts at start_ms."""
    kind = rng.choices(range(len(KINDS)), weights=[w for _, w in KINDS])[0]
    repo = rng.choices(range(REPOS), weights=zipf_weights(REPOS, 1.1))[0]
    head = [
        (f"system{kind}", KINDS[kind][0]),
        (f"repo{repo}", repo_tokens[repo]),
        (f"task{n}", lognormal(rng, 300, 0.8, 50, 3000)),
    ]
    history, requests, now = [], [], start_ms
    steps = min(MAX_STEPS, 1 + int(rng.expovariate(1.0 / (MEAN_STEPS - 1))))
    for step in range(steps):
        action = lognormal(rng, 120, 0.8, 10, 1500)
        requests.append({"timestamp": now, "segments": head + history, "output_length": action})
        observation = lognormal(rng, 350, 1.1, 20, 8000)
        history = history + [(f"s{n}a{step}", action), (f"s{n}o{step}", observation)]
        if sum(t for _, t in head + history) > COMPACT_AT:
            history = [(f"s{n}summary{step}", lognormal(rng, 1500, 0.3, 500, 4000))]
        tool_ms = lognormal(rng, 800, 1.0, 50, 30_000)
        now += action * DECODE_MS_PER_TOKEN + tool_ms
    return requests


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "sim", "data", "agent", "agent_trace.jsonl")
    parser.add_argument("--out", default=os.path.normpath(default))
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    repo_tokens = [lognormal(rng, 2500, 0.6, 500, 10_000) for _ in range(REPOS)]
    requests, start = [], 0.0
    for n in range(SESSIONS):
        start += rng.expovariate(SESSION_RATE) * 1000
        requests.extend(session(rng, n, int(start), repo_tokens))
    count, tokens = write(args.out, requests)
    print(f"{args.out}: {count} requests, {tokens} input tokens")


if __name__ == "__main__":
    main()
