#!/usr/bin/env bash
# Real single-node Apache Kafka 4.x broker (KRaft, combined broker+controller)
# on loopback, for the test suite. Jars come from Maven (scripts/kafka/pom.xml).
#
#   scripts/kafka.sh fetch        ensure the jars are cached; prints the libs dir
#   scripts/kafka.sh start DIR    start a broker whose state lives in DIR;
#                                 prints 127.0.0.1:<port> (also in DIR/brokers)
#   scripts/kafka.sh stop DIR     stop it and remove DIR (idempotent)
#   scripts/kafka.sh restart DIR  stop the broker of DIR (TERM, then KILL after
#                                 20s) and start it again with the same
#                                 server.properties: same port, same data;
#                                 prints 127.0.0.1:<port> when it is ready
#   scripts/kafka.sh cluster DIR  start a three-node cluster (combined KRaft nodes in
#                                 DIR/node1..3, replication factor 3, min.insync.replicas
#                                 2, unclean leader election off); prints the bootstrap
#                                 list (also DIR/brokers). stop DIR stops every node;
#                                 restart DIR/nodeN restarts one (same port, same data)
#   scripts/kafka.sh kill DIR     SIGKILL the broker of DIR (a node dir, or a single
#                                 broker's): a crash; restart DIR starts it again
#   scripts/kafka.sh libs         print the libs dir (no fetch)
#   scripts/kafka.sh cluster-id [FILE]
#                                 print a new cluster id (from FILE's 16-byte
#                                 blocks instead of /dev/urandom: for tests)
#
# Environment:
#   INBOX_KAFKA_LIBS           jars dir (default $HOME/.cache/inbox-kafka/<version>/libs)
#   INBOX_KAFKA_START_TIMEOUT  seconds to wait for readiness (default 90)
#   INBOX_KAFKA_LOG_LEVEL      root log level of the broker's DIR/server.log (default WARN)
#   INBOX_KAFKA_HEAP           JVM heap flags (default "-Xmx512m -Xms256m")
#
# Files in DIR: server.properties, log4j2.properties, data/, server.log (log4j,
# size-capped), kafka.log (JVM stdout/stderr), pid, brokers, ports.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$HERE/kafka/pom.xml"
# Single source of truth for the version: <kafka.version> in the pom.
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")"
[[ -n "$KAFKA_VERSION" ]] || { echo "kafka.sh: no <kafka.version> in $POM" >&2; exit 1; }
LIBS="${INBOX_KAFKA_LIBS:-${HOME:-/root}/.cache/inbox-kafka/$KAFKA_VERSION/libs}"

die() { echo "kafka.sh: $*" >&2; exit 1; }
log() { echo "kafka.sh: $*" >&2; }

need_java() {
	command -v java >/dev/null 2>&1 || die "java not found on PATH (need Java 17+)"
}

# A libs dir is complete when the marker written after a successful copy holds
# the hash of the current pom (so editing the pom's dependencies refetches).
pom_hash() { sha256sum "$POM" | cut -d' ' -f1; }
libs_ok() {
	[[ -f "$LIBS/.complete" && "$(cat "$LIBS/.complete")" == "$(pom_hash)" ]] &&
		compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null
}

fetch() {
	libs_ok && return 0
	command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH (needed once to fetch the Kafka jars)"
	local parent tmp
	parent="$(dirname "$LIBS")"
	mkdir -p "$parent"
	tmp="$(mktemp -d "$parent/.libs.tmp.XXXXXX")"
	chmod 755 "$tmp"
	log "fetching Kafka $KAFKA_VERSION jars with Maven into $LIBS ..."
	local t0=$SECONDS
	if ! mvn -q -B -f "$POM" dependency:copy-dependencies \
		-DoutputDirectory="$tmp" -DincludeScope=runtime >"$tmp.mvn.log" 2>&1; then
		tail -n 40 "$tmp.mvn.log" >&2 || true
		rm -rf "$tmp" "$tmp.mvn.log"
		die "maven fetch failed"
	fi
	rm -f "$tmp.mvn.log"
	compgen -G "$tmp/kafka_2.13-*.jar" >/dev/null || { rm -rf "$tmp"; die "maven fetch produced no kafka_2.13 jar"; }
	pom_hash >"$tmp/.complete"
	# Atomic publish: rename the finished dir into place. If another process won
	# the race (or a stale incomplete dir is there), keep the complete one.
	if ! mv -T "$tmp" "$LIBS" 2>/dev/null; then
		if libs_ok; then
			rm -rf "$tmp"
		else
			rm -rf "$LIBS.stale.$$"
			mv -T "$LIBS" "$LIBS.stale.$$" 2>/dev/null || true
			mv -T "$tmp" "$LIBS" || { rm -rf "$tmp"; libs_ok || die "cannot install jars into $LIBS"; }
			rm -rf "$LIBS.stale.$$"
		fi
	fi
	log "jars ready in $((SECONDS - t0))s ($(du -sh "$LIBS" | cut -f1))"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A random port in 20000..32767 (below Linux's default ephemeral range) that
# nothing listens on and that is none of the space-separated ports in $1.
free_port() {
	local p _
	for _ in $(seq 1 200); do
		p=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
		[[ " ${1:-} " == *" $p "* ]] && continue
		port_in_use "$p" || { echo "$p"; return 0; }
	done
	die "no free loopback port found"
}

# cluster_id [FILE]: a new cluster id made as Kafka's Uuid.randomUuid makes
# one: 16 random bytes in URL-safe base64 without padding, drawn again while
# the id starts with '-' (one draw in 64: `kafka-storage format -t -xyz...`
# reads it as an option and fails with "expected one argument") or is one of
# the ids Kafka reserves (all zero bits; 1, the metadata topic's). The n-th
# draw is FILE's n-th 16-byte block (default /dev/urandom).
cluster_id() {
	local src="${1:-/dev/urandom}" id n
	for ((n = 0; n < 1000; n++)); do
		id="$(dd if="$src" bs=16 count=1 skip="$n" iflag=fullblock 2>/dev/null | base64 -w0 | tr '+/' '-_' | tr -d '=')"
		[[ ${#id} -eq 22 ]] || die "cluster id: cannot read 16 bytes from $src (draw $((n + 1)))"
		case "$id" in
		-* | AAAAAAAAAAAAAAAAAAAAAA | AAAAAAAAAAAAAAAAAAAAAQ) continue ;;
		esac
		echo "$id"
		return 0
	done
	die "cluster id: no usable id in 1000 draws from $src"
}

# write_config DIR PORT CPORT [NODE_ID VOTERS RF MIN_ISR]: a single node by default.
write_config() {
	local dir="$1" port="$2" cport="$3" node="${4:-1}" voters="${5:-1@127.0.0.1:$3}" rf="${6:-1}" isr="${7:-1}"
	cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=4
default.replication.factor=$rf
min.insync.replicas=$isr
unclean.leader.election.enable=false
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.check.interval.ms=300000
EOF
	cat >"$dir/log4j2.properties" <<EOF
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = $dir/server.log
appender.file.filePattern = $dir/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 1
rootLogger.level = ${INBOX_KAFKA_LOG_LEVEL:-WARN}
rootLogger.appenderRef.file.ref = file
# "Kafka Server started" (readiness marker) is logged here at INFO.
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
EOF
}

java_common() {
	# Flags shared by the format tool and the broker.
	echo "-Djava.awt.headless=true -Dlog4j2.configurationFile=$1/log4j2.properties"
}

alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

show_logs() {
	local dir="$1"
	for f in "$dir/server.log" "$dir/kafka.log"; do
		[[ -s "$f" ]] || continue
		echo "----- tail $f -----" >&2
		tail -n 40 "$f" >&2 || true
	done
}

# launch DIR: start the broker of DIR/server.properties in the background and
# write its pid to DIR/pid.
launch() {
	local dir="$1"
	# shellcheck disable=SC2046,SC2086
	nohup java ${INBOX_KAFKA_HEAP:--Xmx512m -Xms256m} -Xss1m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
		-XX:+ExitOnOutOfMemoryError $(java_common "$dir") \
		-cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
		>>"$dir/kafka.log" 2>&1 </dev/null &
	echo "$!" >"$dir/pid"
}

# One start attempt. Returns 0 when ready, 2 when the broker died because a
# port was taken (caller retries with new ports), 1 on other failures.
try_start() {
	local dir="$1" timeout="$2"
	local port cport cid pid
	port="$(free_port)"
	cport="$(free_port "$port")"
	rm -rf "$dir/data" "$dir/server.log"* "$dir/kafka.log" "$dir/pid" "$dir/brokers"
	mkdir -p "$dir/data"
	write_config "$dir" "$port" "$cport"
	echo "$port $cport" >"$dir/ports"

	cid="$(cluster_id)"
	# shellcheck disable=SC2046
	if ! java -Xshare:auto -XX:TieredStopAtLevel=1 -XX:+UseSerialGC $(java_common "$dir") \
		-cp "$LIBS/*" kafka.tools.StorageTool format -t "$cid" -c "$dir/server.properties" \
		>"$dir/format.log" 2>&1; then
		cat "$dir/format.log" >&2
		die "storage format failed"
	fi

	launch "$dir"
	pid="$(cat "$dir/pid")"

	local deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		if ! alive "$pid"; then
			wait "$pid" 2>/dev/null || true
			if grep -qs -e "Address already in use" -e "BindException" "$dir/server.log" "$dir/kafka.log"; then
				log "port $port/$cport taken, retrying with other ports"
				rm -f "$dir/pid"
				return 2
			fi
			show_logs "$dir"
			log "broker process $pid exited during startup"
			rm -f "$dir/pid"
			return 1
		fi
		if grep -qs "Kafka Server started" "$dir/server.log" && port_in_use "$port"; then
			echo "127.0.0.1:$port" >"$dir/brokers"
			return 0
		fi
		sleep 0.2
	done
	show_logs "$dir"
	log "broker not ready after ${timeout}s (ports $port/$cport); killing pid $pid"
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -f "$dir/pid"
	return 1
}

start() {
	local dir="${1:-}"
	[[ -n "$dir" ]] || die "usage: kafka.sh start DIR"
	need_java
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd)"
	if [[ -f "$dir/pid" ]] && alive "$(cat "$dir/pid")"; then
		die "a broker is already running for $dir (pid $(cat "$dir/pid")); stop it first"
	fi
	fetch
	local timeout="${INBOX_KAFKA_START_TIMEOUT:-90}" t0=$SECONDS rc _
	for _ in 1 2 3; do
		rc=0
		try_start "$dir" "$timeout" || rc=$?
		case "$rc" in
		0)
			log "broker up at $(cat "$dir/brokers") in $((SECONDS - t0))s (pid $(cat "$dir/pid"), dir $dir)"
			cat "$dir/brokers"
			return 0
			;;
		2) continue ;;
		*) die "broker failed to start (see $dir/server.log and $dir/kafka.log)" ;;
		esac
	done
	die "broker failed to start: ports kept colliding"
}

# stop_broker DIR: stop the broker of DIR, if it runs; keep DIR.
stop_broker() {
	local dir="$1"
	local pid=""
	[[ -f "$dir/pid" ]] && pid="$(cat "$dir/pid" 2>/dev/null || true)"
	# Only signal the pid if it is still our broker (guards against pid reuse).
	if alive "$pid" && grep -qsF "kafka.Kafka" "/proc/$pid/cmdline"; then
		kill -TERM "$pid" 2>/dev/null || true
		local _
		for _ in $(seq 1 100); do
			alive "$pid" || break
			sleep 0.2
		done
		if alive "$pid"; then
			log "broker pid $pid ignored TERM for 20s; sending KILL"
			kill -KILL "$pid" 2>/dev/null || true
			for _ in $(seq 1 50); do
				alive "$pid" || break
				sleep 0.1
			done
		fi
	fi
	wait "$pid" 2>/dev/null || true
}

stop() {
	local dir="${1:-}" nd
	[[ -n "$dir" ]] || die "usage: kafka.sh stop DIR"
	[[ -d "$dir" ]] || return 0
	if [[ -e "$dir/cluster" ]]; then
		for nd in "$dir"/node*; do
			[[ -d "$nd" ]] && stop_broker "$nd" &
		done
		wait
	else
		stop_broker "$dir"
	fi
	rm -rf "$dir"
}

restart() {
	local dir="${1:-}"
	[[ -n "$dir" ]] || die "usage: kafka.sh restart DIR"
	[[ -f "$dir/server.properties" && -f "$dir/ports" ]] || die "$dir holds no broker started by kafka.sh"
	dir="$(cd "$dir" && pwd)"
	need_java
	libs_ok || die "jars missing in $LIBS (run: kafka.sh fetch)"
	local port _ pid timeout="${INBOX_KAFKA_START_TIMEOUT:-90}" t0=$SECONDS
	read -r port _ <"$dir/ports"
	stop_broker "$dir"
	# The readiness marker is searched in a fresh log.
	[[ -f "$dir/server.log" ]] && mv -f "$dir/server.log" "$dir/server.log.before-restart"
	rm -f "$dir/pid" "$dir/server.log".[0-9]*
	launch "$dir"
	pid="$(cat "$dir/pid")"
	local deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		if ! alive "$pid"; then
			show_logs "$dir"
			rm -f "$dir/pid"
			die "broker process $pid exited during restart"
		fi
		if grep -qs "Kafka Server started" "$dir/server.log" && port_in_use "$port"; then
			log "broker restarted at 127.0.0.1:$port in $((SECONDS - t0))s (pid $pid)"
			echo "127.0.0.1:$port"
			return 0
		fi
		sleep 0.2
	done
	show_logs "$dir"
	die "broker not ready ${timeout}s after restart (pid $pid left running; kafka.sh stop $dir)"
}

# --- three-node cluster (docs/RELIABILITY.md, "Failover") -------------------

readonly CLUSTER_NODES=3

# cluster_start DIR: three combined KRaft nodes in DIR/node1..3 (one cluster id,
# static voters), replication factor 3, min.insync.replicas 2, no unclean
# leader election. Prints the bootstrap list (also DIR/brokers).
cluster_start() {
	local dir="${1:-}" n voters='' list='' cid t0=$SECONDS timeout="${INBOX_KAFKA_START_TIMEOUT:-120}"
	[[ -n "$dir" ]] || die "usage: kafka.sh cluster DIR"
	need_java
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd)"
	[[ -e "$dir/cluster" ]] && die "$dir already holds a cluster; stop it first"
	fetch
	local -a ports=() cports=()
	local used=''
	for ((n = 1; n <= CLUSTER_NODES; n++)); do
		local p c
		p="$(free_port "$used")"
		used+=" $p"
		c="$(free_port "$used")"
		used+=" $c"
		ports[n]=$p
		cports[n]=$c
		voters+="${voters:+,}$n@127.0.0.1:$c"
		list+="${list:+,}127.0.0.1:$p"
	done
	cid="$(cluster_id)"
	for ((n = 1; n <= CLUSTER_NODES; n++)); do
		local nd="$dir/node$n"
		mkdir -p "$nd/data"
		write_config "$nd" "${ports[n]}" "${cports[n]}" "$n" "$voters" 3 2
		echo "${ports[n]} ${cports[n]}" >"$nd/ports"
		echo "127.0.0.1:${ports[n]}" >"$nd/brokers"
		# shellcheck disable=SC2046
		if ! java -Xshare:auto -XX:TieredStopAtLevel=1 -XX:+UseSerialGC $(java_common "$nd") \
			-cp "$LIBS/*" kafka.tools.StorageTool format -t "$cid" -c "$nd/server.properties" \
			>"$nd/format.log" 2>&1; then
			cat "$nd/format.log" >&2
			die "storage format of node $n failed"
		fi
	done
	: >"$dir/cluster"
	for ((n = 1; n <= CLUSTER_NODES; n++)); do
		launch "$dir/node$n"
	done
	local deadline=$((SECONDS + timeout)) ready
	while ((SECONDS < deadline)); do
		ready=0
		for ((n = 1; n <= CLUSTER_NODES; n++)); do
			local nd="$dir/node$n"
			alive "$(cat "$nd/pid")" || { show_logs "$nd"; die "node $n exited during startup"; }
			if grep -qs "Kafka Server started" "$nd/server.log" && port_in_use "${ports[n]}"; then
				ready=$((ready + 1))
			fi
		done
		if ((ready == CLUSTER_NODES)); then
			echo "$list" >"$dir/brokers"
			log "cluster of $CLUSTER_NODES nodes up at $list in $((SECONDS - t0))s (dir $dir)"
			echo "$list"
			return 0
		fi
		sleep 0.3
	done
	for ((n = 1; n <= CLUSTER_NODES; n++)); do show_logs "$dir/node$n"; done
	die "cluster not ready after ${timeout}s (kafka.sh stop $dir)"
}

# kill_node DIR: SIGKILL the broker of DIR (a node dir of a cluster, or a
# single broker's dir): a crash. `kafka.sh restart DIR` starts it again.
kill_node() {
	local dir="${1:-}" pid=""
	[[ -n "$dir" && -f "$dir/server.properties" ]] || die "usage: kafka.sh kill DIR (a broker's dir)"
	[[ -f "$dir/pid" ]] && pid="$(cat "$dir/pid" 2>/dev/null || true)"
	alive "$pid" && grep -qsF "kafka.Kafka" "/proc/$pid/cmdline" || die "no broker running in $dir"
	kill -KILL "$pid"
	local _
	for _ in $(seq 1 100); do
		alive "$pid" || break
		sleep 0.05
	done
	log "killed broker pid $pid ($dir)"
}

case "${1:-}" in
fetch) fetch; echo "$LIBS" ;;
libs) echo "$LIBS" ;;
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
restart) restart "${2:-}" ;;
cluster) cluster_start "${2:-}" ;;
kill) kill_node "${2:-}" ;;
cluster-id) cluster_id "${2:-}" ;;
*)
	echo "usage: $0 fetch | libs | start DIR | stop DIR | restart DIR | cluster DIR | kill DIR | cluster-id [FILE]" >&2
	exit 2
	;;
esac
