#!/usr/bin/env bash
# Builds kvdir's container image (Containerfile) with podman, on a machine that may reach no
# container registry, and optionally checks it.
#
#   bash scripts/image.sh            # build localhost/kvdir:latest
#   bash scripts/image.sh --check    # build, then run it: /health answers, `podman stop` exits 0
#
# 1. Builds the release binary on the host (the image does not compile anything) and strips it
#    with `objcopy --strip-all` into target/image/, the build context.
# 2. The Containerfile takes the binary's libraries from a Debian 12 base image. When it is
#    missing, the default one (localhost/debian:bookworm-minbase) is made from Debian's packages
#    with `debootstrap --variant=minbase` and `podman import`: no registry is needed.
# 3. `podman build`. CONTAINERS_CONF defaults to scripts/containers.conf (runc, lower ulimits)
#    where podman's own defaults fail.
#
# Environment: KVDIR_IMAGE (the tag, localhost/kvdir:latest), KVDIR_IMAGE_BASE (the base image,
# localhost/debian:bookworm-minbase), KVDIR_DEBIAN_MIRROR (debootstrap's mirror; the first
# Debian mirror in /etc/apt/sources.list*, else deb.debian.org), CARGO_TARGET_DIR.
# As root, missing tools are installed with apt-get (podman, buildah, runc, debootstrap,
# binutils, curl).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${KVDIR_IMAGE:-localhost/kvdir:latest}
DEFAULT_BASE=localhost/debian:bookworm-minbase
BASE=${KVDIR_IMAGE_BASE:-$DEFAULT_BASE}
TARGET=${CARGO_TARGET_DIR:-target}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/containers.conf}
CHECK=0
case "${1:-}" in
    "") ;;
    --check) CHECK=1 ;;
    *) echo "usage: bash scripts/image.sh [--check]" >&2; exit 2 ;;
esac

log() { printf '\n== %s\n' "$*"; }

missing=()
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap objcopy:binutils \
    curl:curl; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing: ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
        exit 1
    fi
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

log "the release binary, stripped into $TARGET/image/"
cargo build --release -p kvdir-service --bin kvdir
CONTEXT="$TARGET/image"
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT"
objcopy --strip-all "$TARGET/release/kvdir" "$CONTEXT/kvdir"
ls -l "$TARGET/release/kvdir" "$CONTEXT/kvdir"

# The first Debian mirror apt uses (one-line or deb822 sources), else deb.debian.org.
debian_mirror() {
    local url
    url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | grep -oE '(URIs:[[:space:]]*|^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+' \
        | grep -oE 'https?://[^[:space:]]+' | grep -v security | head -n 1 || true)
    echo "${url:-http://deb.debian.org/debian}"
}

if ! podman image exists "$BASE"; then
    if [ "$BASE" != "$DEFAULT_BASE" ]; then
        log "pulling $BASE"
        podman pull "$BASE"
    else
        MIRROR=${KVDIR_DEBIAN_MIRROR:-$(debian_mirror)}
        log "making $BASE with debootstrap from $MIRROR (no registry needed)"
        ROOTFS=$(mktemp -d)
        trap 'rm -rf "$ROOTFS"' EXIT
        debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >/dev/null
        tar -C "$ROOTFS" -c . | podman import - "$BASE"
        rm -rf "$ROOTFS"
        trap - EXIT
    fi
fi

log "podman build $IMAGE (base $BASE)"
podman build --build-arg "BASE=$BASE" -f Containerfile -t "$IMAGE" "$CONTEXT"
podman image ls "$IMAGE"

[ "$CHECK" = 1 ] || exit 0

log "checking $IMAGE: the demo on 127.0.0.1, /health, then podman stop"
PORT=${KVDIR_IMAGE_PORT:-18888}
NAME=kvdir-image-check-$$
podman rm -f "$NAME" >/dev/null 2>&1 || true
podman run -d --name "$NAME" -p "127.0.0.1:$PORT:8888" "$IMAGE" --demo --server_host=0.0.0.0 \
    >/dev/null
trap 'podman rm -f "$NAME" >/dev/null 2>&1 || true' EXIT
ok=0
for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then ok=1; break; fi
    [ "$(podman inspect -f '{{.State.Running}}' "$NAME")" = true ] || break
    sleep 0.1
done
if [ "$ok" != 1 ]; then
    podman logs "$NAME" >&2 || true
    echo "the container's /health did not answer on 127.0.0.1:$PORT" >&2
    exit 1
fi
echo "GET /health: $(curl -fsS "http://127.0.0.1:$PORT/health")"
echo "user: $(podman inspect -f '{{.Config.User}}' "$IMAGE"), processes:"
podman top "$NAME" user pid args
# A process that ignored SIGTERM would be killed after the timeout, exiting 137.
start=$(date +%s%N)
podman stop -t 20 "$NAME" >/dev/null
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
code=$(podman inspect -f '{{.State.ExitCode}}' "$NAME")
podman logs "$NAME" 2>&1 | tail -n 3
echo "podman stop: exit code $code after ${elapsed_ms} ms"
[ "$code" = 0 ] || { echo "kvdir did not exit 0 on SIGTERM" >&2; exit 1; }
echo "image check passed"
