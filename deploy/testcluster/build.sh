#!/usr/bin/env bash
# Build the test cluster's binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
# etcd, kwok) from the Go module proxy, once, into a cache outside the clone keyed by version:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster/testcluster/<k8s-version>/bin/
# A second run finds the binaries and returns at once.
#
#   build.sh            build if missing
#   build.sh --force    rebuild
#   build.sh --print-bin  print the bin directory and exit
#
# The first build compiles ~3,000 packages; see README.md for how long it takes.
set -euo pipefail

# Everything is in main so bash parses the whole script before running it (editing the
# file during a long build cannot derail the running copy).
main() {

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
source "$HERE/versions.sh"

BIN="$QM_TESTCLUSTER_BIN"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)
SHARE="$BIN/../share"

# kwok's own Stage files from its module: the "general" pod lifecycle (delays read from pod
# annotations) and the fast node stages with lease heartbeats, joined into one --config file.
install_stages() {
  local dir
  dir="$(cd "$HERE/gomod" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  [[ -n "$dir" && -d "$dir/kustomize/stage" ]] || { echo "testcluster: kwok module source not found" >&2; return 1; }
  mkdir -p "$SHARE"
  {
    local f
    for f in pod/general/pod-create pod/general/pod-init-container-running pod/general/pod-init-container-completed \
             pod/general/pod-ready pod/general/pod-complete pod/general/pod-delete \
             node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease; do
      echo "---"
      cat "$dir/kustomize/stage/$f.yaml"
    done
  } > "$SHARE/kwok-stages.yaml.tmp"
  mv "$SHARE/kwok-stages.yaml.tmp" "$SHARE/kwok-stages.yaml"
}

if [[ "${1:-}" == "--print-bin" ]]; then
  echo "$BIN"
  exit 0
fi

all_present() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  [[ -f "$SHARE/kwok-stages.yaml" ]] || return 1
  [[ -f "$BIN/.stamp" && "$(cat "$BIN/.stamp")" == "$BUILD_STAMP" ]]
}

if [[ "${1:-}" != "--force" ]] && all_present; then
  echo "testcluster: binaries for k8s $K8S_VERSION already built in $BIN"
  exit 0
fi

command -v go >/dev/null 2>&1 || { echo "testcluster: 'go' not found on PATH; install Go >= 1.24 to build the test cluster" >&2; exit 2; }

mkdir -p "$BIN"
TMP="$BIN.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT

pkg_ver="k8s.io/component-base/version"
LDFLAGS="-s -w \
 -X $pkg_ver.gitVersion=v$K8S_VERSION \
 -X $pkg_ver.gitMajor=${K8S_VERSION%%.*} \
 -X $pkg_ver.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) \
 -X $pkg_ver.gitTreeState=clean \
 -X $pkg_ver.buildDate=1970-01-01T00:00:00Z"

echo "testcluster: building k8s $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION into $BIN (first build takes a while)"
start=$(date +%s)
cd "$HERE/gomod"
# One invocation so the packages shared by the three Kubernetes commands compile once.
# nice: the build saturates every core; keep the machine usable for others.
GOFLAGS="-mod=mod -trimpath" CGO_ENABLED=0 nice -n 19 go build \
  -ldflags="$LDFLAGS" \
  -o "$TMP/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  go.etcd.io/etcd/server/v3 \
  sigs.k8s.io/kwok/cmd/kwok
# go names the etcd main package after its module path without the /v3 suffix.
for cand in server v3; do
  [[ -x "$TMP/$cand" ]] && mv "$TMP/$cand" "$TMP/etcd"
done
for b in "${BINARIES[@]}"; do
  [[ -x "$TMP/$b" ]] || { echo "testcluster: build produced no $b" >&2; exit 1; }
  mv -f "$TMP/$b" "$BIN/$b"
done
install_stages
echo "$BUILD_STAMP" > "$BIN/.stamp"
end=$(date +%s)
echo "testcluster: built in $((end - start))s"
}

main "$@"
