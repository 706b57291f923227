package chaos_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
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
	brokers := testservers.KafkaBrokers(t)
	only := os.Getenv("INBOX_CHAIN_DB")
	var reps []*chaos.ChainReport
	for _, db := range []struct {
		dialect string
		dsn     func(testing.TB) string
	}{
		{"sqlite", func(testing.TB) string { return "" }},
		{"postgres", testservers.PostgresDSN},
		{"mysql", testservers.MySQLDSN},
	} {
		if only != "" && !strings.Contains(","+only+",", ","+db.dialect+",") {
			continue
		}
		t.Run(db.dialect, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			rep, err := chaos.RunChain(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers,
				Waves: 8, Partitions: 4, Session: 3 * time.Second, Duration: 20 * time.Second, Kills: 8, Terminations: 2,
				CatchUp: 2 * time.Minute, Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			}, chaos.ChainConfig{Orders: 400, Lease: 2 * time.Second, CrashAfter: 3})
			if rep != nil {
				t.Log("\n" + rep.String())
				reps = append(reps, rep)
			}
			if err != nil {
				t.Fatal(err)
			}
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
		})
	}
	t.Log("\n" + chaos.ChainTable(reps))
}
