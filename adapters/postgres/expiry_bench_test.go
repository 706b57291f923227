package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkExpiry expires one day holding N inbox rows in two identical
// partitioned inbox tables: by Maintain, which drops the day's partition, and
// by the DELETE that row-based inboxes run (one statement, the cheapest form;
// the VACUUM it leaves behind is not counted). It reports both times and
// their ratio, the WAL each writes, and the VACUUM the DELETE needs before
// its space can be reused:
//
//	scripts/with-services.sh --postgres -- go test -run '^$' -bench Expiry -benchtime 1x ./adapters/postgres/
//
// Filling a day (INSERT ... SELECT generate_series, with the key index) is
// not timed but dominates the run time: a few seconds per million rows and
// table on a 2-core machine.
//
// What the drop costs: Maintain detaches the partition CONCURRENTLY, which
// takes no lock that inserts wait for, whatever the partition holds; the
// DROP TABLE that follows, without any lock on the inbox table, spends its
// time in the COMMIT,
// where PostgreSQL truncates the table's files and the file system frees
// their blocks. That part grows with the size of the files (on an ext4 file
// system mounted with discard, about 0.3 ms per MB); the DELETE's work grows
// with the number of rows, and its WAL with them.
func BenchmarkExpiry(b *testing.B) {
	dsn := testservers.PostgresDSN(b)
	db, err := openDB(dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closeDB(db) })
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			var drop, del, vacuum time.Duration
			var dropWAL, delWAL int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				day := storage.DayOf(time.Now()).AddDate(0, 0, -100-i)
				dropStore := benchTable(b, db, day, n)
				delStore := benchTable(b, db, day, n)
				// An expired day is days old: its pages were written out
				// by checkpoints long ago. Without this, dropping a table
				// whose pages are still dirty in the OS page cache costs
				// time in the kernel in proportion to its size.
				if err := db.Exec(`CHECKPOINT`).Error; err != nil {
					b.Fatal(err)
				}
				plan := storage.MaintenancePlan{Today: day.AddDate(0, 0, 1), PrepareThrough: day.AddDate(0, 0, 1), ExpireBefore: day.AddDate(0, 0, 1)}
				b.StartTimer()

				lsn0 := walLSN(b, db)
				t0 := time.Now()
				report, err := dropStore.Maintain(b.Context(), db, plan)
				drop += time.Since(t0)
				lsn1 := walLSN(b, db)
				dropWAL += lsn1 - lsn0
				if err != nil || len(report.Expired) != 1 || len(report.Prepared) != 0 {
					b.Fatalf("Maintain: %+v, %v", report, err)
				}
				t0 = time.Now()
				res := db.Exec(`DELETE FROM "`+delStore.Schema()+`"."`+delStore.Table()+`" WHERE day = ?::date`, day.Format(time.DateOnly))
				del += time.Since(t0)
				if res.Error != nil || res.RowsAffected != int64(n) {
					b.Fatalf("DELETE: %d rows, %v", res.RowsAffected, res.Error)
				}
				delWAL += walLSN(b, db) - lsn1
				// The DELETE leaves dead rows for VACUUM to reclaim; the
				// drop has already given the space back.
				t0 = time.Now()
				if err := db.Exec(`VACUUM "` + delStore.Schema() + `"."` + delStore.Table() + `"`).Error; err != nil {
					b.Fatal(err)
				}
				vacuum += time.Since(t0)
			}
			b.ReportMetric(float64(drop.Microseconds())/1000/float64(b.N), "drop-ms/op")
			b.ReportMetric(float64(del.Microseconds())/1000/float64(b.N), "delete-ms/op")
			b.ReportMetric(float64(vacuum.Microseconds())/1000/float64(b.N), "vacuum-ms/op")
			b.ReportMetric(float64(del)/float64(drop), "delete/drop")
			b.ReportMetric(float64(del+vacuum)/float64(drop), "delete+vacuum/drop")
			b.ReportMetric(float64(dropWAL)/1024/float64(b.N), "drop-WAL-KiB/op")
			b.ReportMetric(float64(delWAL)/(1<<20)/float64(b.N), "delete-WAL-MiB/op")
		})
	}
}

// walLSN returns the server's current WAL position in bytes.
func walLSN(b *testing.B, db *gorm.DB) int64 {
	b.Helper()
	var lsn int64
	if err := db.Raw(`SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&lsn).Error; err != nil {
		b.Fatal(err)
	}
	return lsn
}

// benchTable makes an inbox table in a schema of its own whose partition for
// day holds n rows, and whose next day's partition exists too, so that
// Maintain only has to expire day.
func benchTable(b *testing.B, db *gorm.DB, day time.Time, n int) *inboxpg.Store {
	b.Helper()
	schema := "inbox_bench_" + conformance.RandomSuffix()
	b.Cleanup(func() { _ = db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error })
	store, err := inboxpg.New(inboxpg.Options{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(b.Context(), db); err != nil {
		b.Fatal(err)
	}
	prep := storage.MaintenancePlan{Today: day, PrepareThrough: day.AddDate(0, 0, 1), ExpireBefore: day.AddDate(0, 0, -1)}
	if _, err := store.Maintain(b.Context(), db, prep); err != nil {
		b.Fatal(err)
	}
	d := day.Format(time.DateOnly)
	fill := `INSERT INTO "` + schema + `"."` + store.Table() + `" (consumer, event_id, day, event_time, topic, partition_no, offset_no)
		SELECT 'bench', 'evt-' || lpad(g::text, 10, '0'), ?::date, ?::timestamptz + g * interval '1 ms', 'orders', g % 12, g
		  FROM generate_series(1, ?) AS g`
	if err := db.Exec(fill, d, d, n).Error; err != nil {
		b.Fatal(err)
	}
	if err := db.Exec(`ANALYZE "` + schema + `"."` + store.Table() + `"`).Error; err != nil {
		b.Fatal(err)
	}
	return store
}
