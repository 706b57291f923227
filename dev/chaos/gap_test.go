package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/inboxgo/inbox/dev/chaos"
)

// TestChaosGap is the gap phase of the chaos run, CI-sized: on each
// database, in each of 2 rounds, relay A of the chain drops one message of
// its aligned outbox while reporting it published, and service B, which
// trusts A's source,
// must stop that partition with consumer.ReasonSequenceGap naming the
// stream and the missing number, twice (the consumer running then, and one
// started after it), applying nothing after the gap and everything else
// once.
//
// It restarts nothing, so it runs on the shared servers. INBOX_GAP_DB
// (comma-separated) limits the databases.
func TestChaosGap(t *testing.T) {
	runPhase(t, "INBOX_GAP_DB", 3*time.Minute, []phaseDB{sqliteDB, postgresDB, mysqlDB},
		func(ctx context.Context, cfg chaos.Config, _ phaseDB) (*chaos.GapReport, error) {
			cfg.Partitions, cfg.Session = 3, 3*time.Second
			return chaos.RunGap(ctx, cfg, chaos.GapConfig{Rounds: 2, Orders: 90, Budget: 40 * time.Second})
		},
		func(t *testing.T, rep *chaos.GapReport) {
			for _, p := range rep.Problems() {
				t.Error(p)
			}
			if named, want := rep.Detections(); named != want || want == 0 {
				t.Errorf("the gap was detected %d times, want %d", named, want)
			}
		},
		chaos.GapTable)
}
