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
	brokers := testservers.KafkaBrokers(t)
	only := os.Getenv("INBOX_GAP_DB")
	var reps []*chaos.GapReport
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
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := chaos.RunGap(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers, Partitions: 3, Session: 3 * time.Second,
				Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			}, chaos.GapConfig{Rounds: 2, Orders: 90, Budget: 40 * time.Second})
			if rep != nil {
				t.Log("\n" + rep.String())
				reps = append(reps, rep)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range rep.Problems() {
				t.Error(p)
			}
			if named, want := rep.Detections(); named != want || want == 0 {
				t.Errorf("the gap was detected %d times, want %d", named, want)
			}
		})
	}
	t.Log("\n" + chaos.GapTable(reps))
}
