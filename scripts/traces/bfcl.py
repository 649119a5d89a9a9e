"""Builds sim/data/bfcl/bfcl_trace.jsonl from the multi-turn function-calling data that the
`bfcl-eval` package (the Berkeley Function Calling Leaderboard, Apache-2.0) ships on PyPI:
every entry of its four multi-turn categories is one agent session (rules in
sim/data/bfcl/README.md).

    pip download --no-deps -d /tmp bfcl-eval==2026.3.23
    python3 scripts/traces/bfcl.py --wheel /tmp/bfcl_eval-2026.3.23-py3-none-any.whl

Offline, standard library only: the wheel is read as a zip file; no text leaves it, only
lengths and block ids. A fixed seed draws what the data set does not hold (tool results'
lengths, timing).
"""

import argparse
import hashlib
import json
import math
import os
import random
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blocks import lognormal, write  # noqa: E402

CATEGORIES = ["base", "long_context", "miss_func", "miss_param"]
DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
SESSION_RATE = 0.4  # sessions per second, Poisson
DECODE_MS_PER_TOKEN = 20
ADDED_FUNCTIONS = "I have updated some more functions you can choose from. What about now?"


def tokens(text):
    """Approximate tokens: one per 4 bytes of UTF-8, at least 1."""
    return max(1, math.ceil(len(text.encode()) / 4))


def content(text):
    """A segment keyed by its text: equal texts give equal blocks."""
    return ("t" + hashlib.sha1(text.encode()).hexdigest(), tokens(text))


def read_jsonl(wheel, name):
    with wheel.open(f"bfcl_eval/data/{name}") as f:
        return [json.loads(line) for line in f if line.strip()]


def system_prompt(wheel, entry):
    """The function docs of the entry's classes, its missed functions removed (BFCL adds
    those later as a user message), as the prompting mode puts them in the system prompt."""
    missed = {name for names in entry.get("missed_function", {}).values() for name in names}
    docs, held = [], {}
    for cls in entry["involved_classes"]:
        for doc in read_jsonl(wheel, f"multi_turn_func_doc/{DOCS[cls]}"):
            if doc["name"] in missed:
                held[doc["name"]] = doc
            else:
                docs.append(doc)
    return content("system: functions " + json.dumps(docs)), held


def session(rng, wheel, n, entry, answer, start_ms, long_context):
    """The requests of one entry: per turn, one request per ground-truth call (the model emits
    the call, the tool answers) and one for the final answer of the turn."""
    segments, held = system_prompt(wheel, entry)
    segments, requests, now = [segments], [], start_ms
    missed = entry.get("missed_function", {})
    for turn, (messages, calls) in enumerate(zip(entry["question"], answer["ground_truth"])):
        if str(turn) in missed:
            docs = [held[name] for name in missed[str(turn)]]
            messages = [{"role": "user", "content": ADDED_FUNCTIONS + json.dumps(docs)}]
        segments = segments + [content(json.dumps(m)) for m in messages]
        for k, call in enumerate(calls):
            out = tokens(call) + 10
            requests.append({"timestamp": now, "segments": segments, "output_length": out})
            result = (
                lognormal(rng, 1500, 0.6, 200, 8000)
                if long_context
                else lognormal(rng, 40, 0.8, 5, 1000)
            )
            segments = segments + [(f"s{n}c{turn}.{k}", out), (f"s{n}r{turn}.{k}", result)]
            now += out * DECODE_MS_PER_TOKEN + lognormal(rng, 200, 1.0, 10, 10_000)
        final = lognormal(rng, 60, 0.6, 10, 400)
        requests.append({"timestamp": now, "segments": segments, "output_length": final})
        segments = segments + [(f"s{n}f{turn}", final)]
        now += final * DECODE_MS_PER_TOKEN + lognormal(rng, 15_000, 0.8, 2_000, 120_000)
    return requests


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "sim", "data", "bfcl", "bfcl_trace.jsonl")
    parser.add_argument("--wheel", required=True, help="bfcl_eval-2026.3.23-py3-none-any.whl")
    parser.add_argument("--out", default=os.path.normpath(default))
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    entries = []
    with zipfile.ZipFile(args.wheel) as wheel:
        for cat in CATEGORIES:
            questions = read_jsonl(wheel, f"BFCL_v4_multi_turn_{cat}.json")
            answers = read_jsonl(wheel, f"possible_answer/BFCL_v4_multi_turn_{cat}.json")
            entries += [(q, a, cat == "long_context") for q, a in zip(questions, answers)]
        assert all(q["id"] == a["id"] for q, a, _ in entries), "questions and answers differ"
        rng.shuffle(entries)
        requests, start = [], 0.0
        for n, (entry, answer, long_context) in enumerate(entries):
            start += rng.expovariate(SESSION_RATE) * 1000
            requests += session(rng, wheel, n, entry, answer, int(start), long_context)
    count, total = write(args.out, requests)
    print(f"{args.out}: {count} requests from {len(entries)} entries, {total} input tokens")


if __name__ == "__main__":
    main()
