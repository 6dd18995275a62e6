#!/usr/bin/env bash
# Start the local Kubernetes test cluster on loopback: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake GPU nodes, simulated pod lifecycles).
# No Docker, no kubelet: kwok plays the kubelets.
#
#   start.sh            start (idempotent: a running cluster is left as it is)
#   start.sh --fresh    stop, wipe the run dir (etcd data, certs), start anew
#
# Writes, under $QM_TESTCLUSTER_RUN (default /tmp/qm-testcluster):
#   kubeconfig          admin (system:masters) kubeconfig for tests and kubectl
#   env                 shell-sourceable QM_K8S_SERVER / QM_K8S_CA / QM_K8S_ADMIN_TOKEN
#   logs/*.log          one log per component;  pids/*.pid  one pid file per component
# Binaries come from build.sh (run it first; it caches outside the clone).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
source "$HERE/versions.sh"

BIN="$QM_TESTCLUSTER_BIN"
RUN="$QM_TESTCLUSTER_RUN"
PORT="$QM_TESTCLUSTER_PORT"
ETCD_PORT="$QM_TESTCLUSTER_ETCD_PORT"
ETCD_PEER_PORT="$QM_TESTCLUSTER_ETCD_PEER_PORT"
SERVER="https://127.0.0.1:$PORT"

die() { echo "testcluster: $*" >&2; exit 1; }

command -v openssl >/dev/null 2>&1 || die "'openssl' not found on PATH; install it (apt-get install openssl) to generate the cluster's certificates"
command -v curl >/dev/null 2>&1 || die "'curl' not found on PATH; install it (apt-get install curl) to probe the API server"
for b in kube-apiserver kube-controller-manager kube-scheduler etcd kwok; do
  [[ -x "$BIN/$b" ]] || die "$BIN/$b is missing; run deploy/testcluster/build.sh first ('go' is needed for that)"
done

if [[ "${1:-}" == "--fresh" ]]; then
  "$HERE/stop.sh" >/dev/null 2>&1 || true
  rm -rf "$RUN"
fi

mkdir -p "$RUN"/{pki,logs,pids,etcd}

alive() { [[ -f "$RUN/pids/$1.pid" ]] && kill -0 "$(cat "$RUN/pids/$1.pid")" 2>/dev/null; }

# ---------------------------------------------------------------- credentials
PKI="$RUN/pki"
if [[ ! -f "$PKI/ca.crt" ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=qm-testcluster-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" >/dev/null 2>&1
  cat > "$PKI/apiserver.ext" <<EOF
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
keyUsage=digitalSignature,keyEncipherment
EOF
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" >/dev/null 2>&1
  openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" >/dev/null 2>&1
  # Service-account token signing key pair (apiserver signs, apiserver+KCM verify/sign).
  openssl genrsa -out "$PKI/sa.key" 2048 >/dev/null 2>&1
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" >/dev/null 2>&1
  # Static tokens, one identity per component. All are cluster admins: this cluster exists
  # only for tests. The watcher is NOT in this file: tests give it its ServiceAccount token
  # so RBAC (deploy/kubernetes/watcher-rbac.yaml) is what the tests exercise.
  tok() { openssl rand -hex 16; }
  {
    echo "$(tok),admin,uid-admin,\"system:masters\""
    echo "$(tok),system:kube-controller-manager,uid-kcm,\"system:masters\""
    echo "$(tok),system:kube-scheduler,uid-scheduler,\"system:masters\""
    echo "$(tok),kwok-controller,uid-kwok,\"system:masters\""
  } > "$PKI/tokens.csv"
  chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
fi
token_of() { awk -F, -v u="$1" '$2==u {print $1}' "$PKI/tokens.csv"; }

write_kubeconfig() { # file user token
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: qm-testcluster
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: qm-testcluster
  context: {cluster: qm-testcluster, user: $2}
current-context: qm-testcluster
EOF
  chmod 600 "$1"
}
ADMIN_TOKEN="$(token_of admin)"
write_kubeconfig "$RUN/kubeconfig" admin "$ADMIN_TOKEN"
write_kubeconfig "$RUN/kcm.kubeconfig" system:kube-controller-manager "$(token_of system:kube-controller-manager)"
write_kubeconfig "$RUN/scheduler.kubeconfig" system:kube-scheduler "$(token_of system:kube-scheduler)"
write_kubeconfig "$RUN/kwok.kubeconfig" kwok-controller "$(token_of kwok-controller)"
cat > "$RUN/env" <<EOF
export QM_K8S_SERVER=$SERVER
export QM_K8S_CA=$PKI/ca.crt
export QM_K8S_ADMIN_TOKEN=$ADMIN_TOKEN
export KUBECONFIG=$RUN/kubeconfig
EOF

# ---------------------------------------------------------------- processes
launch() { # name cmd...
  local name="$1"; shift
  if alive "$name"; then return 0; fi
  # setsid: own process group, so stop.sh can end it without touching anything else.
  setsid "$@" >>"$RUN/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/pids/$name.pid"
}

wait_for() { # name seconds probe...
  local name="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || die "$name exited; last lines of $RUN/logs/$name.log:
$(tail -n 20 "$RUN/logs/$name.log")"
    ((SECONDS < deadline)) || die "$name not ready after ${secs}s; see $RUN/logs/$name.log"
    sleep 0.5
  done
}

launch etcd "$BIN/etcd" \
  --name qm-testcluster \
  --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "qm-testcluster=http://127.0.0.1:$ETCD_PEER_PORT" \
  --listen-metrics-urls "" \
  --unsafe-no-fsync \
  --quota-backend-bytes 2147483648 \
  --log-level warn
wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

launch kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --etcd-compaction-interval "$QM_TESTCLUSTER_COMPACTION_INTERVAL" \
  --bind-address 127.0.0.1 \
  --advertise-address 127.0.0.1 \
  --secure-port "$PORT" \
  --tls-cert-file "$PKI/apiserver.crt" \
  --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --token-auth-file "$PKI/tokens.csv" \
  --authorization-mode RBAC \
  --service-account-issuer "https://kubernetes.default.svc.cluster.local" \
  --service-account-key-file "$PKI/sa.pub" \
  --service-account-signing-key-file "$PKI/sa.key" \
  --api-audiences "https://kubernetes.default.svc.cluster.local" \
  --service-cluster-ip-range 10.96.0.0/16 \
  --endpoint-reconciler-type none \
  --allow-privileged \
  --profiling=false \
  --v 1
wait_for kube-apiserver 120 curl -sf --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" "$SERVER/readyz"

launch kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$RUN/kcm.kubeconfig" \
  --authentication-kubeconfig "$RUN/kcm.kubeconfig" \
  --authorization-kubeconfig "$RUN/kcm.kubeconfig" \
  --controllers job,serviceaccount,serviceaccount-token,namespace,garbagecollector,ttl-after-finished,podgc,root-ca-cert-publisher,nodelifecycle \
  --service-account-private-key-file "$PKI/sa.key" \
  --root-ca-file "$PKI/ca.crt" \
  --leader-elect=false \
  --bind-address 127.0.0.1 \
  --secure-port 0 \
  --concurrent-job-syncs 5 \
  --v 1

launch kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig "$RUN/scheduler.kubeconfig" \
  --authentication-kubeconfig "$RUN/scheduler.kubeconfig" \
  --authorization-kubeconfig "$RUN/scheduler.kubeconfig" \
  --leader-elect=false \
  --bind-address 127.0.0.1 \
  --secure-port 0 \
  --v 1

# kwok's pod lifecycle: kwok's own "general" stages (create → ready → complete → delete, each
# with a delay taken from a pod annotation, default 1s + up to 5s jitter), node stages by default.
STAGES="$BIN/../share/kwok-stages.yaml"
[[ -f "$STAGES" ]] || die "$STAGES is missing; run deploy/testcluster/build.sh"
launch kwok "$BIN/kwok" \
  --kubeconfig "$RUN/kwok.kubeconfig" \
  --config "$STAGES" \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --manage-nodes-with-label-selector "" \
  --cidr 10.244.0.0/16 \
  --node-ip 10.244.0.1 \
  --node-lease-duration-seconds 40 \
  --server-address "" \
  --v 1

sleep 1
for c in kube-controller-manager kube-scheduler kwok; do
  alive "$c" || die "$c exited; last lines of $RUN/logs/$c.log:
$(tail -n 20 "$RUN/logs/$c.log")"
done
echo "testcluster: ready at $SERVER (kubeconfig: $RUN/kubeconfig)"
