package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/inboxgo/inbox/dev/chaos"
)

// TestChaosPause is the pause phase, CI-sized: the chain's relays and
// consumers stopped with SIGSTOP for 4-8 s, past their 2 s lease and
// session timeout (one pause per role, half of them inside a transaction
// the process holds open on the server), and let go on: every order reserved and booked once, in
// order, no message charged an attempt, and with StoreOffsets no stored
// offset ever read below an earlier reading. PostgreSQL runs with
// StoreOffsets, MariaDB without (make chaos runs both modes on both).
//
// It restarts nothing, so it runs on the shared servers. INBOX_PAUSE_DB
// (comma-separated) limits the databases.
func TestChaosPause(t *testing.T) {
	const pauses = 4
	pg := postgresDB
	pg.storeOffsets = true
	runPhase(t, "INBOX_PAUSE_DB", 3*time.Minute, []phaseDB{pg, mysqlDB},
		func(ctx context.Context, cfg chaos.Config, _ phaseDB) (*chaos.ChainReport, error) {
			cfg.Waves, cfg.Partitions = 10, 4
			cfg.Session, cfg.Duration, cfg.CatchUp = 2*time.Second, 14*time.Second, 2*time.Minute
			return chaos.RunPause(ctx, cfg, chaos.PauseConfig{Orders: 240, Pauses: pauses, Lease: 2 * time.Second})
		},
		func(t *testing.T, rep *chaos.ChainReport) {
			for _, p := range rep.Problems {
				t.Error(p)
			}
			if len(rep.Pauses) != pauses {
				t.Errorf("%d pauses, want %d", len(rep.Pauses), pauses)
			}
			for _, p := range rep.Pauses {
				if p.For < 4*time.Second {
					t.Errorf("%s paused for %v, want past the 2 s session timeout and lease, twice over", p.Process, p.For)
				}
			}
		},
		chaos.PauseTable)
}
