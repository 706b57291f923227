package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/inboxgo/inbox/dev/chaos"
)

// TestChaosChain is the chain phase of the chaos run, CI-sized: on each
// database, service A places orders and enqueues OrderCreated in their
// transactions, relay processes publish them, consumer processes of service
// B reserve stock and enqueue StockReserved through B's inbox, relay
// processes publish those, and ledger consumer processes book them through
// the ledger's inbox, while relays and consumers are killed with SIGKILL and
// the consumers' connections terminated from the server side. Every order
// must be reserved once, every StockReserved published and booked once, in
// order per key; the kills must have made relays publish duplicates, or
// the run proved nothing.
//
// It restarts no server, so it runs on the shared ones; make chaos adds
// broker and database restarts on private servers. INBOX_CHAIN_DB
// (comma-separated) limits the databases.
func TestChaosChain(t *testing.T) {
	runPhase(t, "INBOX_CHAIN_DB", 4*time.Minute, []phaseDB{sqliteDB, postgresDB, mysqlDB},
		func(ctx context.Context, cfg chaos.Config, _ phaseDB) (*chaos.ChainReport, error) {
			cfg.Waves, cfg.Partitions, cfg.Kills, cfg.Terminations = 8, 4, 8, 2
			cfg.Session, cfg.Duration, cfg.CatchUp = 3*time.Second, 20*time.Second, 2*time.Minute
			return chaos.RunChain(ctx, cfg, chaos.ChainConfig{Orders: 400, Lease: 2 * time.Second, CrashAfter: 3})
		},
		func(t *testing.T, rep *chaos.ChainReport) {
			for _, p := range rep.Problems {
				t.Error(p)
			}
			if rep.Kills != 8 {
				t.Errorf("%d kills, want 8", rep.Kills)
			}
			if rep.KillsByRole["relay orders"]+rep.KillsByRole["relay reserve"] == 0 {
				t.Errorf("no relay was killed: %v", rep.KillsByRole)
			}
			// A relay that crashed between the broker's acknowledgement and
			// marking published must have made duplicates on its topic,
			// which the inboxes then dropped; without them the run proves
			// nothing about at-least-once.
			if rep.Injected > 0 && rep.OrdersTopic.Duplicates+rep.StockTopic.Duplicates == 0 {
				t.Errorf("%d injected relay crashes, yet no duplicate was published", rep.Injected)
			}
			if rep.Injected == 0 {
				t.Errorf("no relay crashed between publish and acknowledgement (CrashAfter 3): the run made no duplicates on purpose")
			}
		},
		chaos.ChainTable)
}
