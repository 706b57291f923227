#!/usr/bin/env bash
# Throwaway PostgreSQL server on loopback, for the test suite.
#
# Usage:
#   scripts/postgres.sh start DIR   # create DIR (absent or empty), init + start a server in it
#   scripts/postgres.sh stop DIR    # stop that server and remove DIR (no-op if DIR is missing)
#   scripts/postgres.sh restart DIR # stop that server (fast shutdown) and start it again:
#                                   # same port, same data; prints the DSN when it is ready
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
	echo "usage: $0 start|stop|restart DIR" >&2
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

[[ $# -eq 2 && -n $2 ]] || usage
case $1 in
start) cmd_start "$2" ;;
stop) cmd_stop "$2" ;;
restart) cmd_restart "$2" ;;
*) usage ;;
esac
