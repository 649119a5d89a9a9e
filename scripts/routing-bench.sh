#!/usr/bin/env bash
# Routing quality per trace and load (BENCHMARKS.md, "Routing quality"): `kvdir-bench replay`
# of each trace at four prefill costs (idle, ~50 % busy, ~80 %, past saturation), every policy
# of a trace-load in one run, on 8 simulated engines of 2,048 blocks. Not part of .ci/run.
#
#   bash scripts/routing-bench.sh [--out DIR] [--requests N] [--speed S] [--policies LIST]
#                                 [--repeat N] [TRACE[:COSTS]]...
#
#   TRACE      conversation, synthetic (sim/data/mooncake), agent (sim/data/agent), bfcl
#              (sim/data/bfcl, held out) [default: all four]; :COSTS overrides its
#              --prefill_us_per_token list, e.g. agent:500,2000
#   --out DIR  keep every run's JSON there [default: a temporary directory]
#   --requests N  [default per trace: conversation 3000, synthetic 2000, agent 3704 (all),
#              bfcl 4000]; --speed S [default 30]
#   --policies LIST  [default TTFT,CAR@0.5,CAR@0.8,RR]
#   --repeat N  replay each trace-load N times [default 1] and end with a table of each policy's
#              mean and range (min-max) over the N runs. The replay has no seed: the trace and
#              the simulated engines are deterministic, and runs differ because kvdir sees the
#              engines' events and load reports in wall time (what arrived before a decision).
#   -- ARGS    passed to every replay (e.g. --routers 2)
#   env KVDIR_BENCH_ETCD  an etcd to use (host:port) instead of starting one on 127.0.0.1:23979
#
# It builds the release binaries, starts etcd (own data directory, removed at exit) unless
# given one, replays each trace-load, and prints one table per trace: for each policy the hit
# share as % of the per-engine LRU bound, TTFT p50/p99 in seconds and the imbalance, with the
# busy share (mean over engines) of the first policy and `uptime`'s load when it started.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A FILE=(
  [conversation]=sim/data/mooncake/conversation_trace.jsonl
  [synthetic]=sim/data/mooncake/synthetic_trace.jsonl
  [agent]=sim/data/agent/agent_trace.jsonl
  [bfcl]=sim/data/bfcl/bfcl_trace.jsonl
)
declare -A COSTS=(
  [conversation]=20,120,200,300
  [synthetic]=20,120,200,300
  [agent]=80,500,800,1300
  [bfcl]=200,1500,2400,3400
)
declare -A COUNT=([conversation]=3000 [synthetic]=2000 [agent]=3704 [bfcl]=4000)
OUT="" REQUESTS="" REPEAT=1 SPEED=30 POLICIES=TTFT,CAR@0.5,CAR@0.8,RR TRACES=() EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --speed) SPEED=$2; shift 2 ;;
    --policies) POLICIES=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    *) TRACES+=("$1"); shift ;;
  esac
done
[ ${#TRACES[@]} -gt 0 ] || TRACES=(conversation synthetic agent bfcl)
if [ -z "$OUT" ]; then OUT=$(mktemp -d); fi
mkdir -p "$OUT"

T=${CARGO_TARGET_DIR:-target}/release
nice cargo build --release -q -p kvdir-service -p kvdir-bench

ETCD=${KVDIR_BENCH_ETCD:-}
if [ -z "$ETCD" ]; then
  ETCD=127.0.0.1:23979
  DATA=$(mktemp -d)
  etcd --data-dir "$DATA" --listen-client-urls "http://$ETCD" --advertise-client-urls "http://$ETCD" \
    --listen-peer-urls http://127.0.0.1:39979 >"$OUT/etcd.log" 2>&1 &
  ETCD_PID=$!
  trap 'kill $ETCD_PID 2>/dev/null; wait $ETCD_PID 2>/dev/null; rm -rf "$DATA"' EXIT
  for _ in $(seq 100); do
    curl -sf "http://$ETCD/health" >/dev/null && break
    sleep 0.1
  done
fi

for spec in "${TRACES[@]}"; do
  name=${spec%%:*}
  [ -n "${FILE[$name]:-}" ] || { echo "unknown trace $name: one of ${!FILE[*]}" >&2; exit 2; }
  costs=${COSTS[$name]}
  [ "$spec" = "$name" ] || costs=${spec#*:}
  for cost in ${costs//,/ }; do
  for rep in $(seq "$REPEAT"); do
    json="$OUT/$name-$cost.json"
    [ "$REPEAT" = 1 ] || json="$OUT/$name-$cost-$rep.json"
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$T/kvdir-bench" replay --etcd_addr "$ETCD" --spawn_kvdir "$T/kvdir" --json \
      --trace "${FILE[$name]}" --requests "${REQUESTS:-${COUNT[$name]}}" --speed "$SPEED" \
      --policies "$POLICIES" --prefill_us_per_token "$cost" "${EXTRA[@]}" >"$json"
    python3 - "$json" "$name" "$cost" "$load" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
runs = r["runs"]
cells = []
for run in runs:
    t = run["ttft_ms"]
    cells.append("%s %.0f %.3g/%.3g %.2f" % (run["label"], 100 * run["share_of_per_engine_bound"],
                 t["p50"] / 1000, t["p99"] / 1000, run["imbalance"]))
busy = runs[0]["busy_share"]["mean"] * 100
print("| %s %s (%.0f %%, load %s) | %s |" % (sys.argv[2], sys.argv[3], busy, sys.argv[4],
      " | ".join(cells)), flush=True)
PY
  done
  done
done
[ "$REPEAT" = 1 ] || python3 - "$OUT" "$REPEAT" "${TRACES[@]}" <<'PY'
import glob, json, re, sys
out, n = sys.argv[1], int(sys.argv[2])
names = [t.split(":")[0] for t in sys.argv[3:]]
def cost(path):
    return int(re.search(r"-(\d+)-\d+\.json$", path).group(1))
print("mean (min-max) over %d runs: hit %% of the per-engine bound, TTFT p50/p99/mean s, imbalance" % n)
for name in names:
    for c in sorted({cost(p) for p in glob.glob("%s/%s-*-*.json" % (out, name))}):
        reps = [json.load(open(p))["runs"] for p in sorted(glob.glob("%s/%s-%d-*.json" % (out, name, c)))]
        cells = []
        for i, run in enumerate(reps[0]):
            xs = [r[i] for r in reps]
            def agg(f, fmt="%.3g"):
                v = [f(x) for x in xs]
                return (fmt + " (" + fmt + "-" + fmt + ")") % (sum(v) / len(v), min(v), max(v))
            cells.append("%s hit %s p50 %s p99 %s mean %s imb %s" % (run["label"],
                agg(lambda x: 100 * x["share_of_per_engine_bound"], "%.0f"),
                agg(lambda x: x["ttft_ms"]["p50"] / 1000), agg(lambda x: x["ttft_ms"]["p99"] / 1000),
                agg(lambda x: x["ttft_ms"]["mean"] / 1000),
                agg(lambda x: x["imbalance"], "%.2f")))
        print("| %s %d (%d runs) | %s |" % (name, c, len(reps), " | ".join(cells)))
PY
echo "JSON: $OUT"
