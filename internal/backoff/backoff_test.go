package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWaitStaysInItsBounds(t *testing.T) {
	minD, maxD := 10*time.Millisecond, 80*time.Millisecond
	for attempt := 1; attempt <= 40; attempt++ {
		ceiling := min(minD<<min(attempt-1, 20), maxD)
		for range 200 {
			d := Wait(minD, maxD, attempt)
			if d < minD/2 || d >= minD/2+ceiling {
				t.Fatalf("attempt %d: wait %v outside [%v, %v)", attempt, d, minD/2, minD/2+ceiling)
			}
		}
	}
	if d := Wait(0, 0, 3); d != 0 {
		t.Fatalf("no bounds: wait %v", d)
	}
	if d := Wait(time.Hour, time.Second, 1); d < 30*time.Minute || d >= 30*time.Minute+time.Second {
		t.Fatalf("min above max: wait %v", d)
	}
}

func TestWaitSpreadsConcurrentRetries(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[Wait(time.Millisecond, time.Second, 5)] = true
	}
	if len(seen) < 50 {
		t.Fatalf("100 waits took only %d distinct values", len(seen))
	}
}

func TestSleepReturnsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("Sleep outlived its context")
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
}
