#!/usr/bin/env bash
# Installs SGLang 0.5.23 into a venv on a CPU-only Debian machine (about 10 minutes and 6.5 GB
# the first time; a venv that already imports sglang is reused). Used by sglang-e2e.sh.
#
#   bash scripts/sglang-install.sh [VENV]   (default: $KVDIR_SGLANG_VENV or ~/.cache/kvdir/sglang-venv)
#
# SGLang pins torch==2.14.1; PyPI serves its CUDA build, which runs on CPU. SGLang's own wheel is
# installed without its pins, then its requirements from the wheel's METADATA less the GPU-only
# ones. Its CPU engine (SGLANG_USE_CPU_ENGINE=1) imports two ops from the CPU build of
# sgl_kernel, which PyPI does not serve: scripts/sglang_cpu/sgl_kernel/ supplies them in plain
# torch, and a .pth file (rewritten on every run, so it follows this checkout) puts it on the
# venv's path.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${KVDIR_SGLANG_VENV:-$HOME/.cache/kvdir/sglang-venv}}
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.2

# The stand-in's folder on the venv's path (every run: the checkout may have moved).
put_stand_in_on_path() {
    local site
    site=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
    echo "$ROOT/scripts/sglang_cpu" >"$site/kvdir-sglang-cpu.pth"
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sglang' 2>/dev/null; then
    put_stand_in_on_path
    "$VENV/bin/python" -c 'import sgl_kernel, sglang; print("sglang", sglang.__version__,
"already installed in '"$VENV"'; sgl_kernel from", sgl_kernel.__file__)'
    exit 0
fi

echo "installing sglang $SGLANG_VERSION into $VENV (about 10 minutes, 6.5 GB)"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "torchvision==$TORCHVISION_VERSION"

WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/pip" download --quiet --no-deps -d "$WHEELS" "sglang==$SGLANG_VERSION"
WHEEL=$(ls "$WHEELS"/sglang-"$SGLANG_VERSION"-*.whl)

# Its requirements, without extras, without the torch family pinned above and without the
# GPU-only kernels and CUDA libraries (none of them is imported by the CPU engine).
"$VENV/bin/python" - "$WHEEL" >"$WHEELS/requirements.txt" <<'PY'
import re, sys, zipfile
GPU_ONLY = {"flashinfer_python", "flashinfer-python", "flash-attn-4", "sgl-deep-ep",
            "sgl-deep-gemm", "sgl-flash-mla", "tilelang", "nvidia-cutlass-dsl",
            "nvidia-mathdx", "nvshmem4py-cu13", "humming-kernels", "quack-kernels",
            "torch_memory_saver", "torch-memory-saver", "cuda-python", "sglang-kernel"}
TORCH = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower()
        if name in GPU_ONLY or name in TORCH:
            continue
        print(req)
PY
"${PIP[@]}" -r "$WHEELS/requirements.txt"
"${PIP[@]}" --no-deps "$WHEEL"
# Imported at start-up whatever the device.
"${PIP[@]}" IPython py-spy dill

put_stand_in_on_path
"$VENV/bin/python" -c 'import sgl_kernel, sglang; print("sglang", sglang.__version__,
"installed; sgl_kernel from", sgl_kernel.__file__)'
