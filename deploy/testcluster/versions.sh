# Versions of the test cluster's components; sourced by build.sh, start.sh and stop.sh.
# Changing one changes the cache key, so the next build.sh rebuilds.
# K8S_VERSION must match gomod/go.mod (k8s.io/kubernetes v$K8S_VERSION and the v0.x replaces).
K8S_VERSION="${QM_K8S_VERSION:-1.33.13}"
ETCD_VERSION="3.5.21"
KWOK_VERSION="0.7.0"
BUILD_STAMP="k8s=$K8S_VERSION etcd=$ETCD_VERSION kwok=$KWOK_VERSION"

QM_TESTCLUSTER_CACHE="${QM_TESTCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster/testcluster}"
QM_TESTCLUSTER_BIN="${QM_TESTCLUSTER_BIN:-$QM_TESTCLUSTER_CACHE/$K8S_VERSION/bin}"
QM_TESTCLUSTER_RUN="${QM_TESTCLUSTER_RUN:-/tmp/qm-testcluster}"
QM_TESTCLUSTER_PORT="${QM_TESTCLUSTER_PORT:-6443}"
QM_TESTCLUSTER_ETCD_PORT="${QM_TESTCLUSTER_ETCD_PORT:-23790}"
QM_TESTCLUSTER_ETCD_PEER_PORT="${QM_TESTCLUSTER_ETCD_PEER_PORT:-$((QM_TESTCLUSTER_ETCD_PORT + 10))}"
# How often the API server compacts etcd (5m, its own default). Shorter makes "410 Gone after a
# long outage" reachable in a test: a resourceVersion older than two intervals is compacted.
QM_TESTCLUSTER_COMPACTION_INTERVAL="${QM_TESTCLUSTER_COMPACTION_INTERVAL:-5m}"
