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

// TestChaosFaults is the fault phase of the chaos run, CI-sized: on each
// database, handler faults on known messages (poison payloads, network
// errors to a closed port, permanent and transient, plain and marked
// Retryable, a handler's own deadline, a deferred constraint that fails at
// COMMIT) with OnFailure DeadLetter and MaxAttempts 3, in batches of 1 and
// 4; then a topic recreated under StoreOffsets. Healthy and transient
// messages must be applied exactly once, every poison message dead-lettered
// within MaxAttempts, nothing lost, and the recreated topic's partitions
// stopped loudly.
//
// It restarts nothing, so it runs on the shared servers. Every round has a
// budget: a message the consumer retries forever is reported as stuck when
// the budget is used up, never waited for past it. INBOX_FAULTS_DB
// (comma-separated) limits the databases.
func TestChaosFaults(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	dbs := []struct {
		dialect string
		dsn     func(testing.TB) string
	}{
		{"sqlite", func(testing.TB) string { return "" }},
		{"postgres", testservers.PostgresDSN},
		{"mysql", testservers.MySQLDSN},
	}
	only := os.Getenv("INBOX_FAULTS_DB")
	var reps []*chaos.FaultReport
	for _, db := range dbs {
		if only != "" && !strings.Contains(","+only+",", ","+db.dialect+",") {
			continue
		}
		t.Run(db.dialect, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			rep, err := chaos.RunFaults(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers, Session: 3 * time.Second,
				Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			}, chaos.FaultConfig{
				Healthy: 60, PerClass: 3, DupRate: 0.1, MaxAttempts: 3, BatchSizes: []int{1, 4}, Partitions: 3,
				Budget: 40 * time.Second, StopBudget: 20 * time.Second,
			})
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
		})
	}
	t.Log("\n" + chaos.FaultTable(reps))
}
