#!/usr/bin/env bash
# Makes sure a kube-apiserver binary is cached for the Kubernetes tests (testkit/src/kube.rs,
# actors/tests/e2e/kube_e2e), and prints its path as the last line of stdout.
#
# No package registry ships kube-apiserver, so it is built from Debian's `kubernetes` source
# package (Kubernetes 1.20.2 with its dependencies vendored) with Debian's Go. The binary is
# cached at $KVDIR_KUBE_CACHE (default ~/.cache/kvdir/kube-apiserver)/kube-apiserver beside a
# stamp file kube-apiserver.recipe holding RECIPE below: a cached binary from the same recipe
# is used as it is, and nothing is installed. Bump RECIPE when the build steps change.
#
# Recipe 3 (recipe 2 without it) builds with Debian's reflect2 1.0.2 in place of the vendored
# 1.0.1, which crashes under Go >= 1.18 when the server decodes a JSON Pod ("invalid memory
# address or nil pointer dereference" in reflect2.Type2: every create of a Pod failed).
#
# Building (about 4 minutes on 2 idle cores, 106 MB) needs root: it adds a deb-src entry and
# installs golang-go, golang-github-modern-go-reflect2-dev, rsync and etcd-server with apt.
# Progress goes to stderr.
set -euo pipefail

RECIPE=3
# The source package version the recipe was written for (bookworm's).
SOURCE_VERSION="1.20.5+really1.20.2"
# What `kube-apiserver --version` reports (the tarball's own version strings say v0.0.0-master).
GIT_VERSION="v1.20.2"
CACHE=${KVDIR_KUBE_CACHE:-$HOME/.cache/kvdir/kube-apiserver}
BIN="$CACHE/kube-apiserver"
STAMP="$CACHE/kube-apiserver.recipe"

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'kube-apiserver.sh: %s\n' "$*" >&2; exit 1; }

if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$RECIPE" ]; then
    "$BIN" --version >/dev/null 2>&1 \
        || die "$BIN (recipe $RECIPE) does not run; remove $CACHE and run this script again"
    echo "$BIN"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "no kube-apiserver in $CACHE, and building one needs root (apt-get)"

# A deb-src entry for the release's main component, from the mirror the machine already uses,
# with that entry's Signed-By (apt refuses two entries for one mirror whose keys differ:
# "Conflicting values set for option Signed-By"). The entry is this script's own file,
# rewritten each time; a deb-src entry elsewhere is used as it is.
add_deb_src() {
    local own=/etc/apt/sources.list.d/kvdir-deb-src.sources
    if grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list \
        $(find /etc/apt/sources.list.d -type f ! -path "$own"); then
        return
    fi
    local codename file uri signed
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || die "cannot tell the Debian release from /etc/os-release"
    file=$(grep -lsE '^URIs:.*debian' $(find /etc/apt/sources.list.d -name '*.sources' ! -path "$own") \
        | head -n 1 || true)
    if [ -n "$file" ]; then
        uri=$(grep -hE '^URIs:' "$file" | grep -v security | awk '{ print $2; exit }')
        signed=$(grep -hE '^Signed-By:' "$file" | awk '{ print $2; exit }')
    fi
    [ -n "${uri:-}" ] || uri=$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' \
        /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$uri" ] || die "no Debian mirror found in /etc/apt/sources.list*"
    log "adding a deb-src entry for $codename main at $uri"
    printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\n' "$uri" "$codename" >"$own"
    [ -z "${signed:-}" ] || printf 'Signed-By: %s\n' "$signed" >>"$own"
}

add_deb_src
log "installing golang-go, reflect2, rsync and etcd-server"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    golang-go golang-github-modern-go-reflect2-dev rsync etcd-server ca-certificates >/dev/null
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -f "$REFLECT2/go_above_118.go" ] || die "$REFLECT2 is not reflect2 >= 1.0.2"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
log "downloading the kubernetes source package into $WORK"
apt-get source --download-only -qq kubernetes >&2 \
    || die "apt-get source kubernetes failed (is there a deb-src entry for main?)"
ORIG="kubernetes_${SOURCE_VERSION}.orig.tar.gz"
[ -f "$ORIG" ] || die "expected $ORIG, got: $(ls) (the recipe is for Debian bookworm)"

# GOPATH mode: the vendored tree does not build as a module ("updates to go.mod needed").
export GOPATH="$WORK/gopath" GOCACHE="$WORK/gocache" GO111MODULE=off CGO_ENABLED=0 GOFLAGS=
SRC="$GOPATH/src/k8s.io/kubernetes"
mkdir -p "$SRC"
tar -xzf "$ORIG" -C "$SRC" --strip-components=1
cd "$SRC"
rm -rf vendor/github.com/modern-go/reflect2
cp -r "$REFLECT2" vendor/github.com/modern-go/reflect2

# The tarball leaves out the generated OpenAPI definitions the API server is built with:
# generate them from every package marked `+k8s:openapi-gen=` (not the code generator's own
# examples).
log "building openapi-gen and generating pkg/generated/openapi"
go build -o "$WORK/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
# -R: vendor/k8s.io/* are symbolic links into staging/, which grep -r does not follow.
INPUTS=$(grep -RlE '\+k8s:openapi-gen=' --include='*.go' pkg vendor/k8s.io \
    | grep -vE '^vendor/k8s.io/(code-generator|sample-apiserver)/' \
    | xargs -n1 dirname | sort -u \
    | sed -e 's#^vendor/##' -e 's#^pkg/#k8s.io/kubernetes/pkg/#' | paste -sd, -)
[ -n "$INPUTS" ] || die "no package marked +k8s:openapi-gen= in the source tree"
"$WORK/openapi-gen" -i "$INPUTS" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -o "$GOPATH/src" --report-filename "$WORK/api-rule-violations.txt" >&2
# The server refuses to start without these (and every other served type's) definitions.
for model in k8s.io/api/core/v1.Pod \
    k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.CustomResourceDefinition \
    k8s.io/kube-aggregator/pkg/apis/apiregistration/v1.APIService; do
    grep -q "\"$model\"" pkg/generated/openapi/zz_generated.openapi.go \
        || die "openapi-gen left out $model"
done

log "building kube-apiserver $GIT_VERSION (a few minutes)"
VERSION_PKG=k8s.io/kubernetes/vendor/k8s.io/component-base/version
# -s -w: no symbol table or DWARF (smaller, and nothing here debugs the server).
go build -o "$WORK/kube-apiserver" -ldflags "-s -w -X $VERSION_PKG.gitVersion=$GIT_VERSION \
    -X $VERSION_PKG.gitMajor=1 -X $VERSION_PKG.gitMinor=20" ./cmd/kube-apiserver
"$WORK/kube-apiserver" --version >&2 || die "the built kube-apiserver does not run"

mkdir -p "$CACHE"
mv "$WORK/kube-apiserver" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$RECIPE" >"$STAMP"
log "cached $BIN (recipe $RECIPE)"
echo "$BIN"
