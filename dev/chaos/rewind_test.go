package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/inboxgo/inbox/dev/chaos"
)

// TestChaosRewind is the rewind phase, CI-sized: while service A places
// orders, its database (its orders and outbox A's tables) is put back
// twice to a backup taken a few seconds earlier that held rows not yet
// published, once with A's relays stopped and started again around the
// restore and once with them running through it. Every order the rewinds
// left to deliver (those still in A's table, and those whose OrderCreated
// was published before the restore took them back) must be reserved and
// booked once, in order per key, and the relays must have said at Warn
// that the database went back and published under a new epoch; no process
// may log an ERROR.
//
// It restarts no server, so it runs on the shared ones. INBOX_REWIND_DB
// (comma-separated) limits the databases.
func TestChaosRewind(t *testing.T) {
	const rewinds = 2
	runPhase(t, "INBOX_REWIND_DB", 3*time.Minute, []phaseDB{sqliteDB, postgresDB, mysqlDB},
		func(ctx context.Context, cfg chaos.Config, _ phaseDB) (*chaos.ChainReport, error) {
			cfg.Partitions = 4
			cfg.Session, cfg.Duration, cfg.CatchUp = 3*time.Second, 16*time.Second, 2*time.Minute
			return chaos.RunRewind(ctx, cfg, chaos.RewindConfig{Orders: 320, Rewinds: rewinds, Lease: 2 * time.Second})
		},
		func(t *testing.T, rep *chaos.ChainReport) {
			for _, p := range rep.Problems {
				t.Error(p)
			}
			if len(rep.Rewinds) != rewinds {
				t.Fatalf("%d rewinds, want %d", len(rep.Rewinds), rewinds)
			}
			if !rep.Rewinds[0].RelaysRestarted || rep.Rewinds[1].RelaysRestarted {
				t.Errorf("want the first restore with A's relays restarted, the second with them running through it")
			}
			if rep.RolledBackSent == 0 {
				t.Errorf("no order published before a restore took it back: the restores tested no renumbering")
			}
			if rep.OrdersTopic.Epochs < 2 {
				t.Errorf("%d epochs on A's topic: no relay published under a new one", rep.OrdersTopic.Epochs)
			}
		},
		chaos.RewindTable)
}
