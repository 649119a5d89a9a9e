#!/usr/bin/env bash
# Idle CPU of kvdir following 128 static streams whose publishers are absent (every stream
# disconnected and retrying): CPU seconds the process uses over 10 s. Bounded: about 15 s.
# Usage: bash benches/idle_cpu.sh [path/to/kvdir]   (default target/release/kvdir)
set -euo pipefail
KVDIR=${1:-target/release/kvdir}
DIR=$(mktemp -d)
python3 - "$DIR/idle.json" <<'PY'
import json, sys
streams = [{"instance_name": f"idle-{i}", "dp_rank": r, "block_size": 16,
            "endpoint": f"tcp://127.0.0.1:{20000 + 2 * i + r}",
            "replay_endpoint": f"tcp://127.0.0.1:{40000 + 2 * i + r}", "topic": "xllm-kv"}
           for i in range(64) for r in range(2)]
json.dump({"streams": streams}, open(sys.argv[1], "w"))
PY
"$KVDIR" --kv_events_config_file="$DIR/idle.json" --http_server_port=0 >/dev/null 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
sleep 3 # let the 128 streams start
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)
A=$(ticks); sleep 10; B=$(ticks)
echo "kvdir, 128 disconnected streams: $(( (B - A) * 1000 / HZ )) ms of CPU in 10 s"
