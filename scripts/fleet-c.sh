#!/usr/bin/env bash
# Fleet run C (BENCHMARKS.md, "Fleet scale"): kvdir connects to 4,096 streams it discovers in
# etcd, from two kvdir-bench tools of 512 engines x 4 DP ranks each, loaded at once (2,500
# batches/s each, 30 s), then idle 40 s. Prints each tool's report lines on faults, CPU per
# batch, idle CPU and descriptors, and kvdir's false restarts. Not part of .ci/run.
#
#   bash scripts/fleet-c.sh [--heartbeat_ms 0]     (C0: no heartbeats; other flags go to both tools)
#
# Per batch as BENCHMARKS.md counts it: kvdir's CPU (the larger of the two tools' figures)
# over both tools' applied batches. Every port is below 32768 (Linux's ephemeral range starts
# there): etcd 29379/29380, kvdir 29888, engines' HTTP from 10000 and 12100, event ports
# +5000, replay ports +14000. It builds the release binaries unless KVDIR_BIN_DIR names them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KVDIR_BIN_DIR:-}" ]; then
  cargo build --release --quiet -p kvdir-service -p kvdir-bench
  KVDIR_BIN_DIR=${CARGO_TARGET_DIR:-target}/release
fi
T=$KVDIR_BIN_DIR
for port in 29379 29380 29888; do
  if ss -Hltn "sport = :$port" | grep -q .; then
    echo "port $port on 127.0.0.1 is already in use; stop what listens there" >&2; exit 1
  fi
done
OUT=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$OUT"' EXIT
cat >"$OUT/kvdir.json" <<JSON
{"max_streams": 4096, "discovery": {"enabled": true, "block_size": 128, "topic": "xllm-kv",
 "event_port_offset": 5000, "replay_port_offset": 14000, "refresh_interval_ms": 1000}}
JSON
etcd --data-dir "$OUT/etcd" --listen-client-urls http://127.0.0.1:29379 \
  --advertise-client-urls http://127.0.0.1:29379 --listen-peer-urls http://127.0.0.1:29380 \
  >"$OUT/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -fsS http://127.0.0.1:29379/health >/dev/null 2>&1 && break; sleep 0.1; done
"$T/kvdir" --etcd_addr 127.0.0.1:29379 --http_max_connections=1024 --server_host=127.0.0.1 \
  --http_server_port=29888 --kv_events_config_file="$OUT/kvdir.json" >"$OUT/kvdir.log" 2>&1 &
KVDIR=$!
PIDS+=("$KVDIR")
TOOLS=()
for i in 0 1; do
  "$T/kvdir-bench" --etcd_addr 127.0.0.1:29379 --kvdir_addr 127.0.0.1:29888 --kvdir_pid "$KVDIR" \
    --engines 512 --dp_size 4 --rate 2500 --duration_seconds 30 --idle_seconds 40 \
    --route_clients 0 --http_port $((10000 + i * 2100)) --event_port_offset 5000 \
    --replay_port_offset 14000 "$@" >"$OUT/tool$i.out" 2>&1 &
  TOOLS+=($!)
done
STATUS=0
for t in "${TOOLS[@]}"; do wait "$t" || STATUS=1; done
for i in 0 1; do
  echo "== tool $i"
  grep -E '^(applied by|streams report|kvdir CPU|kvdir idle|kvdir file|WARNING)|cannot' \
    "$OUT/tool$i.out" || tail -n 5 "$OUT/tool$i.out"
done
echo "== kvdir: $(grep -c 'publisher restarted' "$OUT/kvdir.log" || true) publisher restarts logged"
exit $STATUS
