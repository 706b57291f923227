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
	brokers := testservers.KafkaBrokers(t)
	only := os.Getenv("INBOX_PAUSE_DB")
	var reps []*chaos.ChainReport
	for _, db := range []struct {
		dialect      string
		dsn          func(testing.TB) string
		storeOffsets bool
	}{
		{"postgres", testservers.PostgresDSN, true},
		{"mysql", testservers.MySQLDSN, false},
	} {
		if only != "" && !strings.Contains(","+only+",", ","+db.dialect+",") {
			continue
		}
		t.Run(db.dialect, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			const pauses = 4
			rep, err := chaos.RunPause(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers, StoreOffsets: db.storeOffsets,
				Waves: 10, Partitions: 4, Session: 2 * time.Second, Duration: 14 * time.Second,
				CatchUp: 2 * time.Minute, Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			}, chaos.PauseConfig{Orders: 240, Pauses: pauses, Lease: 2 * time.Second})
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
			if len(rep.Pauses) != pauses {
				t.Errorf("%d pauses, want %d", len(rep.Pauses), pauses)
			}
			for _, p := range rep.Pauses {
				if p.For < 4*time.Second {
					t.Errorf("%s paused for %v, want past the 2 s session timeout and lease, twice over", p.Process, p.For)
				}
			}
		})
	}
	t.Log("\n" + chaos.PauseTable(reps))
}
