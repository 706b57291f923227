#!/usr/bin/env bash
# Throwaway PostgreSQL server on loopback, for the test suite.
#
# Usage:
#   scripts/postgres.sh start DIR   # create DIR (absent or empty), init + start a server in it
#   scripts/postgres.sh stop DIR    # stop that server and remove DIR (no-op if DIR is missing)
#   scripts/postgres.sh restart DIR # stop that server (fast shutdown) and start it again:
#                                   # same port, same data; prints the DSN when it is ready
#
# Streaming replication (docs/RELIABILITY.md, "Failover"):
#   scripts/postgres.sh standby PRIMARY_DIR DIR sync|async
#       a standby of PRIMARY_DIR's server in DIR (absent or empty), by pg_basebackup,
#       started on a free port; prints its DSN (also DIR/dsn). sync sets
#       synchronous_standby_names and synchronous_commit=on on the primary (ALTER SYSTEM,
#       which the base backup copies: a promoted standby waits for the next standby in
#       turn) and returns once the standby is the synchronous one; async returns once it
#       streams.
#   scripts/postgres.sh rejoin DIR PRIMARY_DIR sync|async
#       DIR (a former primary, killed or stopped) becomes a fresh standby of PRIMARY_DIR's
#       server: a new base backup replaces its data; same port as before.
#   scripts/postgres.sh promote DIR    # promote the standby in DIR; returns once it accepts writes
#   scripts/postgres.sh kill DIR       # SIGKILL the server and all its processes (a crash)
#   scripts/postgres.sh pause-wal DIR  # SIGSTOP the WAL senders of DIR's server: its standbys
#                                      # stop receiving (a lagging link); kill ends them, or
#   scripts/postgres.sh resume-wal DIR # SIGCONT them
#   scripts/postgres.sh multi-dsn DIR...
#       one DSN over the servers (host=a,b port=p,q ... target_session_attrs=read-write), as
#       a production service connects to a replicated cluster
#
# start writes the DSN (libpq key=value form) to DIR/dsn and prints it on stdout:
#   host=127.0.0.1 port=PORT user=postgres dbname=inbox_test sslmode=disable
# Everything else goes to stderr; the server log is DIR/postgres.log.
# The server listens on 127.0.0.1 only (free port picked at random), unix socket in DIR,
# trust auth. Binaries: /usr/local/bin, else the newest /usr/lib/postgresql/*/bin, else
# PATH; if none, `apt-get install postgresql` (needs root or passwordless sudo).
# As root, initdb/pg_ctl run as the `postgres` system user (created if missing).
# Env: PG_BINDIR (force a bin dir), PG_START_TIMEOUT (seconds, default 60).
set -euo pipefail

readonly MARKER=.inbox-postgres
readonly DBNAME=inbox_test
readonly START_TIMEOUT=${PG_START_TIMEOUT:-60}
SCRIPT_TAG=postgres.sh
# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

usage() {
	echo "usage: $0 start|stop|restart|promote|kill|pause-wal|resume-wal DIR" >&2
	echo "       $0 standby PRIMARY_DIR DIR sync|async | rejoin DIR PRIMARY_DIR sync|async | multi-dsn DIR..." >&2
	exit 2
}

# has_server_bins DIR: DIR contains initdb, pg_ctl and postgres.
has_server_bins() {
	[[ -x $1/initdb && -x $1/pg_ctl && -x $1/postgres ]]
}

find_bindir() {
	local d p
	if [[ -n ${PG_BINDIR:-} ]]; then
		echo "$PG_BINDIR"
		return 0
	fi
	if has_server_bins /usr/local/bin; then
		echo /usr/local/bin
		return 0
	fi
	d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	if has_server_bins "$d"; then
		echo "$d"
		return 0
	fi
	if p=$(command -v pg_ctl 2>/dev/null) && has_server_bins "$(dirname "$p")"; then
		dirname "$p"
		return 0
	fi
	return 1
}

# find_client NAME BINDIR: client tool next to the real server binaries, else on PATH.
find_client() {
	local name=$1 bindir=$2 real d
	real=$(dirname "$(readlink -f "$bindir/pg_ctl")")
	for d in "$real" "$bindir"; do
		if [[ -x $d/$name ]]; then
			echo "$d/$name"
			return 0
		fi
	done
	command -v "$name" 2>/dev/null
}

# run_pg CMD...: run as the postgres OS user when we are root (initdb/pg_ctl refuse root).
run_pg() {
	if [[ $EUID -ne 0 ]]; then
		"$@"
	elif command -v runuser >/dev/null 2>&1; then
		runuser -u postgres -- "$@"
	else
		su -s /bin/sh postgres -c "$(printf '%q ' "$@")"
	fi
}

# postmaster_pid DIR: pid of a live postmaster for DIR/data, if any.
postmaster_pid() {
	local pid comm
	[[ -f $1/data/postmaster.pid ]] || return 1
	read -r pid <"$1/data/postmaster.pid" || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	alive "$pid" || return 1
	comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
	[[ $comm == postgres* || $comm == postmaster* ]] || return 1
	echo "$pid"
}

# alive PID: process exists and is not a zombie (PID 1 may not reap in containers).
alive() {
	local st
	kill -0 "$1" 2>/dev/null || return 1
	st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	st=${st##*) }
	[[ ${st%% *} != Z ]]
}

stop_server() {
	local dir=$1 bindir pid i
	pid=$(postmaster_pid "$dir") || return 0
	log "stopping server (pid $pid)"
	if bindir=$(find_bindir) && run_pg "$bindir/pg_ctl" stop -D "$dir/data" -m fast -w -t 60 >/dev/null 2>&1; then
		:
	else
		kill -INT "$pid" 2>/dev/null || true # fast shutdown
	fi
	for ((i = 0; i < 600; i++)); do
		alive "$pid" || return 0
		sleep 0.1
	done
	log "server did not stop in 60s; killing it"
	kill -KILL "$pid" 2>/dev/null || true
}

cmd_start() {
	local dir=$1 bindir pgctl psql pg_isready port attempt dsn t0 i
	t0=$(date +%s.%N)
	if [[ -e $dir && -n $(ls -A -- "$dir") ]]; then
		die "$dir exists and is not empty"
	fi
	mkdir -p -- "$dir"
	dir=$(cd -- "$dir" && pwd -P)
	[[ $dir != *"'"* && $dir != *[[:space:]]* ]] || die "DIR must not contain quotes or spaces: $dir"
	# The socket path DIR/.s.PGSQL.NNNNN.lock must fit in sun_path (108 bytes).
	((${#dir} <= 85)) || die "DIR path too long for a unix socket (${#dir} > 85 chars): $dir"
	: >"$dir/$MARKER"

	if [[ -n ${PG_BINDIR:-} ]] && ! has_server_bins "$PG_BINDIR"; then
		die "PG_BINDIR=$PG_BINDIR lacks initdb/pg_ctl/postgres"
	fi
	if ! bindir=$(find_bindir); then
		apt_install "$dir/apt.log" postgresql
		# The package creates and starts a "main" cluster on 5432; we don't need it.
		if command -v service >/dev/null 2>&1; then
			as_root service postgresql stop >/dev/null 2>&1 || true
		fi
		bindir=$(find_bindir) || die "PostgreSQL binaries still not found after apt-get install"
	fi
	pgctl=$bindir/pg_ctl
	psql=$(find_client psql "$bindir") || die "psql not found (install postgresql-client)"
	pg_isready=$(find_client pg_isready "$bindir") || pg_isready=
	log "using $("$bindir/postgres" --version) from $bindir"

	if [[ $EUID -eq 0 ]]; then
		if ! id postgres >/dev/null 2>&1; then
			log "creating system user postgres"
			useradd --system --user-group --no-create-home --home-dir /var/lib/postgresql \
				--shell /bin/bash postgres
		fi
		chown postgres: "$dir" "$dir/$MARKER"
		chmod 0755 "$dir"
		run_pg test -w "$dir" ||
			die "user postgres cannot write $dir (a parent directory is not traversable? try chmod o+x on it)"
	fi

	# From here on, a failure stops whatever got started but keeps DIR for its logs.
	START_DIR=$dir
	trap 'stop_server "$START_DIR"; log "start failed; logs kept in $START_DIR (run: $0 stop $START_DIR)"' EXIT

	if ! run_pg "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale --no-sync \
		>"$dir/initdb.log" 2>&1; then
		tail -n 30 "$dir/initdb.log" >&2 || true
		die "initdb failed"
	fi
	cat >>"$dir/data/postgresql.conf" <<EOF

# --- added by scripts/postgres.sh (throwaway test server) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = 128MB
max_locks_per_transaction = 256
EOF
	cat >"$dir/data/pg_hba.conf" <<'EOF'
# scripts/postgres.sh: throwaway test server, trust on the socket and loopback only.
local all         all               trust
host  all         all  127.0.0.1/32 trust
host  all         all  ::1/128      trust
local replication all               trust
host  replication all  127.0.0.1/32 trust
EOF

	for attempt in 1 2 3; do
		port=$(free_port) || die "no free TCP port found"
		rm -f -- "$dir/postgres.log"
		if run_pg "$pgctl" start -w -t "$START_TIMEOUT" -D "$dir/data" -l "$dir/postgres.log" \
			-o "-p $port" >"$dir/pg_ctl.log" 2>&1; then
			break
		fi
		if grep -q 'Address already in use' "$dir/postgres.log" 2>/dev/null && ((attempt < 3)); then
			log "port $port was taken meanwhile; retrying with another"
			continue
		fi
		tail -n 30 "$dir/postgres.log" "$dir/pg_ctl.log" >&2 || true
		die "pg_ctl start failed"
	done

	dsn="host=127.0.0.1 port=$port user=postgres dbname=$DBNAME sslmode=disable"
	if [[ -n $pg_isready ]]; then
		for ((i = 0; i < 100; i++)); do
			"$pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres && break
			sleep 0.1
		done
	fi
	if ! "$psql" -X -q -v ON_ERROR_STOP=1 "${dsn/dbname=$DBNAME/dbname=postgres}" \
		-c "CREATE DATABASE $DBNAME" >"$dir/createdb.log" 2>&1; then
		tail -n 30 "$dir/createdb.log" "$dir/postgres.log" >&2 || true
		die "could not create database $DBNAME"
	fi

	printf '%s\n' "$dsn" >"$dir/dsn"
	trap - EXIT
	log "ready on 127.0.0.1:$port in $(elapsed_since "$t0")"
	printf '%s\n' "$dsn"
}

cmd_restart() {
	local dir=$1 bindir port dsn t0
	t0=$(date +%s.%N)
	[[ -d $dir ]] || die "$dir does not exist"
	dir=$(cd -- "$dir" && pwd -P)
	[[ -f $dir/$MARKER && -f $dir/dsn ]] || die "$dir holds no server started by postgres.sh"
	dsn=$(<"$dir/dsn")
	port=$(sed -n 's/.*port=\([0-9]*\).*/\1/p' <<<"$dsn")
	[[ -n $port ]] || die "no port in $dir/dsn"
	bindir=$(find_bindir) || die "PostgreSQL binaries not found"
	stop_server "$dir"
	if ! run_pg "$bindir/pg_ctl" start -w -t "$START_TIMEOUT" -D "$dir/data" -l "$dir/postgres.log" \
		-o "-p $port" >"$dir/pg_ctl.log" 2>&1; then
		tail -n 30 "$dir/postgres.log" "$dir/pg_ctl.log" >&2 || true
		die "pg_ctl start failed after stop (port $port)"
	fi
	log "restarted on 127.0.0.1:$port in $(elapsed_since "$t0")"
	printf '%s\n' "$dsn"
}

# --- streaming replication (docs/RELIABILITY.md, "Failover") ---------------

readonly STANDBY_NAME=inbox_standby

# dsn_port DIR: the port of the server started in DIR.
dsn_port() {
	local dsn port
	[[ -f $1/$MARKER && -f $1/dsn ]] || die "$1 holds no server started by postgres.sh"
	dsn=$(<"$1/dsn")
	port=$(sed -n 's/.*port=\([0-9]*\).*/\1/p' <<<"$dsn")
	[[ -n $port ]] || die "no port in $1/dsn"
	echo "$port"
}

# psql_at PORT SQL: run SQL on the server at PORT (database postgres), print the result.
psql_at() {
	local bindir psql
	bindir=$(find_bindir) || die "PostgreSQL binaries not found"
	psql=$(find_client psql "$bindir") || die "psql not found"
	"$psql" -X -q -A -t -v ON_ERROR_STOP=1 \
		"host=127.0.0.1 port=$1 user=postgres dbname=postgres sslmode=disable connect_timeout=5" -c "$2"
}

# wait_for PORT SQL WANT SECONDS: until SQL prints WANT on the server at PORT.
wait_for() {
	local i out=''
	for ((i = 0; i < $4 * 10; i++)); do
		out=$(psql_at "$1" "$2" 2>/dev/null) || true
		[[ $out == "$3" ]] && return 0
		sleep 0.1
	done
	die "timed out after $4 s waiting for '$2' to be '$3' on port $1 (last: '$out')"
}

# sync_mode PRIMARY_PORT MODE: set (sync) or clear (async) synchronous replication.
sync_mode() {
	case $2 in
	sync)
		psql_at "$1" "ALTER SYSTEM SET synchronous_standby_names = '$STANDBY_NAME'" >/dev/null
		psql_at "$1" "ALTER SYSTEM SET synchronous_commit = 'on'" >/dev/null
		;;
	async) psql_at "$1" "ALTER SYSTEM RESET synchronous_standby_names" >/dev/null ;;
	*) die "replication mode must be sync or async, not '$2'" ;;
	esac
	psql_at "$1" "SELECT pg_reload_conf()" >/dev/null
}

# base_backup PRIMARY_PORT DIR PORT MODE: DIR/data becomes a standby of the server at
# PRIMARY_PORT, started on PORT; waits until it streams (sync: as the synchronous one).
base_backup() {
	local pport=$1 dir=$2 port=$3 mode=$4 bindir conninfo want
	bindir=$(find_bindir) || die "PostgreSQL binaries not found"
	sync_mode "$pport" "$mode"
	rm -rf -- "$dir/data"
	conninfo="host=127.0.0.1 port=$pport user=postgres application_name=$STANDBY_NAME sslmode=disable"
	if ! run_pg "$(find_client pg_basebackup "$bindir")" -d "$conninfo" -D "$dir/data" -X stream \
		--checkpoint=fast --no-sync >"$dir/basebackup.log" 2>&1; then
		tail -n 30 "$dir/basebackup.log" >&2 || true
		die "pg_basebackup from port $pport failed"
	fi
	run_pg touch "$dir/data/standby.signal"
	# Appended as the server user (the data dir is theirs); later lines win.
	printf '%s\n' "" "# --- added by scripts/postgres.sh (standby of port $pport) ---" \
		"unix_socket_directories = '$dir'" "primary_conninfo = '$conninfo'" \
		"wal_receiver_status_interval = 1s" | run_pg tee -a "$dir/data/postgresql.conf" >/dev/null
	# A killed postmaster leaves its socket lock file; where PID 1 does not
	# reap, the dead process lingers as a zombie whose pid the new server's
	# check finds "alive". The server of DIR is known to be gone here.
	rm -f -- "$dir/postgres.log" "$dir"/.s.PGSQL.*
	if ! run_pg "$bindir/pg_ctl" start -w -t "$START_TIMEOUT" -D "$dir/data" -l "$dir/postgres.log" \
		-o "-p $port" >"$dir/pg_ctl.log" 2>&1; then
		tail -n 30 "$dir/postgres.log" "$dir/pg_ctl.log" >&2 || true
		die "standby failed to start on port $port"
	fi
	want=streaming
	[[ $mode == sync ]] && want="streaming sync"
	wait_for "$pport" "SELECT state || CASE WHEN sync_state = 'sync' THEN ' sync' ELSE '' END FROM pg_stat_replication WHERE application_name = '$STANDBY_NAME'" "$want" 60
	printf 'host=127.0.0.1 port=%s user=postgres dbname=%s sslmode=disable\n' "$port" "$DBNAME" >"$dir/dsn"
}

cmd_standby() {
	local pdir=$1 dir=$2 mode=$3 pport port t0
	t0=$(date +%s.%N)
	pdir=$(cd -- "$pdir" && pwd -P)
	pport=$(dsn_port "$pdir")
	if [[ -e $dir && -n $(ls -A -- "$dir") ]]; then
		die "$dir exists and is not empty"
	fi
	mkdir -p -- "$dir"
	dir=$(cd -- "$dir" && pwd -P)
	((${#dir} <= 85)) || die "DIR path too long for a unix socket (${#dir} > 85 chars): $dir"
	: >"$dir/$MARKER"
	if [[ $EUID -eq 0 ]]; then
		chown postgres: "$dir" "$dir/$MARKER"
		chmod 0755 "$dir"
	fi
	port=$(free_port) || die "no free TCP port found"
	base_backup "$pport" "$dir" "$port" "$mode"
	log "$mode standby of port $pport ready on 127.0.0.1:$port in $(elapsed_since "$t0")"
	cat "$dir/dsn"
}

cmd_rejoin() {
	local dir=$1 pdir=$2 mode=$3 pport port t0
	t0=$(date +%s.%N)
	dir=$(cd -- "$dir" && pwd -P)
	pdir=$(cd -- "$pdir" && pwd -P)
	port=$(dsn_port "$dir")
	pport=$(dsn_port "$pdir")
	stop_server "$dir"
	base_backup "$pport" "$dir" "$port" "$mode"
	log "rejoined as a $mode standby of port $pport on 127.0.0.1:$port in $(elapsed_since "$t0")"
	cat "$dir/dsn"
}

cmd_promote() {
	local dir=$1 port bindir t0
	t0=$(date +%s.%N)
	dir=$(cd -- "$dir" && pwd -P)
	port=$(dsn_port "$dir")
	bindir=$(find_bindir) || die "PostgreSQL binaries not found"
	if ! run_pg "$bindir/pg_ctl" promote -w -t 60 -D "$dir/data" >"$dir/promote.log" 2>&1; then
		tail -n 20 "$dir/promote.log" "$dir/postgres.log" >&2 || true
		die "pg_ctl promote failed"
	fi
	wait_for "$port" "SELECT pg_is_in_recovery()" f 60
	log "promoted 127.0.0.1:$port in $(elapsed_since "$t0")"
	cat "$dir/dsn"
}

# server_procs DIR: the postmaster of DIR, then its children.
server_procs() {
	local pid
	pid=$(postmaster_pid "$1") || return 0
	echo "$pid"
	pgrep -P "$pid" 2>/dev/null || true
}

cmd_kill() {
	local dir=$1 pids i
	dir=$(cd -- "$dir" && pwd -P)
	[[ -f $dir/$MARKER ]] || die "$dir was not created by $SCRIPT_TAG (no $MARKER); not touching it"
	mapfile -t pids < <(server_procs "$dir")
	((${#pids[@]})) || die "no server running in $dir"
	# All at once, children included: a backend left behind could still commit.
	kill -KILL "${pids[@]}" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		alive "${pids[0]}" || break
		sleep 0.05
	done
	log "killed the server in $dir (SIGKILL to ${#pids[@]} processes)"
}

# wal_senders DIR: the WAL sender processes of DIR's server.
wal_senders() {
	local pid c
	pid=$(postmaster_pid "$1") || die "no server running in $1"
	for c in $(pgrep -P "$pid" 2>/dev/null); do
		if tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q walsender; then
			echo "$c"
		fi
	done
	return 0
}

cmd_signal_wal() {
	local sig=$1 dir=$2 pids
	dir=$(cd -- "$dir" && pwd -P)
	[[ -f $dir/$MARKER ]] || die "$dir was not created by $SCRIPT_TAG (no $MARKER); not touching it"
	mapfile -t pids < <(wal_senders "$dir")
	((${#pids[@]})) || die "no WAL sender running in $dir"
	kill "-$sig" "${pids[@]}"
	log "SIG$sig to ${#pids[@]} WAL sender(s) of $dir"
}

cmd_multi_dsn() {
	local hosts='' ports='' d p
	for d in "$@"; do
		p=$(dsn_port "$d")
		hosts+=${hosts:+,}127.0.0.1
		ports+=${ports:+,}$p
	done
	printf 'host=%s port=%s user=postgres dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=5\n' \
		"$hosts" "$ports" "$DBNAME"
}

case ${1:-} in
start | stop | restart | promote | kill | pause-wal | resume-wal) [[ $# -eq 2 && -n $2 ]] || usage ;;
standby | rejoin) [[ $# -eq 4 && -n $2 && -n $3 ]] || usage ;;
multi-dsn) (($# >= 2)) || usage ;;
*) usage ;;
esac
case $1 in
start) cmd_start "$2" ;;
stop) cmd_stop "$2" ;;
restart) cmd_restart "$2" ;;
standby) cmd_standby "$2" "$3" "$4" ;;
rejoin) cmd_rejoin "$2" "$3" "$4" ;;
promote) cmd_promote "$2" ;;
kill) cmd_kill "$2" ;;
pause-wal) cmd_signal_wal STOP "$2" ;;
resume-wal) cmd_signal_wal CONT "$2" ;;
multi-dsn)
	shift
	cmd_multi_dsn "$@"
	;;
esac
