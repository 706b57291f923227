package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/inboxgo/inbox/inbox"
)

// PrefillDays is how many days (ending today) pre-filled rows are spread
// over, one retention window's worth at the inbox's default retention.
const PrefillDays = 30

// DefaultSizes are the inbox sizes of the growth benchmark.
var DefaultSizes = []int{0, 1_000_000, 10_000_000}

// DefaultFillBudget bounds the time spent pre-filling one table. A fill
// that would not finish in it stops early and is reported as incomplete.
const DefaultFillBudget = 6 * time.Minute

// prefillChunk is the rows of one INSERT ... SELECT statement. Each
// statement inserts its rows in key order: one sweep through the key index
// instead of a random page per row, which is what makes 10M rows fit in a
// few minutes on a small machine. The rows, and so the index, are the same.
const prefillChunk = 2_000_000

// ParseSizes parses a comma-separated list of row counts ("0,1e6,10000000").
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bench: bad size %q", f)
		}
		out = append(out, int(v))
	}
	return out, nil
}

// Fill says how a pre-fill went.
type Fill struct {
	Rows     int // rows written
	Want     int
	Elapsed  time.Duration
	Complete bool
}

// RowsPerSec is the fill rate.
func (f Fill) RowsPerSec() float64 {
	if f.Elapsed <= 0 {
		return 0
	}
	return float64(f.Rows) / f.Elapsed.Seconds()
}

// Prefill writes n rows into the fixture's inbox table with set-based SQL,
// in statements of prefillChunk rows sorted by id, spread evenly over the days
// last-days+1 .. last, with random-looking ids (ending in "-p") so that they
// land all over the key index like real ids. It stops early once the
// projected total time exceeds budget, and then reports Complete false. The
// table is analysed afterwards.
func Prefill(ctx context.Context, f *Fixture, n int, last time.Time, days int, budget time.Duration) (Fill, error) {
	fill := Fill{Want: n}
	db := f.Backend.DB.WithContext(ctx)
	start := time.Now()
	lastDay := last.Format(time.DateOnly)
	for lo := 1; lo <= n; lo += prefillChunk {
		hi := min(lo+prefillChunk-1, n)
		var q string
		var args []any
		switch f.Backend.Dialect {
		case Postgres:
			q = `INSERT INTO ` + f.InboxTable + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no)
				SELECT ?, md5(g::text) || '-p', ?::date - (g % ?)::int,
				       ((?::date - (g % ?)::int) + make_interval(secs => g % 86400)) AT TIME ZONE 'UTC', 'prefill', 0, g
				  FROM generate_series(?::bigint, ?::bigint) AS g
				 ORDER BY 2`
			args = []any{ConsumerName, lastDay, days, lastDay, days, lo, hi}
		case MySQL:
			// MariaDB's SEQUENCE engine; the table's name carries the bounds.
			q = fmt.Sprintf("INSERT INTO "+f.InboxTable+` (consumer, event_id, day, event_time, topic, partition_no, offset_no, claim_token, processed_at)
				SELECT ?, CONCAT(MD5(seq), '-p'), ? - INTERVAL (seq %% ?) DAY,
				       (? - INTERVAL (seq %% ?) DAY) + INTERVAL (seq %% 86400) SECOND, 'prefill', 0, seq, 0, UTC_TIMESTAMP(6)
				  FROM seq_%d_to_%d
				 ORDER BY 2`, lo, hi)
			args = []any{ConsumerName, lastDay, days, lastDay, days}
		default:
			q = `WITH RECURSIVE g(n) AS (SELECT ? UNION ALL SELECT n + 1 FROM g WHERE n < ?)
				INSERT INTO ` + f.InboxTable + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no)
				SELECT ?, printf('%08x%08x%08x-p', (n * 2654435761) % 4294967296, (n * 2246822519 + 374761393) % 4294967296, (n * 3266489917 + 668265263) % 4294967296),
				       date(?, '-' || (n % ?) || ' days'),
				       strftime('%Y-%m-%dT%H:%M:%SZ', ?, '-' || (n % ?) || ' days', '+' || (n % 86400) || ' seconds'),
				       'prefill', 0, n
				  FROM g
				 ORDER BY 2`
			args = []any{lo, hi, ConsumerName, lastDay, days, lastDay, days}
		}
		if err := db.Exec(q, args...).Error; err != nil {
			return fill, fmt.Errorf("bench: prefill %s rows %d..%d: %w", f.InboxTable, lo, hi, err)
		}
		fill.Rows = hi
		fill.Elapsed = time.Since(start)
		if hi < n && time.Duration(float64(fill.Elapsed)*float64(n)/float64(hi)) > budget {
			return fill, nil
		}
	}
	fill.Complete = true
	q := map[Dialect]string{SQLite: `ANALYZE ` + f.InboxTable, Postgres: `ANALYZE ` + f.InboxTable, MySQL: `ANALYZE TABLE ` + f.InboxTable}[f.Backend.Dialect]
	if err := db.Exec(q).Error; err != nil {
		return fill, fmt.Errorf("bench: analyze %s: %w", f.InboxTable, err)
	}
	// A table that grew over weeks is vacuumed (PostgreSQL: a fresh bulk
	// load has no visibility map) and long since checkpointed; without the
	// checkpoint, the first measured transactions pay for writing out the
	// bulk load (SQLite: a WAL of every filled page).
	var after []string
	switch f.Backend.Dialect {
	case Postgres:
		after = []string{`VACUUM ` + f.InboxTable, `CHECKPOINT`}
	case SQLite:
		after = []string{`PRAGMA wal_checkpoint(TRUNCATE)`}
	}
	for _, q := range after {
		if err := db.Exec(q).Error; err != nil {
			return fill, fmt.Errorf("bench: %s: %w", q, err)
		}
	}
	fill.Elapsed = time.Since(start)
	return fill, nil
}

// GrowthPoint is the throughput of (b) at one inbox size.
type GrowthPoint struct {
	Size   int
	Fill   Fill
	Result Result // (b) on the pre-filled table
	// Empty is (b) on an empty inbox table, run right after Result (rounds
	// alternate between the two), so that both see the same machine load.
	Empty Result
	Ratio float64 // Result's throughput / Empty's
}

// Growth runs variant (b) on fresh tables pre-filled with each of sizes rows
// (spread over PrefillDays days ending today), with the same events and
// options at every size, each time side by side with an empty inbox table.
// A size whose fill does not finish within budget is reported with an
// incomplete Fill and no result.
func Growth(ctx context.Context, b *Backend, sizes []int, o Options, budget time.Duration) ([]GrowthPoint, error) {
	o = o.withDefaults()
	var points []GrowthPoint
	for _, size := range sizes {
		p, err := growthPoint(ctx, b, size, o, budget)
		if err != nil {
			return points, err
		}
		points = append(points, p)
	}
	return points, nil
}

func growthPoint(ctx context.Context, b *Backend, size int, o Options, budget time.Duration) (GrowthPoint, error) {
	p := GrowthPoint{Size: size}
	v, _ := VariantByKey("b")
	full, err := NewFixture(ctx, b, o.SKUs, inbox.Config{}, PrefillDays)
	if err != nil {
		return p, err
	}
	defer func() { _ = full.Drop(context.WithoutCancel(ctx)) }()
	p.Fill, err = Prefill(ctx, full, size, Today(), PrefillDays, budget)
	if err != nil || !p.Fill.Complete {
		return p, err
	}
	empty, err := NewFixture(ctx, b, o.SKUs, inbox.Config{}, PrefillDays)
	if err != nil {
		return p, err
	}
	defer func() { _ = empty.Drop(context.WithoutCancel(ctx)) }()
	var fullRs, emptyRs []Result
	for round := range o.Rounds {
		// Every round sends events not seen before.
		evs := make([]Event, o.Events)
		for i := range evs {
			evs[i] = NewEvent(int64(round*o.Events+i), o.SKUs, Today())
		}
		order := []*Fixture{full, empty}
		if round%2 == 1 {
			order[0], order[1] = empty, full
		}
		for _, f := range order {
			r, err := Apply(ctx, f, v, evs, o.Workers, o.BatchSize)
			if err != nil {
				return p, err
			}
			if r.Applied != int64(len(evs)) {
				return p, fmt.Errorf("bench: %d rows pre-filled: applied %d of %d", size, r.Applied, len(evs))
			}
			if f == full {
				fullRs = append(fullRs, r)
			} else {
				emptyRs = append(emptyRs, r)
			}
		}
	}
	p.Result, p.Empty = Median(fullRs), Median(emptyRs)
	p.Ratio = p.Result.EventsPerSec() / p.Empty.EventsPerSec()
	return p, nil
}
