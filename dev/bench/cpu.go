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

// machineTicks reads the first line of /proc/stat: the ticks all CPUs
// spent busy and in total since boot, or zeros where it cannot be read.
// A latency run is only as fast as the machine lets it be: on a 2-core box
// that runs the database, the broker and the benchmark, the share of the
// CPUs busy tells a slow design from a saturated machine.
func machineTicks() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	// user nice system idle iowait irq softirq steal (guest time is
	// already counted in user).
	for i, s := range f[1:min(len(f), 9)] {
		v, _ := strconv.ParseInt(s, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// busyShare is the share of the machine's CPU time spent busy between two
// readings of machineTicks; 0 when unknown.
func busyShare(busy0, total0, busy1, total1 int64) float64 {
	if total1 <= total0 {
		return 0
	}
	return float64(busy1-busy0) / float64(total1-total0)
}
