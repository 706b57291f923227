# Shared by the service scripts (postgres.sh, mariadb.sh): source it after
# setting SCRIPT_TAG, the prefix of every log line.
# shellcheck shell=bash

readonly APT_LOCK=/tmp/inbox-scripts-apt.lock

log() { printf '%s: %s\n' "$SCRIPT_TAG" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

as_root() {
	if [[ $EUID -eq 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo -n "$@"
	else
		die "need root (or sudo) to run: $*"
	fi
}

# apt_install LOGFILE PKG...: serialised (flock) so parallel scripts don't fight over dpkg.
apt_install() {
	local logfile=$1
	shift
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install $* by hand"
	log "installing $* with apt-get (log: $logfile)"
	if ! (
		flock -w 900 9 || exit 1
		as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 update &&
			as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600 \
				-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
				--no-install-recommends install "$@"
	) 9>"$APT_LOCK" >"$logfile" 2>&1; then
		tail -n 30 "$logfile" >&2 || true
		die "apt-get install $* failed"
	fi
}

# free_port: a currently unused TCP port on 127.0.0.1, below the kernel's ephemeral range.
free_port() {
	local p i
	if command -v python3 >/dev/null 2>&1 && p=$(
		python3 - 2>/dev/null <<'PY'
import random, socket
for _ in range(500):
    port = random.randint(15000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
PY
	) && [[ -n $p ]]; then
		echo "$p"
		return 0
	fi
	for ((i = 0; i < 500; i++)); do
		p=$((15000 + RANDOM % 17000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# elapsed_since T0: seconds since T0 (from date +%s.%N), as "1.2s".
elapsed_since() {
	awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1fs", b-a}'
}

# cmd_stop DIR: stop the server the calling script started in DIR (its
# stop_server) and remove DIR; only a DIR holding the script's MARKER.
cmd_stop() {
	local dir=$1
	if [[ ! -e $dir ]]; then
		return 0
	fi
	dir=$(cd -- "$dir" && pwd -P)
	[[ -f $dir/$MARKER ]] || die "$dir was not created by $SCRIPT_TAG (no $MARKER); not touching it"
	stop_server "$dir"
	rm -rf -- "$dir"
}
