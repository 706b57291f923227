#!/usr/bin/env bash
# Start and stop one service script N times in a row, each time in a fresh
# directory, and count the failures: the service scripts must start their
# server every time, on a busy machine too.
#
# Usage:
#   scripts/soak-start.sh postgres|mariadb|kafka N [LOGDIR]
#
# Each round runs `scripts/SERVICE.sh start DIR` (timed), checks that the
# server answers on the address it printed, and runs `scripts/SERVICE.sh stop
# DIR`. A failed round keeps the start's stderr and DIR's logs in
# LOGDIR/fail-ROUND (LOGDIR defaults to a new directory under /tmp, printed at
# the end) and the soak goes on. One line per round goes to stdout
# ("round 17 ok start 2.3s stop 0.4s"), then a summary: rounds, failed starts,
# failed checks, failed stops, and the start time's min / median / p95 / max.
# Exits 1 if any round failed.
set -euo pipefail

SCRIPT_TAG=soak-start.sh
# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)

usage() {
	echo "usage: $0 postgres|mariadb|kafka N [LOGDIR]" >&2
	exit 2
}

(($# >= 2)) || usage
service=$1
rounds=$2
case $service in
postgres | mariadb | kafka) ;;
*) usage ;;
esac
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage
logdir=${3:-$(mktemp -d "/tmp/soak-$service.XXXXXX")}
mkdir -p -- "$logdir"
# Short: postgres.sh puts its unix socket in DIR (108-byte limit).
work=$(mktemp -d /tmp/soak.XXXXXX)
chmod 755 "$work" # as root, postgres.sh runs the server as user postgres
trap 'rm -rf -- "$work"' EXIT

# answers SERVICE OUT: the server whose address start printed (OUT) accepts
# a TCP connection.
answers() {
	local addr port
	addr=$(tail -n 1 "$2")
	case $1 in
	postgres) port=$(sed -n 's/.*port=\([0-9]*\).*/\1/p' <<<"$addr") ;;
	mariadb) port=$(sed -n 's/.*tcp(127\.0\.0\.1:\([0-9]*\)).*/\1/p' <<<"$addr") ;;
	kafka) port=${addr##*:} ;;
	esac
	[[ $port =~ ^[0-9]+$ ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

failed_start=0 failed_check=0 failed_stop=0
times=()
for ((i = 1; i <= rounds; i++)); do
	dir=$work/$i
	t0=$(date +%s.%N)
	ok=1
	if "$HERE/$service.sh" start "$dir" >"$work/out" 2>"$work/err"; then
		start=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
		times+=("$start")
		if ! answers "$service" "$work/out"; then
			failed_check=$((failed_check + 1))
			ok=0
			what="check failed ($(tail -n 1 "$work/out") does not answer)"
		fi
	else
		start=-
		failed_start=$((failed_start + 1))
		ok=0
		what="start failed: $(tail -n 1 "$work/err")"
	fi
	if ((!ok)); then
		mkdir -p "$logdir/fail-$i"
		cp "$work/out" "$work/err" "$logdir/fail-$i/" 2>/dev/null || true
		find "$dir" -maxdepth 2 -name '*.log' -exec cp {} "$logdir/fail-$i/" \; 2>/dev/null || true
	fi
	t1=$(date +%s.%N)
	if ! "$HERE/$service.sh" stop "$dir" >>"$work/stop.err" 2>&1 || [[ -e $dir ]]; then
		failed_stop=$((failed_stop + 1))
		ok=0
		what="${what:-} stop failed"
		rm -rf -- "$dir"
	fi
	stop=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
	if ((ok)); then
		echo "round $i ok start ${start}s stop ${stop}s"
	else
		echo "round $i FAILED start ${start}s stop ${stop}s: $what (logs: $logdir/fail-$i)"
	fi
	what=
done

stats="no successful start"
((${#times[@]} == 0)) || stats=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {
	p95 = int(NR * 0.95); if (p95 < 1) p95 = 1
	printf "start min %.2fs median %.2fs p95 %.2fs max %.2fs", a[1], a[int((NR + 1) / 2)], a[p95], a[NR] }')
echo "$service: $rounds rounds, $failed_start failed starts, $failed_check failed checks, $failed_stop failed stops; $stats; logs: $logdir"
((failed_start + failed_check + failed_stop == 0))
