package sqlite_test

import (
	"path/filepath"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/internal/outboxbench"
	"github.com/inboxgo/inbox/internal/testenv"
)

// BenchmarkOutboxRelay is the PostgreSQL benchmark of the same name on
// SQLite. Run with -benchtime 1x.
func BenchmarkOutboxRelay(b *testing.B) {
	brokers := testenv.KafkaBrokers(b)
	for b.Loop() {
		db, err := gorm.Open(inboxsqlite.Open(filepath.Join(b.TempDir(), "bench.db")), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			b.Fatal(err)
		}
		store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
		if err != nil {
			b.Fatal(err)
		}
		o := outboxbench.Defaults()
		direct, err := outboxbench.Direct(b.Context(), brokers, o)
		if err != nil {
			b.Fatal(err)
		}
		relay, err := outboxbench.Relay(b.Context(), db, store, brokers, o)
		if sqlDB, cerr := db.DB(); cerr == nil {
			_ = sqlDB.Close()
		}
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
