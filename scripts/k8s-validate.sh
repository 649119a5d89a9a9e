#!/usr/bin/env bash
# Checks the Kubernetes manifests in deploy/kubernetes offline (no cluster, no network once the
# venv exists):
# 1. renders every kustomization (the base and each overlay) with scripts/k8s_render.py; where
#    kubectl exists, renders it with `kubectl kustomize` too and requires the same objects;
# 2. validates every rendered object against the Kubernetes JSON schemas of the oldest and the
#    newest version checked, strictly (an unknown field is an error), with PyPI's
#    kubernetes-validate in a venv under ~/.cache/kvdir/ (made on first use);
# 3. checks that each overlay's example vLLM Deployment is wired as its kvdir config expects;
# 4. with a kube-apiserver (KVDIR_KUBE_APISERVER, as .ci/run sets it, else the one
#    scripts/kube-apiserver.sh caches), creates every rendered object on it (etcd and the
#    server on 127.0.0.1, scripts/k8s_server_check.py) and checks that kvdir's service account
#    may get, list and watch pods and nothing else. Without one, this step says so and is left
#    out.
# That each ConfigMap's config.json is a valid kvdir config is a Rust test
# (actors/tests/e2e/deploy_configs.rs: `kvdir --check_config` on each).
set -euo pipefail
cd "$(dirname "$0")/.."

VALIDATE_VERSION=1.37.0
KUBERNETES_VERSIONS=(1.27.0 1.37.0)
VENV=${KVDIR_K8S_VENV:-$HOME/.cache/kvdir/k8s-validate-venv}

if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$VALIDATE_VERSION"; then
    echo "making $VENV with kubernetes-validate $VALIDATE_VERSION"
    python3 -m venv "$VENV" || {
        echo "python3 -m venv failed: apt-get install python3-venv" >&2
        exit 1
    }
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "kubernetes-validate==$VALIDATE_VERSION"
fi
PY="$VENV/bin/python"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
mapfile -t DIRS < <(find deploy/kubernetes -name kustomization.yaml -printf '%h\n' | sort)
[ ${#DIRS[@]} -gt 0 ] || { echo "no kustomization.yaml under deploy/kubernetes" >&2; exit 1; }
RENDERED=()
for dir in "${DIRS[@]}"; do
    rendered="$OUT/$(tr / _ <<<"$dir").yaml"
    RENDERED+=("$rendered")
    "$PY" scripts/k8s_render.py render "$dir" >"$rendered"
    if command -v kubectl >/dev/null; then
        kubectl kustomize "$dir" >"$rendered.kubectl"
        "$PY" scripts/k8s_render.py same "$rendered" "$rendered.kubectl"
    fi
    for version in "${KUBERNETES_VERSIONS[@]}"; do
        "$VENV/bin/kubernetes-validate" --strict --quiet --no-warn -k "$version" "$rendered"
    done
    objects=$(grep -c '^kind:' "$rendered")
    echo "$dir: $objects objects valid for Kubernetes ${KUBERNETES_VERSIONS[*]}"
    if [[ "$dir" == */overlays/* ]]; then
        "$PY" scripts/k8s_render.py engines "$rendered" "$dir"
    fi
done

KUBE_APISERVER=${KVDIR_KUBE_APISERVER:-$HOME/.cache/kvdir/kube-apiserver/kube-apiserver}
if [ -x "$KUBE_APISERVER" ]; then
    "$PY" scripts/k8s_server_check.py "$KUBE_APISERVER" "${RENDERED[@]}"
elif [ -n "${KVDIR_KUBE_APISERVER:-}" ]; then
    echo "KVDIR_KUBE_APISERVER=$KVDIR_KUBE_APISERVER is not an executable" >&2
    exit 1
else
    echo "no kube-apiserver: the manifests were not created on a server" \
        "(bash scripts/kube-apiserver.sh builds one)"
fi
