package mysql_test

import (
	"testing"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/internal/outboxbench"
	"github.com/inboxgo/inbox/internal/testenv"
)

// BenchmarkOutboxRelay is the PostgreSQL benchmark of the same name on
// MariaDB. Run with -benchtime 1x.
func BenchmarkOutboxRelay(b *testing.B) {
	dsn, brokers := testenv.MySQLDSN(b), testenv.KafkaBrokers(b)
	for b.Loop() {
		db, err := openDB(dsn, recommended)
		if err != nil {
			b.Fatal(err)
		}
		store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "outbox_bench_" + conformance.RandomSuffix()})
		if err != nil {
			b.Fatal(err)
		}
		o := outboxbench.Defaults()
		direct, err := outboxbench.Direct(b.Context(), brokers, o)
		if err != nil {
			b.Fatal(err)
		}
		relay, err := outboxbench.Relay(b.Context(), db, store, brokers, o)
		for _, suffix := range []string{"", "_shards", "_relay"} {
			db.Exec("DROP TABLE IF EXISTS `" + store.Table() + suffix + "`")
		}
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
