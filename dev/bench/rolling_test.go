package bench_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/bench"
)

// BenchmarkRollingRestart replaces each member of a 3-member group over 12
// partitions in turn, under a steady load (INBOX_BENCH_ROLLING_RATE events
// per second, default 500), on PostgreSQL, with each transport
// INBOX_BENCH_TRANSPORTS names (default all), INBOX_BENCH_ROUNDS rounds
// (default 3) in alternating order. It logs, per transport and round, the
// longest pause of a partition that kept its owner through a step and of
// one that moved.
func BenchmarkRollingRestart(b *testing.B) {
	brokers := testservers.KafkaBrokers(b)
	var names []string
	if s := os.Getenv("INBOX_BENCH_TRANSPORTS"); s != "" {
		names = strings.Split(s, ",")
	} else {
		for n := range bench.Transports {
			names = append(names, n)
		}
		slices.Sort(names)
	}
	for _, n := range names {
		if _, ok := bench.Transports[n]; !ok {
			b.Fatalf("INBOX_BENCH_TRANSPORTS: unknown transport %q", n)
		}
	}
	settle := 5 * time.Second
	if s := os.Getenv("INBOX_BENCH_ROLLING_SETTLE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("INBOX_BENCH_ROLLING_SETTLE: %v", err)
		}
		settle = d
	}
	rounds := envInt("INBOX_BENCH_ROUNDS", 3)
	be := backend(b, "postgres", 16)
	for range b.N {
		lines := []string{"| round | transport | events | longest gap without a restart | longest pause, partition kept (pairs) | longest pause, partition moved (pairs) |", "|---|---|---|---|---|---|"}
		for round := range rounds {
			order := names
			if round%2 == 1 {
				order = slices.Clone(names)
				slices.Reverse(order)
			}
			for _, n := range order {
				r, err := bench.RollingRestart(b.Context(), be, brokers, bench.RollingConfig{
					Members: 3, Partitions: 12, Rate: envInt("INBOX_BENCH_ROLLING_RATE", 500), Settle: settle,
					Transport: bench.Transports[n], Name: n,
				})
				if err != nil {
					b.Fatal(err)
				}
				lines = append(lines, fmt.Sprintf("| %d | %s | %d | %v | %v (%d) | %v (%d) |", round+1, r.Transport, r.Events, r.SteadyPause.Round(time.Millisecond),
					r.KeptPause.Round(time.Millisecond), r.Kept, r.MovedPause.Round(time.Millisecond), r.Moved))
			}
		}
		b.Log("\n" + strings.Join(lines, "\n"))
	}
}
