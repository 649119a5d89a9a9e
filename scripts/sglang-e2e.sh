#!/usr/bin/env bash
# kvdir against two real SGLang servers on one CPU machine (not part of .ci/run: the first run
# installs about 6.5 GB and takes about 10 minutes; later runs take a few minutes).
#
#   bash scripts/sglang-e2e.sh [--venv DIR] [--requests N] [--keep-logs DIR] [--record]
#
#   --venv DIR        SGLang venv, made by scripts/sglang-install.sh when absent
#                     [env KVDIR_SGLANG_VENV, default ~/.cache/kvdir/sglang-venv]
#   --requests N      chat requests sent through kvdir, at least 300 [env KVDIR_E2E_REQUESTS]
#   --keep-logs DIR   keep the model, configs and every process's log in DIR
#                     [env KVDIR_E2E_LOGS; default a temporary directory, removed at exit]
#   --record          instead of kvdir, record one engine's live and replay frames, its
#                     /server_info and a /metrics sample into tests/fixtures/sglang
#                     (scripts/sglang_record.py)
#   env KVDIR_BIN     a kvdir binary to run instead of building target/release/kvdir
#
# It makes a tiny model (scripts/vllm_make_model.py), starts two SGLang servers on SGLang's CPU
# engine with KV events and replay (ports 8200/8201, events 18200/18201, replay 28200/28201,
# page size 16, one core each), starts kvdir after them with both engines listed (dialect
# sglang, block_size 16, no etcd) and the model's tokenizer, and runs scripts/sglang_e2e.py:
# chat traffic through kvdir's front door, compared request by request with SGLang's own
# cached_tokens, with a restart of one engine, a stall of the other (its HTTP process stopped
# for 3.5 s, then its scheduler for 1.5 s) and a /flush_cache. Before the traffic it checks
# kvdir's tokenizer parity with each engine (issue 32), then starts a second kvdir (port 8893,
# the same config) with a deliberately wrong --chat_template and checks that it reports the
# difference (engine.parity, a WARN naming the position, kvdir_engine_parity_mismatch 1), and
# stops it. It ends with `N passed, M failed`
# and exits 0 only when M is 0. Every server binds 127.0.0.1 (SGLang's `"bind": true` makes its
# PUB bind a concrete address). Every process it starts is stopped at exit.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KVDIR_SGLANG_VENV:-$HOME/.cache/kvdir/sglang-venv}
REQUESTS=${KVDIR_E2E_REQUESTS:-320}
LOGS=${KVDIR_E2E_LOGS:-}
RECORD=0
KVDIR_PORT=8891
WRONG_PORT=8893  # the parity step's second kvdir, with a wrong chat template
ENGINES=(0 1)
PAGE=16

while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --keep-logs) LOGS=$2; shift 2 ;;
        --record) RECORD=1; ENGINES=(0); shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

KEEP=1
if [ -z "$LOGS" ]; then
    LOGS=$(mktemp -d /tmp/kvdir-sglang-e2e.XXXXXX)
    KEEP=0
fi
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)

# Engines run in their own process groups (SGLang forks a scheduler and a detokenizer); their
# launchers write the group's id to engine-N.pid, so the driver can restart one and this trap
# still stops it.
cleanup() {
    local status=$? i pid
    set +e
    # kvdir.sh writes kvdir's pid to kvdir.pid; the driver restarts kvdir through it.
    pid=$(cat "$LOGS/kvdir.pid" 2>/dev/null)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    pid=$(cat "$LOGS/kvdir-wrong.pid" 2>/dev/null)  # the parity step's, if still running
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    for i in "${ENGINES[@]}"; do
        pid=$(cat "$LOGS/engine-$i.pid" 2>/dev/null)
        if [ -n "$pid" ]; then
            kill -CONT -- "-$pid" 2>/dev/null  # a stall step may have stopped one of them
            kill -KILL -- "-$pid" 2>/dev/null
        fi
    done
    if [ "$KEEP" = 1 ]; then
        echo "logs kept in $LOGS"
    else
        rm -rf "$LOGS"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$ROOT/scripts/sglang-install.sh" "$VENV"
PY="$VENV/bin/python"
"$PY" "$ROOT/scripts/vllm_make_model.py" "$LOGS/model" >"$LOGS/make-model.log" 2>&1 \
    || { cat "$LOGS/make-model.log"; exit 1; }

# engine-N.sh starts SGLang number N in the foreground; run it with setsid.
write_launcher() {
    local i=$1 events
    events="{\"publisher\": \"zmq\", \"topic\": \"kv\", \"bind\": true,"
    events+=" \"endpoint\": \"tcp://127.0.0.1:$((18200 + i))\","
    events+=" \"replay_endpoint\": \"tcp://127.0.0.1:$((28200 + i))\"}"
    cat >"$LOGS/engine-$i.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/engine-$i.pid"
export SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1
export SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec taskset -c $i "$VENV/bin/python" -m sglang.launch_server --model-path "$LOGS/model" \\
    --host 127.0.0.1 --port $((8200 + i)) --served-model-name model \\
    --device cpu --attention-backend torch_native --page-size $PAGE \\
    --max-total-tokens 4096 --max-running-requests 8 --context-length 2048 \\
    --enable-metrics --enable-cache-report --skip-server-warmup \\
    --kv-events-config '$events' \\
    >>"$LOGS/engine-$i.log" 2>&1
EOF
}

# Waits for SGLang number $1 to answer /health and /v1/models; fails when its process ends first.
wait_engine() {
    local i=$1 url="http://127.0.0.1:$((8200 + $1))" deadline=$((SECONDS + 600)) pid
    until curl -fsS -o /dev/null "$url/health" 2>/dev/null \
        && curl -fsS -o /dev/null "$url/v1/models" 2>/dev/null; do
        pid=$(cat "$LOGS/engine-$i.pid" 2>/dev/null || true)
        if [ $SECONDS -ge $deadline ] || { [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; }; then
            echo "SGLang $i did not answer $url/health; the end of its log:" >&2
            tail -30 "$LOGS/engine-$i.log" >&2
            return 1
        fi
        sleep 1
    done
}

# Every port this run binds must be free (all below the kernel's ephemeral range).
for port in "$KVDIR_PORT" "$WRONG_PORT" 8200 8201 18200 18201 28200 28201; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what listens there" >&2
        exit 1
    fi
done

for i in "${ENGINES[@]}"; do
    write_launcher "$i"
    setsid bash "$LOGS/engine-$i.sh" &
    disown  # the driver may kill and restart it; cleanup() stops it by its pid file
done
for i in "${ENGINES[@]}"; do
    wait_engine "$i" || exit 1
    echo "SGLang $i ready on http://127.0.0.1:$((8200 + i))"
done

if [ "$RECORD" = 1 ]; then
    "$PY" "$ROOT/scripts/sglang_record.py" --out "$ROOT/tests/fixtures/sglang" \
        --engine http://127.0.0.1:8200 --events tcp://127.0.0.1:18200 \
        --replay tcp://127.0.0.1:28200 --topic kv --page "$PAGE" \
        --launcher "$LOGS/engine-0.sh"
    exit 0
fi

# kvdir's config: the engines it fronts (no etcd); block_size is SGLang's page size.
{
    echo '{"engines": ['
    sep=""
    for i in "${ENGINES[@]}"; do
        port=$((8200 + i))
        printf '%s  {"name": "127.0.0.1:%d", "url": "http://127.0.0.1:%d", "dialect": "sglang",' \
            "$sep" "$port" "$port"
        printf ' "events": "tcp://127.0.0.1:%d", "replay": "tcp://127.0.0.1:%d",' \
            $((18200 + i)) $((28200 + i))
        printf ' "dp_size": 1, "block_size": %d, "model": "model", "topic": "kv"}\n' "$PAGE"
        sep=","
    done
    echo '], "engine_poll_interval_ms": 500}'
} >"$LOGS/kvdir.json"

if [ -z "${KVDIR_BIN:-}" ]; then
    echo "building kvdir"
    (cd "$ROOT" && cargo build --release --quiet -p kvdir-service)
    KVDIR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/kvdir
fi
cat >"$LOGS/kvdir.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/kvdir.pid"
exec "$KVDIR_BIN" --kv_events_config_file "$LOGS/kvdir.json" --server_host 127.0.0.1 \\
    --http_server_port $KVDIR_PORT --etcd_addr '' --tokenizer_path "$LOGS/model" \\
    --served_model_name model >>"$LOGS/kvdir.log" 2>&1
EOF
# The parity step's kvdir: the same config, a deliberately wrong chat template (the roles
# without the model's markers; scripts/e2e_parity.py's WRONG_TEMPLATE). The driver starts and
# stops it.
"$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import e2e_parity; print(e2e_parity.WRONG_TEMPLATE, end="")' \
    "$ROOT/scripts" >"$LOGS/wrong-template.jinja"
cat >"$LOGS/kvdir-wrong.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/kvdir-wrong.pid"
exec "$KVDIR_BIN" --kv_events_config_file "$LOGS/kvdir.json" --server_host 127.0.0.1 \\
    --http_server_port $WRONG_PORT --etcd_addr '' --tokenizer_path "$LOGS/model" \\
    --chat_template "$LOGS/wrong-template.jinja" --served_model_name model \\
    >>"$LOGS/kvdir-wrong.log" 2>&1
EOF
bash "$LOGS/kvdir.sh" &
KVDIR_PID=$!
KVDIR_STARTED=$(date +%s.%N)
# The driver reports its own failure when kvdir does not come up, so the figures still print.
"$PY" "$ROOT/scripts/sglang_e2e.py" --kvdir "http://127.0.0.1:$KVDIR_PORT" \
    --kvdir-started "$KVDIR_STARTED" --kvdir-pid "$KVDIR_PID" --kvdir-log "$LOGS/kvdir.log" \
    --kvdir-launcher "$LOGS/kvdir.sh" --model "$LOGS/model" --page "$PAGE" \
    --engine "127.0.0.1:8200,http://127.0.0.1:8200,tcp://127.0.0.1:18200,$LOGS/engine-0.sh" \
    --engine "127.0.0.1:8201,http://127.0.0.1:8201,tcp://127.0.0.1:18201,$LOGS/engine-1.sh" \
    --requests "$REQUESTS" --wrong-template-launcher "$LOGS/kvdir-wrong.sh" \
    --wrong-template-url "http://127.0.0.1:$WRONG_PORT" --wrong-template-log "$LOGS/kvdir-wrong.log"
