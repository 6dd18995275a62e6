#!/usr/bin/env bash
# A single-node KRaft Kafka broker on 127.0.0.1, from Maven Central jars, no Docker.
#
#   deploy/kafka/kafka.sh fetch    download the broker jars once (cached in ~/.cache/quartermaster)
#   deploy/kafka/kafka.sh start    fetch if needed, format storage once, start, wait until it answers
#   deploy/kafka/kafka.sh stop     stop cleanly (SIGTERM, then SIGKILL after 30 s)
#   deploy/kafka/kafka.sh status   say whether it runs and where it logs
#   deploy/kafka/kafka.sh reset    stop and delete the broker's data
#
# Settings (environment): QM_KAFKA_PORT (9092), QM_KAFKA_CONTROLLER_PORT (9093),
# QM_KAFKA_HOME (~/.cache/quartermaster/kafka-run), QM_CACHE (~/.cache/quartermaster),
# QM_KAFKA_START_TIMEOUT (300 s to wait for the broker to answer), QM_KAFKA_JVM_OPTS (more JVM
# flags for the broker, e.g. -XX:TieredStopAtLevel=1 to trade its JIT warm-up for slower code: ADR 0043),
# QM_KAFKA_PROPERTIES (more server.properties lines, space-separated, applied at the next start,
# e.g. "num.network.threads=1 num.io.threads=2"), QM_KAFKA_GC (the broker's garbage collector: G1, as
# Kafka's own scripts, or Parallel or Serial; neither moved kueue-baseline, docs/benchmarks.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
cache="${QM_CACHE:-$HOME/.cache/quartermaster}"
libs="$cache/kafka-$kafka_version/libs"
run_dir="${QM_KAFKA_HOME:-$cache/kafka-run}"
port="${QM_KAFKA_PORT:-9092}"
controller_port="${QM_KAFKA_CONTROLLER_PORT:-9093}"
start_timeout="${QM_KAFKA_START_TIMEOUT:-300}"
data_dir="$run_dir/data"
log_file="$run_dir/broker.log"
pid_file="$run_dir/broker.pid"
config="$run_dir/server.properties"
gc="${QM_KAFKA_GC:-G1}"
# Small heap: this is a development broker on a 2-core machine. One set of flags for the tools
# and the broker.
jvm_flags="-Xms256m -Xmx768m -XX:+Use${gc}GC -Djava.awt.headless=true"

die() { echo "kafka.sh: $*" >&2; exit 1; }

require_tools() {
  case "$gc" in G1|Parallel|Serial) ;; *) die "QM_KAFKA_GC=$gc: expected G1 (the default), Parallel or Serial";; esac
  command -v java >/dev/null || die "java not found: install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)"
  local major
  major="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
  [ "${major:-0}" -ge 17 ] || die "java $major found, Kafka $kafka_version needs Java 17 or newer (apt-get install openjdk-17-jre-headless)"
}

fetch() {
  if [ -f "$libs/kafka_2.13-$kafka_version.jar" ]; then return 0; fi
  command -v mvn >/dev/null || die "mvn not found: install Maven to fetch the broker jars (Debian: apt-get install maven)"
  echo "kafka.sh: fetching Kafka $kafka_version jars from Maven Central into $libs (once)"
  mkdir -p "$libs.tmp"
  mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$libs.tmp" -DincludeScope=runtime >"$cache/kafka-fetch.log" 2>&1 \
    || die "maven could not fetch the jars; see $cache/kafka-fetch.log"
  rm -rf "$libs" && mv "$libs.tmp" "$libs"
}

is_running() { [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

write_config() {
  mkdir -p "$run_dir"
  cat >"$config" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data_dir
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=168
log.cleaner.enable=true
EOF
  # shellcheck disable=SC2086 # one property per word
  if [ -n "${QM_KAFKA_PROPERTIES:-}" ]; then printf '%s\n' $QM_KAFKA_PROPERTIES >>"$config"; fi
  cat >"$run_dir/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $log_file
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
}

java_cmd() {
  # shellcheck disable=SC2086 # one flag per word
  java $jvm_flags \
    -Dlog4j2.configurationFile="$run_dir/log4j2.properties" \
    -cp "$libs/*" "$@"
}

start() {
  require_tools
  fetch
  if is_running; then
    echo "kafka.sh: broker already running (pid $(cat "$pid_file")) on 127.0.0.1:$port"
    return 0
  fi
  if answers; then die "something else already listens on 127.0.0.1:$port; stop it or set QM_KAFKA_PORT"; fi
  write_config
  if [ ! -f "$data_dir/meta.properties" ]; then
    java_cmd kafka.tools.StorageTool format --standalone -t "$(java_cmd kafka.tools.StorageTool random-uuid)" \
      -c "$config" >"$run_dir/format.log" 2>&1 || die "formatting storage failed; see $run_dir/format.log"
  fi
  nohup bash -c "exec java $jvm_flags ${QM_KAFKA_JVM_OPTS:-} \
    -Dlog4j2.configurationFile='$run_dir/log4j2.properties' -cp '$libs/*' kafka.Kafka '$config'" \
    >"$run_dir/stdout.log" 2>&1 &
  echo $! >"$pid_file"
  # A broker loads every partition it holds before it answers: seconds when fresh, minutes with
  # thousands of leftover test topics. Wait while it is alive and say what it is doing.
  local partitions waited=0
  partitions="$(find "$data_dir" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)"
  if [ "$partitions" -gt 2000 ]; then
    echo "kafka.sh: $partitions partitions in $data_dir to load; start is slow (\`$0 reset\` empties it)"
  fi
  while [ "$waited" -lt "$start_timeout" ]; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      if answers; then
        echo "kafka.sh: broker up on 127.0.0.1:$port after ${waited} s (logs: $log_file)"
        return 0
      fi
      is_running || die "broker exited during start; see $run_dir/stdout.log and $log_file"
      sleep 0.5
    done
    waited=$((waited + 5))
    if [ $((waited % 30)) -eq 0 ]; then echo "kafka.sh: still starting after ${waited} s (loading $partitions partitions)"; fi
  done
  die "broker did not answer on 127.0.0.1:$port within $start_timeout s (QM_KAFKA_START_TIMEOUT); see $log_file, or \`$0 reset\` to start empty"
}

stop() {
  if ! is_running; then echo "kafka.sh: broker not running"; rm -f "$pid_file"; return 0; fi
  local pid; pid="$(cat "$pid_file")"
  kill -TERM "$pid"
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pid_file"; echo "kafka.sh: broker stopped"; return 0; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pid_file"
  echo "kafka.sh: broker did not stop in 30 s; killed"
}

status() {
  if is_running; then echo "running (pid $(cat "$pid_file")) on 127.0.0.1:$port, logs $log_file"
  else echo "not running"; return 1; fi
}

case "${1:-}" in
  fetch) require_tools; fetch ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  reset) stop; rm -rf "$data_dir"; echo "kafka.sh: data removed" ;;
  *) echo "usage: $0 fetch|start|stop|status|reset" >&2; exit 2 ;;
esac
