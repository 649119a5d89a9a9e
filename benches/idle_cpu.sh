#!/usr/bin/env bash
# Idle CPU, as CPU time over 10 s read from /proc/PID/stat. Bounded: about 15 s per run.
#   bash benches/idle_cpu.sh kvdir [path/to/kvdir]      kvdir following 128 static streams whose
#                                                      publishers are absent (all disconnected)
#   bash benches/idle_cpu.sh sim [path/to/kvdir-sim]    32 simulated engines x 4 DP ranks, no load
set -euo pipefail
MODE=${1:-kvdir}
DIR=$(mktemp -d)
case "$MODE" in
kvdir)
    BIN=${2:-target/release/kvdir}
    python3 - "$DIR/idle.json" <<'PY'
import json, sys
streams = [{"instance_name": f"idle-{i}", "dp_rank": r, "block_size": 16,
            "endpoint": f"tcp://127.0.0.1:{20000 + 2 * i + r}",
            "replay_endpoint": f"tcp://127.0.0.1:{40000 + 2 * i + r}", "topic": "xllm-kv"}
           for i in range(64) for r in range(2)]
json.dump({"streams": streams}, open(sys.argv[1], "w"))
PY
    "$BIN" --kv_events_config_file="$DIR/idle.json" --http_server_port=0 >/dev/null 2>&1 &
    WHAT="kvdir, 128 disconnected streams" ;;
sim)
    BIN=${2:-target/release/kvdir-sim}
    "$BIN" --engines 32 --dp_size 4 --rate 0 --event_port 0 --replay_port 0 --duration_s 20 \
        >/dev/null 2>&1 &
    WHAT="kvdir-sim, 32 engines x 4 ranks, idle" ;;
*) echo "usage: $0 kvdir|sim [binary]" >&2; exit 2 ;;
esac
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
sleep 3 # let everything start
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)
A=$(ticks); sleep 10; B=$(ticks)
echo "$WHAT: $(( (B - A) * 1000 / HZ )) ms of CPU in 10 s"
