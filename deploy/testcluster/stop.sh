#!/usr/bin/env bash
# Stop the local test cluster started by start.sh: each component by its pid file, in reverse
# start order, TERM then KILL after 5 s (the API server's graceful shutdown drains watches for
# longer than a test cluster needs). Leaves the run dir (etcd data, certs, logs) in place;
# `start.sh --fresh` wipes it.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
source "$HERE/versions.sh"
RUN="$QM_TESTCLUSTER_RUN"

pid_of() { [[ -f "$RUN/pids/$1.pid" ]] && cat "$RUN/pids/$1.pid"; }

# Each component runs in its own process group (setsid in start.sh): signal the group.
stop_group() { # names...
  local name pid pids=()
  for name in "$@"; do
    pid="$(pid_of "$name")" || continue
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
      pids+=("$name:$pid")
    else
      rm -f "$RUN/pids/$name.pid"
    fi
  done
  local entry any
  for _ in $(seq 1 20); do
    any=0
    for entry in "${pids[@]}"; do kill -0 "${entry#*:}" 2>/dev/null && any=1; done
    ((any)) || break
    sleep 0.25
  done
  for entry in "${pids[@]}"; do
    name="${entry%%:*}"; pid="${entry#*:}"
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$RUN/pids/$name.pid"
    echo "testcluster: stopped $name ($pid)"
  done
}

# The control plane together, then its storage.
stop_group kwok kube-scheduler kube-controller-manager kube-apiserver
stop_group etcd
