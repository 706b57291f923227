package bench

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestMachineTicksCountAnotherGoroutinesSpin(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat here: the share is reported as 0")
	}
	b0, t0 := machineTicks()
	if t0 <= 0 || b0 <= 0 || b0 > t0 {
		t.Fatalf("machineTicks = %d busy of %d: want 0 < busy <= total", b0, t0)
	}
	// One goroutine spinning for 300 ms keeps at least one of the
	// machine's CPUs busy: the share cannot be below 1/NumCPU by much.
	done := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(done) {
	}
	b1, t1 := machineTicks()
	share := busyShare(b0, t0, b1, t1)
	if floor := 0.8 / float64(runtime.NumCPU()); share < floor || share > 1 {
		t.Fatalf("busy share while spinning on one core of %d = %.2f, want in [%.2f, 1]", runtime.NumCPU(), share, floor)
	}
	if got := busyShare(b1, t1, b0, t0); got != 0 {
		t.Fatalf("busyShare of readings out of order = %v, want 0", got)
	}
}
