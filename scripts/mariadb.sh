#!/usr/bin/env bash
# Throwaway MariaDB server on loopback, for the test suite.
#
# Usage:
#   scripts/mariadb.sh start DIR   # create DIR (absent or empty), init + start a server in it
#   scripts/mariadb.sh stop DIR    # stop that server and remove DIR (no-op if DIR is missing)
#   scripts/mariadb.sh restart DIR # stop that server (clean shutdown) and start it again:
#                                  # same port, same data; prints the DSN when it is ready
#
# Replication (docs/RELIABILITY.md, "Failover"):
#   scripts/mariadb.sh replica PRIMARY_DIR DIR semisync|async
#       restart PRIMARY_DIR's server with a binary log (GTID, ROW; semisync: semi-synchronous
#       replication with AFTER_SYNC and a one-hour timeout, so it never falls back to
#       asynchronous), start a read-only replica in DIR replicating from it (GTID); prints
#       the replica's DSN once it replicates (semisync: once the primary counts it)
#   scripts/mariadb.sh promote DIR            # the replica applies what it received, stops
#                                             # replicating and turns read_only off
#   scripts/mariadb.sh kill DIR               # SIGKILL the server (a crash)
#   scripts/mariadb.sh pause-replication DIR  # stop the replica's IO thread (a lagging link)
#   scripts/mariadb.sh resume-replication DIR # start it again
#
# start writes the DSN (go-sql-driver/mysql form) to DIR/dsn and prints it on stdout:
#   inbox:inbox@tcp(127.0.0.1:PORT)/inbox_test?parseTime=true&loc=UTC
# Everything else goes to stderr; the server log is DIR/err.log, the socket DIR/sock.
# The server listens on 127.0.0.1 only (free port picked at random). Users: inbox/inbox
# @127.0.0.1 and @localhost with ALL ON *.* WITH GRANT OPTION; root@localhost has no
# password (socket: mariadb --socket=DIR/sock -uroot). Missing binaries are installed
# with `apt-get install mariadb-server` (needs root or passwordless sudo); a system
# service the package starts is stopped again.
# Env: MARIADB_START_TIMEOUT (seconds, default 90).
set -euo pipefail

readonly MARKER=.inbox-mariadb
readonly DBNAME=inbox_test
readonly START_TIMEOUT=${MARIADB_START_TIMEOUT:-90}
SCRIPT_TAG=mariadb.sh
# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

usage() {
	echo "usage: $0 start|stop|restart|promote|kill|pause-replication|resume-replication DIR" >&2
	echo "       $0 replica PRIMARY_DIR DIR semisync|async" >&2
	exit 2
}

# find_bin NAME...: first of NAME... found on PATH or in the usual sbin dirs.
find_bin() {
	local name d
	for name in "$@"; do
		if command -v "$name" >/dev/null 2>&1; then
			command -v "$name"
			return 0
		fi
		for d in /usr/sbin /usr/local/sbin /usr/local/mysql/bin /usr/libexec; do
			if [[ -x $d/$name ]]; then
				echo "$d/$name"
				return 0
			fi
		done
	done
	return 1
}

MYSQLD='' INSTALL_DB='' ADMIN='' CLIENT=''
find_bins() {
	MYSQLD=$(find_bin mariadbd mysqld) &&
		INSTALL_DB=$(find_bin mariadb-install-db mysql_install_db) &&
		ADMIN=$(find_bin mariadb-admin mysqladmin) &&
		CLIENT=$(find_bin mariadb mysql)
}

# alive PID: process exists and is not a zombie (PID 1 may not reap in containers).
alive() {
	local st
	kill -0 "$1" 2>/dev/null || return 1
	st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	st=${st##*) }
	[[ ${st%% *} != Z ]]
}

# server_pid DIR: pid of a live mariadbd for DIR, if any.
server_pid() {
	local f pid comm
	for f in "$1/mariadb.pid" "$1/launch.pid"; do
		[[ -f $f ]] || continue
		read -r pid <"$f" || continue
		[[ $pid =~ ^[0-9]+$ ]] || continue
		alive "$pid" || continue
		comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
		[[ $comm == mariadbd* || $comm == mysqld* ]] || continue
		echo "$pid"
		return 0
	done
	return 1
}

stop_server() {
	local dir=$1 pid admin i
	pid=$(server_pid "$dir") || return 0
	log "stopping server (pid $pid)"
	if ! { admin=$(find_bin mariadb-admin mysqladmin) &&
		"$admin" --no-defaults --socket="$dir/sock" -uroot --connect-timeout=5 \
			--shutdown-timeout=60 shutdown >/dev/null 2>&1; }; then
		kill -TERM "$pid" 2>/dev/null || true
	fi
	for ((i = 0; i < 600; i++)); do
		alive "$pid" || return 0
		sleep 0.1
	done
	log "server did not stop in 60s; killing it"
	kill -KILL "$pid" 2>/dev/null || true
}

# launch_server DIR PORT: start mariadbd on DIR's data in the background (user_opt set
# by the caller); its pid goes to DIR/launch.pid.
launch_server() {
	local dir=$1 port=$2
	local -a repl_opt=()
	# Replication options (cmd_replica), kept across restarts.
	[[ -f $dir/replication.opts ]] && mapfile -t repl_opt <"$dir/replication.opts"
	# A temp dir of its own: servers sharing /tmp collide on the names of
	# their on-disk temporary tables.
	mkdir -p "$dir/tmp"
	[[ $EUID -ne 0 ]] || chown "$(stat -c %U "$dir/data")": "$dir/tmp"
	nohup "$MYSQLD" --no-defaults "${user_opt[@]}" "${repl_opt[@]}" \
		--datadir="$dir/data" --socket="$dir/sock" --port="$port" --bind-address=127.0.0.1 \
		--tmpdir="$dir/tmp" \
		--pid-file="$dir/mariadb.pid" --log-error="$dir/err.log" --skip-name-resolve \
		--innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=1 \
		--max-connections=300 --default-storage-engine=InnoDB \
		--character-set-server=utf8mb4 \
		</dev/null >>"$dir/stdout.log" 2>&1 &
	echo "$!" >"$dir/launch.pid"
}

# wait_ready DIR PID: until the server answers on DIR/sock (fails if PID dies or on timeout).
wait_ready() {
	local dir=$1 pid=$2 i
	for ((i = 0; i < START_TIMEOUT * 5; i++)); do
		alive "$pid" || return 1
		if "$ADMIN" --no-defaults --socket="$dir/sock" -uroot --connect-timeout=2 ping \
			>/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	return 1
}

cmd_start() {
	local dir=$1 user port attempt pid dsn t0 i ready
	local -a user_opt=()
	t0=$(date +%s.%N)
	if [[ -e $dir && -n $(ls -A -- "$dir") ]]; then
		die "$dir exists and is not empty"
	fi
	mkdir -p -- "$dir"
	dir=$(cd -- "$dir" && pwd -P)
	[[ $dir != *[[:space:]]* ]] || die "DIR must not contain spaces: $dir"
	((${#dir} <= 95)) || die "DIR path too long for a unix socket (${#dir} > 95 chars): $dir"
	: >"$dir/$MARKER"

	if ! find_bins; then
		apt_install "$dir/apt.log" mariadb-server
		# The package may start a system server on 3306; we run our own, so stop it.
		if command -v service >/dev/null 2>&1; then
			as_root service mariadb stop >/dev/null 2>&1 || true
		fi
		find_bins || die "MariaDB binaries still not found after apt-get install"
	fi
	log "using $("$MYSQLD" --version) ($MYSQLD)"

	# Run the server as `mysql` when root and that user can use DIR, else as ourselves.
	user=$(id -un)
	if [[ $EUID -eq 0 ]] && id mysql >/dev/null 2>&1; then
		chown mysql: "$dir"
		chmod 0755 "$dir"
		if runuser -u mysql -- test -w "$dir" 2>/dev/null; then
			user=mysql
		else
			log "user mysql cannot write $dir (parent not traversable); running the server as root"
			chown root: "$dir"
		fi
	fi

	if [[ $EUID -eq 0 ]]; then
		user_opt=(--user="$user")
	fi

	# From here on, a failure stops whatever got started but keeps DIR for its logs.
	START_DIR=$dir
	trap 'stop_server "$START_DIR"; log "start failed; logs kept in $START_DIR (run: $0 stop $START_DIR)"' EXIT

	if ! "$INSTALL_DB" --no-defaults --datadir="$dir/data" "${user_opt[@]}" \
		--auth-root-authentication-method=normal --skip-test-db \
		--skip-name-resolve >"$dir/install-db.log" 2>&1; then
		tail -n 30 "$dir/install-db.log" >&2 || true
		die "$(basename "$INSTALL_DB") failed"
	fi

	for attempt in 1 2 3; do
		port=$(free_port) || die "no free TCP port found"
		rm -f -- "$dir/err.log" "$dir/mariadb.pid" "$dir/launch.pid"
		launch_server "$dir" "$port"
		pid=$(<"$dir/launch.pid")
		ready=0
		wait_ready "$dir" "$pid" && ready=1
		((ready)) && break
		if ! alive "$pid" && grep -qE 'Address already in use|Do you already have another' \
			"$dir/err.log" 2>/dev/null && ((attempt < 3)); then
			log "port $port was taken meanwhile; retrying with another"
			continue
		fi
		tail -n 30 "$dir/err.log" "$dir/stdout.log" >&2 || true
		if alive "$pid"; then
			die "server not ready after ${START_TIMEOUT}s"
		fi
		die "server exited during startup"
	done

	if ! "$CLIENT" --no-defaults --socket="$dir/sock" -uroot >"$dir/setup.log" 2>&1 <<EOF; then
CREATE DATABASE IF NOT EXISTS $DBNAME CHARACTER SET utf8mb4;
CREATE USER 'inbox'@'127.0.0.1' IDENTIFIED BY 'inbox';
CREATE USER 'inbox'@'localhost' IDENTIFIED BY 'inbox';
GRANT ALL PRIVILEGES ON *.* TO 'inbox'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'inbox'@'localhost' WITH GRANT OPTION;
-- drop the root@<hostname> entries (ignored, and warned about, under --skip-name-resolve)
DELETE FROM mysql.global_priv WHERE Host NOT IN ('localhost', '127.0.0.1', '::1');
DELETE FROM mysql.proxies_priv WHERE Host NOT IN ('localhost', '127.0.0.1', '::1');
FLUSH PRIVILEGES;
EOF
		tail -n 30 "$dir/setup.log" "$dir/err.log" >&2 || true
		die "could not create database/user"
	fi

	dsn="inbox:inbox@tcp(127.0.0.1:$port)/$DBNAME?parseTime=true&loc=UTC"
	printf '%s\n' "$dsn" >"$dir/dsn"
	trap - EXIT
	log "ready on 127.0.0.1:$port in $(elapsed_since "$t0")"
	printf '%s\n' "$dsn"
}

cmd_restart() {
	local dir=$1 dsn port pid owner t0
	local -a user_opt=()
	t0=$(date +%s.%N)
	[[ -d $dir ]] || die "$dir does not exist"
	dir=$(cd -- "$dir" && pwd -P)
	[[ -f $dir/$MARKER && -f $dir/dsn ]] || die "$dir holds no server started by mariadb.sh"
	dsn=$(<"$dir/dsn")
	port=$(sed -n 's/.*tcp(127\.0\.0\.1:\([0-9]*\)).*/\1/p' <<<"$dsn")
	[[ -n $port ]] || die "no port in $dir/dsn"
	find_bins || die "MariaDB binaries not found"
	if [[ $EUID -eq 0 ]]; then
		owner=$(stat -c %U "$dir/data")
		user_opt=(--user="$owner")
	fi
	stop_server "$dir"
	launch_server "$dir" "$port"
	pid=$(<"$dir/launch.pid")
	if ! wait_ready "$dir" "$pid"; then
		tail -n 30 "$dir/err.log" "$dir/stdout.log" >&2 || true
		die "server not ready after restart (port $port)"
	fi
	log "restarted on 127.0.0.1:$port in $(elapsed_since "$t0")"
	printf '%s\n' "$dsn"
}

# --- replication (docs/RELIABILITY.md, "Failover") --------------------------

# sql DIR SQL: run SQL as root on the server of DIR, batch output without headers.
sql() {
	"$CLIENT" --no-defaults --socket="$1/sock" -uroot --connect-timeout=5 -N -B -e "$2"
}

# slave_field DIR NAME: a field of SHOW SLAVE STATUS on the server of DIR.
slave_field() {
	"$CLIENT" --no-defaults --socket="$1/sock" -uroot --connect-timeout=5 -e 'SHOW SLAVE STATUS\G' 2>/dev/null |
		sed -n "s/^ *$2: //p"
}

# dsn_port DIR: the port of the server started in DIR.
dsn_port() {
	local port
	[[ -f $1/$MARKER && -f $1/dsn ]] || die "$1 holds no server started by mariadb.sh"
	port=$(sed -n 's/.*tcp(127\.0\.0\.1:\([0-9]*\)).*/\1/p' <"$1/dsn")
	[[ -n $port ]] || die "no port in $1/dsn"
	echo "$port"
}

# cmd_replica PRIMARY_DIR DIR MODE: a GTID replica of PRIMARY_DIR's server in DIR.
cmd_replica() {
	local pdir=$1 dir=$2 mode=$3 pport i t0 semi=()
	t0=$(date +%s.%N)
	case $mode in
	semisync) semi=(--rpl-semi-sync-slave-enabled=ON --rpl-semi-sync-master-wait-point=AFTER_SYNC
		--rpl-semi-sync-master-timeout=3600000) ;;
	async) ;;
	*) die "replication mode must be semisync or async, not '$mode'" ;;
	esac
	find_bins || die "MariaDB binaries not found"
	pdir=$(cd -- "$pdir" && pwd -P)
	pport=$(dsn_port "$pdir")
	# The primary needs a binary log: set at start only, so it restarts. What
	# it holds from then on (the tests' tables) is what the replica gets.
	printf '%s\n' --server-id=1 --log-bin=binlog --binlog-format=ROW --log-slave-updates "${semi[@]}" \
		>"$pdir/replication.opts"
	cmd_restart "$pdir" >/dev/null
	sql "$pdir" "CREATE USER IF NOT EXISTS 'repl'@'127.0.0.1' IDENTIFIED BY 'repl'; GRANT REPLICATION SLAVE ON *.* TO 'repl'@'127.0.0.1'" ||
		die "cannot create the replication user"
	cmd_start "$dir" >/dev/null
	dir=$(cd -- "$dir" && pwd -P)
	printf '%s\n' --server-id=2 --log-bin=binlog --binlog-format=ROW --log-slave-updates --read-only=ON "${semi[@]}" \
		>"$dir/replication.opts"
	cmd_restart "$dir" >/dev/null
	sql "$dir" "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$pport, MASTER_USER='repl', MASTER_PASSWORD='repl', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; START SLAVE" ||
		die "cannot start replication"
	# Enabled only now: with no replica attached, a semi-synchronous primary
	# would hold every commit (for the one-hour timeout).
	if [[ $mode == semisync ]]; then
		sql "$pdir" "SET GLOBAL rpl_semi_sync_master_enabled = ON" || die "cannot enable semi-synchronous replication"
		# The replica negotiates semi-sync when it connects: reconnect it.
		sql "$dir" "STOP SLAVE IO_THREAD; START SLAVE IO_THREAD" || die "cannot restart the replica's IO thread"
	fi
	for ((i = 0; i < 600; i++)); do
		if [[ $(slave_field "$dir" Slave_IO_Running) == Yes && $(slave_field "$dir" Slave_SQL_Running) == Yes ]] &&
			{ [[ $mode == async ]] || [[ $(sql "$pdir" "SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'" | cut -f2) == 1 ]]; }; then
			log "$mode replica of port $pport ready on port $(dsn_port "$dir") in $(elapsed_since "$t0")"
			cat "$dir/dsn"
			return 0
		fi
		sleep 0.1
	done
	sql "$dir" 'SHOW SLAVE STATUS\G' >&2 || true
	die "the replica did not start replicating in 60 s"
}

# cmd_promote DIR: the replica in DIR applies what it received, stops
# replicating and becomes writable.
cmd_promote() {
	local dir=$1 i t0
	t0=$(date +%s.%N)
	dir=$(cd -- "$dir" && pwd -P)
	find_bins || die "MariaDB binaries not found"
	sql "$dir" "STOP SLAVE IO_THREAD" || die "cannot stop the replica's IO thread"
	for ((i = 0; i < 600; i++)); do
		if [[ $(slave_field "$dir" Master_Log_File) == "$(slave_field "$dir" Relay_Master_Log_File)" &&
			$(slave_field "$dir" Read_Master_Log_Pos) == "$(slave_field "$dir" Exec_Master_Log_Pos)" ]]; then
			break
		fi
		sleep 0.1
	done
	sql "$dir" "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF" || die "cannot promote"
	log "promoted port $(dsn_port "$dir") in $(elapsed_since "$t0")"
	cat "$dir/dsn"
}

# cmd_kill DIR: SIGKILL the server of DIR (a crash).
cmd_kill() {
	local dir=$1 pid i
	dir=$(cd -- "$dir" && pwd -P)
	[[ -f $dir/$MARKER ]] || die "$dir was not created by $SCRIPT_TAG (no $MARKER); not touching it"
	pid=$(server_pid "$dir") || die "no server running in $dir"
	kill -KILL "$pid"
	for ((i = 0; i < 100; i++)); do
		alive "$pid" || break
		sleep 0.05
	done
	log "killed the server in $dir (pid $pid)"
}

# cmd_replication DIR stop|start: stop or start the replica's IO thread (a
# lagging link: a semi-synchronous primary then holds its commits).
cmd_replication() {
	find_bins || die "MariaDB binaries not found"
	sql "$1" "$2 SLAVE IO_THREAD" || die "cannot $2 the IO thread"
	log "replica IO thread: $2"
}

case ${1:-} in
start | stop | restart | promote | kill | pause-replication | resume-replication) [[ $# -eq 2 && -n $2 ]] || usage ;;
replica) [[ $# -eq 4 && -n $2 && -n $3 ]] || usage ;;
*) usage ;;
esac
case $1 in
start) cmd_start "$2" ;;
stop) cmd_stop "$2" ;;
restart) cmd_restart "$2" ;;
replica) cmd_replica "$2" "$3" "$4" ;;
promote) cmd_promote "$2" ;;
kill) cmd_kill "$2" ;;
pause-replication) cmd_replication "$2" STOP ;;
resume-replication) cmd_replication "$2" START ;;
esac
