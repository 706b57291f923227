#!/usr/bin/env bash
# Run a command with throwaway test services on loopback.
#
# Usage:
#   scripts/with-services.sh [--postgres] [--mariadb] [--kafka | --kafka-cluster] [--postgres-standby sync|async]
#                            [--mariadb-replica semisync|async] -- CMD [ARGS...]
#
# Each requested service whose variable is unset or empty is started (in parallel) in a
# fresh temp dir, and the variable is exported for CMD:
#   --postgres  INBOX_POSTGRES_DSN   via scripts/postgres.sh (DIR/dsn)
#   --mariadb   INBOX_MYSQL_DSN      via scripts/mariadb.sh  (DIR/dsn)
#   --kafka     INBOX_KAFKA_BROKERS  via scripts/kafka.sh    (DIR/brokers, host:port)
# and so is the service's DIR, for CMD to run `scripts/<service>.sh restart "$DIR"`:
#   INBOX_POSTGRES_DIR, INBOX_MYSQL_DIR, INBOX_KAFKA_DIR
# (only for services started here: a service given by its variable has no DIR).
# --kafka-cluster starts a three-node cluster instead of one broker (scripts/kafka.sh
# cluster): INBOX_KAFKA_BROKERS lists the three, INBOX_KAFKA_DIR holds node1..3.
# --postgres-standby MODE (implies --postgres) adds a streaming-replication standby of that
# server (scripts/postgres.sh standby, MODE sync or async) and exports
#   INBOX_POSTGRES_STANDBY_DIR   its DIR
#   INBOX_POSTGRES_REPLICATION   MODE
#   INBOX_POSTGRES_FAILOVER_DSN  one DSN over both servers (target_session_attrs=read-write)
# (INBOX_POSTGRES_DSN stays the primary's).
# --mariadb-replica MODE (implies --mariadb) adds a GTID replica of that server
# (scripts/mariadb.sh replica, MODE semisync or async) and exports
#   INBOX_MYSQL_REPLICA_DIR   its DIR
#   INBOX_MYSQL_REPLICATION   MODE
# Everything it started is stopped again on exit (also on failure, INT and TERM), and it
# exits with CMD's status. If a service fails to start, its log tail is printed, CMD is
# not run and the exit status is 1. Progress goes to stderr, prefixed "with-services:".
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
readonly SCRIPT_DIR

declare -A SCRIPT=([postgres]=postgres.sh [mariadb]=mariadb.sh [kafka]=kafka.sh)
declare -A VAR=([postgres]=INBOX_POSTGRES_DSN [mariadb]=INBOX_MYSQL_DSN [kafka]=INBOX_KAFKA_BROKERS)
declare -A OUTFILE=([postgres]=dsn [mariadb]=dsn [kafka]=brokers)
declare -A DIRVAR=([postgres]=INBOX_POSTGRES_DIR [mariadb]=INBOX_MYSQL_DIR [kafka]=INBOX_KAFKA_DIR)

log() { printf 'with-services: %s\n' "$*" >&2; }
usage() {
	echo "usage: $0 [--postgres] [--mariadb] [--kafka] -- CMD [ARGS...]" >&2
	exit 2
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1fs", b-a}'; }

wanted=()
STANDBY_MODE=''
REPLICA_MODE=''
KAFKA_START=start
while (($#)); do
	case $1 in
	--postgres) wanted+=(postgres) ;;
	--mariadb | --mysql) wanted+=(mariadb) ;;
	--kafka) wanted+=(kafka) ;;
	--kafka-cluster)
		KAFKA_START=cluster
		wanted+=(kafka)
		;;
	--mariadb-replica)
		[[ ${2:-} == semisync || ${2:-} == async ]] || {
			log "--mariadb-replica needs semisync or async"
			usage
		}
		REPLICA_MODE=$2
		wanted+=(mariadb)
		shift
		;;
	--postgres-standby)
		[[ ${2:-} == sync || ${2:-} == async ]] || {
			log "--postgres-standby needs sync or async"
			usage
		}
		STANDBY_MODE=$2
		wanted+=(postgres)
		shift
		;;
	--)
		shift
		break
		;;
	-h | --help) usage ;;
	*)
		log "unknown argument: $1"
		usage
		;;
	esac
	shift
done
(($#)) || usage

# run_script SERVICE COMMAND ARGS...: scripts/<service>.sh COMMAND ARGS...
run_script() {
	local script=$SCRIPT_DIR/${SCRIPT[$1]}
	shift
	if [[ -x $script ]]; then
		"$script" "$@"
	else
		bash "$script" "$@"
	fi
}

WORK=''
STARTED=()
declare -A PIDS=()

# shellcheck disable=SC2317 # invoked via trap
cleanup() {
	set +e
	local s pids=()
	((${#STARTED[@]})) || return 0
	# Let in-flight starts finish first, so that stop sees what they created.
	for s in "${STARTED[@]}"; do
		wait "${PIDS[$s]}" 2>/dev/null
	done
	if [[ -e $WORK/mariadb-replica ]]; then
		log "stopping the mariadb replica"
		run_script mariadb stop "$WORK/mariadb-replica" >>"$WORK/mariadb-replica.stop.log" 2>&1 ||
			tail -n 20 "$WORK/mariadb-replica.stop.log" >&2
	fi
	if [[ -e $WORK/postgres-standby ]]; then
		log "stopping the postgres standby"
		run_script postgres stop "$WORK/postgres-standby" >>"$WORK/postgres-standby.stop.log" 2>&1 ||
			tail -n 20 "$WORK/postgres-standby.stop.log" >&2
	fi
	for s in "${STARTED[@]}"; do
		log "stopping $s"
		run_script "$s" stop "$WORK/$s" >>"$WORK/$s.stop.log" 2>&1 &
		pids+=("$!")
	done
	local failed=0 i
	for i in "${!pids[@]}"; do
		if ! wait "${pids[$i]}"; then
			failed=1
			log "stopping ${STARTED[$i]} failed:"
			tail -n 20 "$WORK/${STARTED[$i]}.stop.log" >&2
		fi
	done
	if ((failed)); then
		log "leaving $WORK behind"
	else
		rm -rf -- "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

to_start=()
for s in "${wanted[@]}"; do
	var=${VAR[$s]}
	if [[ -n ${!var:-} ]]; then
		log "$var is already set; not starting $s"
	elif [[ ! -f $SCRIPT_DIR/${SCRIPT[$s]} ]]; then
		log "cannot start $s: $SCRIPT_DIR/${SCRIPT[$s]} does not exist"
		exit 1
	elif [[ " ${to_start[*]} " != *" $s "* ]]; then
		to_start+=("$s")
	fi
done

if ((${#to_start[@]})); then
	# Short base path: the services put unix sockets in their dirs (108-byte limit).
	base=${TMPDIR:-/tmp}
	((${#base} <= 40)) || base=/tmp
	WORK=$(mktemp -d "$base/inbox-services.XXXXXX")
	# Servers run as their own system users (postgres, mysql) and must reach their dirs.
	chmod 0711 "$WORK"
	t0=$(now)
	for s in "${to_start[@]}"; do
		log "starting $s in $WORK/$s"
		start_cmd=start
		[[ $s == kafka ]] && start_cmd=$KAFKA_START
		run_script "$s" "$start_cmd" "$WORK/$s" >"$WORK/$s.out" 2>"$WORK/$s.log" &
		PIDS[$s]=$!
		STARTED+=("$s")
	done
	failed=()
	for s in "${to_start[@]}"; do
		if wait "${PIDS[$s]}" && [[ -s $WORK/$s/${OUTFILE[$s]} ]]; then
			value=$(<"$WORK/$s/${OUTFILE[$s]}")
			export "${VAR[$s]}=$value"
			export "${DIRVAR[$s]}=$WORK/$s"
			log "$s ready after $(since "$t0"): ${VAR[$s]}=$value"
		else
			failed+=("$s")
		fi
	done
	for s in "${failed[@]}"; do
		log "$s failed to start; last lines of its log:"
		tail -n 40 "$WORK/$s.log" | sed "s/^/with-services: [$s] /" >&2
	done
	((${#failed[@]} == 0)) || exit 1
	log "all services up after $(since "$t0")"
fi

if [[ -n $STANDBY_MODE ]]; then
	[[ -n ${INBOX_POSTGRES_DIR:-} ]] || {
		log "--postgres-standby needs a PostgreSQL server started here (INBOX_POSTGRES_DSN is set)"
		exit 1
	}
	log "starting a $STANDBY_MODE standby of postgres in $WORK/postgres-standby"
	if ! run_script postgres standby "$INBOX_POSTGRES_DIR" "$WORK/postgres-standby" "$STANDBY_MODE" \
		>"$WORK/postgres-standby.out" 2>"$WORK/postgres-standby.log"; then
		tail -n 40 "$WORK/postgres-standby.log" | sed 's/^/with-services: [postgres-standby] /' >&2
		exit 1
	fi
	export INBOX_POSTGRES_STANDBY_DIR=$WORK/postgres-standby INBOX_POSTGRES_REPLICATION=$STANDBY_MODE
	INBOX_POSTGRES_FAILOVER_DSN=$(run_script postgres multi-dsn "$INBOX_POSTGRES_DIR" "$INBOX_POSTGRES_STANDBY_DIR")
	export INBOX_POSTGRES_FAILOVER_DSN
	log "postgres standby ready: INBOX_POSTGRES_FAILOVER_DSN=$INBOX_POSTGRES_FAILOVER_DSN"
fi

if [[ -n $REPLICA_MODE ]]; then
	[[ -n ${INBOX_MYSQL_DIR:-} ]] || {
		log "--mariadb-replica needs a MariaDB server started here (INBOX_MYSQL_DSN is set)"
		exit 1
	}
	log "starting a $REPLICA_MODE replica of mariadb in $WORK/mariadb-replica"
	if ! run_script mariadb replica "$INBOX_MYSQL_DIR" "$WORK/mariadb-replica" "$REPLICA_MODE" \
		>"$WORK/mariadb-replica.out" 2>"$WORK/mariadb-replica.log"; then
		tail -n 40 "$WORK/mariadb-replica.log" | sed 's/^/with-services: [mariadb-replica] /' >&2
		exit 1
	fi
	export INBOX_MYSQL_REPLICA_DIR=$WORK/mariadb-replica INBOX_MYSQL_REPLICATION=$REPLICA_MODE
	log "mariadb replica ready: $(<"$WORK/mariadb-replica.out")"
fi

log "running: $*"
set +e
"$@"
status=$?
set -e
((${#STARTED[@]} == 0)) || log "command exited with status $status"
exit "$status"
