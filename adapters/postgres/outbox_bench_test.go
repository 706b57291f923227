package postgres_test

import (
	"testing"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/internal/outboxbench"
	"github.com/inboxgo/inbox/internal/testenv"
)

// BenchmarkOutboxRelay publishes outboxbench.Defaults() events through the
// outbox relay on PostgreSQL and straight to Kafka, and reports both and
// their ratio (see docs/BENCHMARKS.md). Run with -benchtime 1x.
func BenchmarkOutboxRelay(b *testing.B) {
	dsn, brokers := testenv.PostgresDSN(b), testenv.KafkaBrokers(b)
	for b.Loop() {
		db, err := openDB(dsn)
		if err != nil {
			b.Fatal(err)
		}
		schema := "outbox_bench_" + conformance.RandomSuffix()
		store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema})
		if err != nil {
			b.Fatal(err)
		}
		o := outboxbench.Defaults()
		direct, err := outboxbench.Direct(b.Context(), brokers, o)
		if err != nil {
			b.Fatal(err)
		}
		relay, err := outboxbench.Relay(b.Context(), db, store, brokers, o)
		db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`)
		_ = closeDB(db)
		if err != nil {
			b.Fatal(err)
		}
		b.Log(direct)
		b.ReportMetric(direct.EventsPerSec(), "direct-events/s")
		for i, r := range relay {
			b.Logf("%v (%.2fx direct)", r, r.EventsPerSec()/direct.EventsPerSec())
			b.ReportMetric(r.EventsPerSec(), outboxbench.Metrics[i])
		}
	}
}
