package bench

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// cpuMeter reads the CPU time this process and, if INBOX_BENCH_SERVER_PID
// names the database server's process (the postmaster, or mariadbd), the
// server used: on a shared, busy machine CPU per event varies far less than
// throughput. SQLite runs inside this process.
type cpuMeter struct {
	client, server time.Duration
}

func readCPU() cpuMeter {
	m := cpuMeter{client: processCPU()}
	if pid, err := strconv.Atoi(os.Getenv("INBOX_BENCH_SERVER_PID")); err == nil && pid > 0 {
		m.server = serverCPU(pid)
	}
	return m
}

// clockTick is USER_HZ, the unit of /proc/*/stat's times, 100 on Linux.
const clockTick = 100

// serverCPU sums the user and system time of pid, of its reaped children
// and of its live children (PostgreSQL's backends are processes; MariaDB's
// threads are counted in its own), from /proc. It returns 0 where /proc
// cannot be read.
func serverCPU(pid int) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command (in parentheses, which may hold
		// spaces): state ppid ... utime(14) stime(15) cutime(16) cstime(17).
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if p != pid && ppid != pid {
			continue
		}
		for i := 11; i <= 14; i++ { // utime, stime, cutime, cstime
			if i >= 13 && p != pid {
				break
			}
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / clockTick
}
