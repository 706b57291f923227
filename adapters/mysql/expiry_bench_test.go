package mysql_test

import (
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkExpiry expires a day holding 1,000,000 inbox rows (100,000 with
// -short) three ways, side by side on equal days of one fresh table per
// iteration: DROP PARTITION; CONVERT PARTITION ... TO TABLE followed by DROP
// TABLE (what Maintain does: only the CONVERT holds the inbox table's
// metadata lock, reported apart as convert-ms); and the DELETE of that day's
// rows that a non-partitioned inbox would run. Filling is not timed.
//
//	go test -run '^$' -bench Expiry ./adapters/mysql/
func BenchmarkExpiry(b *testing.B) {
	rows := 1_000_000
	if testing.Short() {
		rows = 100_000
	}
	db, err := openDB(testservers.MySQLDSN(b), recommended)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	today := storage.DayOf(time.Now())
	var drop, convert, dropTable, del time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		store, err := inboxmysql.New(inboxmysql.Options{Table: "inbox_bench_" + conformance.RandomSuffix()})
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Migrate(b.Context(), db); err != nil {
			b.Fatal(err)
		}
		table := "`" + store.Table() + "`"
		days := []time.Time{today.AddDate(0, 0, 1), today.AddDate(0, 0, 2), today.AddDate(0, 0, 3)}
		for _, d := range days {
			fill(b, db, table, d, rows)
		}
		b.StartTimer()

		drop += timed(b, db, "ALTER TABLE "+table+" DROP PARTITION p"+days[0].Format("20060102"))
		retired := "`" + store.Table() + "_x`"
		convert += timed(b, db, "ALTER TABLE "+table+" CONVERT PARTITION p"+days[1].Format("20060102")+" TO TABLE "+retired)
		dropTable += timed(b, db, "DROP TABLE "+retired)
		del += timed(b, db, "DELETE FROM "+table+" WHERE day = '"+days[2].Format(time.DateOnly)+"'")

		b.StopTimer()
		if err := db.Exec("DROP TABLE " + table).Error; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(rows), "rows/day")
	b.ReportMetric(drop.Seconds()*1000/n, "drop-ms")
	b.ReportMetric(convert.Seconds()*1000/n, "convert-ms")
	b.ReportMetric(dropTable.Seconds()*1000/n, "drop-table-ms")
	b.ReportMetric(del.Seconds()*1000/n, "delete-ms")
	b.ReportMetric(del.Seconds()/drop.Seconds(), "delete/drop")
	b.ReportMetric(del.Seconds()/(convert+dropTable).Seconds(), "delete/(convert+drop-table)")
}

func timed(b *testing.B, db *gorm.DB, q string) time.Duration {
	start := time.Now()
	if err := db.Exec(q).Error; err != nil {
		b.Fatalf("%s: %v", q, err)
	}
	return time.Since(start)
}

// fill inserts n rows for day with one INSERT ... SELECT over a generated
// sequence (a cross join of digits: portable to MySQL 8 and MariaDB), in
// chunks of 100,000 so that no transaction grows too large.
func fill(b *testing.B, db *gorm.DB, table string, day time.Time, n int) {
	const chunk = 100_000
	for lo := 0; lo < n; lo += chunk {
		q := fmt.Sprintf(`INSERT INTO %s (consumer, event_id, day, event_time, topic, partition_no, offset_no, claim_token, processed_at)
			WITH RECURSIVE d (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 9)
			SELECT 'bench-consumer', CONCAT('event-', LPAD(s.n, 9, '0')), '%s', '%s 12:00:00', 'bench-topic', 0, s.n, 0, UTC_TIMESTAMP(6)
			FROM (SELECT %d + a.n + 10*b.n + 100*c.n + 1000*e.n + 10000*f.n AS n FROM d a, d b, d c, d e, d f) s
			WHERE s.n < %d`,
			table, day.Format(time.DateOnly), day.Format(time.DateOnly), lo, n)
		if err := db.Exec(q).Error; err != nil {
			b.Fatalf("fill %s: %v", day.Format(time.DateOnly), err)
		}
	}
}
