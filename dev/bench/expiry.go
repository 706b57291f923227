package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// DefaultExpiryRows is the size of the expired day in ExpiryLoad.
const DefaultExpiryRows = 1_000_000

// Expiry modes.
const (
	ExpiryNone     = "none"     // no expiry: the reference
	ExpiryMaintain = "maintain" // the Store's own expiry (Inbox.MaintainPlan)
	ExpiryDelete   = "delete"   // one DELETE ... WHERE day < cutoff, as row-based inboxes do
	// ExpiryBatches deletes the expired rows 1000 at a time, each batch its
	// own transaction (the SQLite Store's expiry): no DDL on the inbox
	// table at all, the reference for what expiry costs without a
	// partition change.
	ExpiryBatches = "batches"
)

// expiryBatch is the rows per transaction of ExpiryBatches.
const expiryBatch = 1000

// ExpiryResult is the insert latency of Process workers while a day of rows
// expires.
type ExpiryResult struct {
	Mode       string
	Rows       int           // rows of the expired day
	ExpiryTime time.Duration // how long the expiry took (0 for none)
	Removed    int64         // rows removed as the Store reports them (-1: dropped partition)
	Ops        int           // Process calls overlapping the expiry (the whole run for none)
	P50, P99   time.Duration // of those calls
	Max        time.Duration
	P99Ratio   float64 // P99 / the none run's P99
	// WindowP99 is the median p99 of the none run's disjoint windows as
	// long as this expiry (at least windowMinOps calls each), and
	// WindowP99Max the highest of them: the p99 of a window of a few
	// hundred calls is close to its maximum, so a short expiry is compared
	// with windows of its own length, not with the p99 of a whole run.
	WindowP99, WindowP99Max time.Duration
	WindowRatio             float64 // P99 / WindowP99
	WindowCount             int     // windows behind WindowP99
	EventsPerSec            float64 // Process throughput over the whole run

	ops     []Op // the run's calls
	elapsed time.Duration
}

// windowMinOps is the fewest calls a window of the none run needs to count.
const windowMinOps = 50

// windowP99s returns the p99 of each disjoint window of length w over ops,
// sorted, skipping windows with fewer than windowMinOps calls.
func windowP99s(ops []Op, elapsed, w time.Duration) []time.Duration {
	if w <= 0 {
		return nil
	}
	var p99s []time.Duration
	for from := time.Duration(0); from+w <= elapsed; from += w {
		n := 0
		for _, op := range ops {
			if op.Start+op.Dur >= from && op.Start < from+w {
				n++
			}
		}
		if n >= windowMinOps {
			p99s = append(p99s, quantile(ops, 0.99, from, from+w))
		}
	}
	slices.Sort(p99s)
	return p99s
}

// ExpiryLoad pre-fills one day (today) with rows rows, then runs o.Workers
// workers calling Process for events dated four days later, and after one
// second expires the day: not at all, by the Store's Maintain, or by one
// DELETE. The workers run on until the expiry is done and at least minRun
// has passed. Each mode gets fresh tables.
func ExpiryLoad(ctx context.Context, b *Backend, rows int, o Options) ([]ExpiryResult, error) {
	o = o.withDefaults()
	var out []ExpiryResult
	for _, mode := range []string{ExpiryNone, ExpiryMaintain, ExpiryDelete, ExpiryBatches} {
		r, err := expiryRun(ctx, b, rows, mode, o)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	for i := range out {
		if out[0].P99 > 0 {
			out[i].P99Ratio = float64(out[i].P99) / float64(out[0].P99)
		}
		if i > 0 {
			if ws := windowP99s(out[0].ops, out[0].elapsed, out[i].ExpiryTime); len(ws) > 0 {
				out[i].WindowP99, out[i].WindowP99Max, out[i].WindowCount = ws[len(ws)/2], ws[len(ws)-1], len(ws)
				out[i].WindowRatio = float64(out[i].P99) / float64(out[i].WindowP99)
			}
		}
	}
	return out, nil
}

// expiryLead is how long the workers run before the expiry starts, and
// minRun the shortest run.
const (
	expiryLead = time.Second
	minRun     = 6 * time.Second
)

func expiryRun(ctx context.Context, b *Backend, rows int, mode string, o Options) (ExpiryResult, error) {
	res := ExpiryResult{Mode: mode, Rows: rows}
	// The expired day is today's, and the workers' events are dated four
	// days later, on an inbox whose clock runs four days ahead and that keeps
	// two days: so the expired day has a partition of its own on every
	// Store (MariaDB's Migrate makes partitions from yesterday on), and
	// Inbox.MaintainPlan accepts expiring it.
	today := Today()
	later := today.AddDate(0, 0, 4)
	cfg := inbox.Config{RetentionDays: 2, Now: func() time.Time { return time.Now().AddDate(0, 0, 4) }}
	f, err := NewFixture(ctx, b, o.SKUs, cfg, 0)
	if err != nil {
		return res, err
	}
	defer func() { _ = f.Drop(context.WithoutCancel(ctx)) }()
	if _, err := Prefill(ctx, f, rows, today, 1, 24*time.Hour); err != nil {
		return res, err
	}
	if err := warm(ctx, b, o.Workers+1); err != nil {
		return res, err
	}
	v, _ := VariantByKey("b")
	var (
		next             atomic.Int64
		expiryDone       atomic.Bool
		expStart, expEnd time.Duration
		expErr           error
	)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	ops := make([][]Op, o.Workers)
	errs := make([]error, o.Workers)
	var wg sync.WaitGroup
	for w := range o.Workers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				if el := time.Since(start); el >= minRun && (mode == ExpiryNone || expiryDone.Load()) {
					return
				}
				e := NewEvent(next.Add(1)-1, o.SKUs, later)
				t0 := time.Now()
				_, err := v.apply(runCtx, f, []Event{e})
				ops[w] = append(ops[w], Op{Start: t0.Sub(start), Dur: time.Since(t0)})
				if err != nil {
					errs[w] = err
					cancel()
					return
				}
			}
		})
	}
	if mode != ExpiryNone {
		wg.Go(func() {
			defer expiryDone.Store(true)
			select {
			case <-runCtx.Done():
				return
			case <-time.After(expiryLead):
			}
			cutoff := today.AddDate(0, 0, 1)
			expStart = time.Since(start)
			switch mode {
			case ExpiryMaintain:
				var rep storage.MaintenanceReport
				rep, expErr = f.Inbox.MaintainPlan(runCtx, storage.MaintenancePlan{Today: later, PrepareThrough: later, ExpireBefore: cutoff})
				res.Removed = rep.RowsRemoved
			case ExpiryDelete:
				r := b.DB.WithContext(runCtx).Exec(`DELETE FROM `+f.InboxTable+` WHERE day < ?`, cutoffArg(b.Dialect, cutoff))
				expErr, res.Removed = r.Error, r.RowsAffected
			case ExpiryBatches:
				res.Removed, expErr = DeleteInBatches(runCtx, b, f.InboxTable, cutoff)
			}
			expEnd = time.Since(start)
			if expErr != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if expErr != nil {
		return res, fmt.Errorf("bench: expiry (%s) on %s: %w", mode, b.Name, expErr)
	}
	for _, err := range errs {
		if err != nil {
			return res, fmt.Errorf("bench: Process during expiry (%s) on %s: %w", mode, b.Name, err)
		}
	}
	var all []Op
	for _, o := range ops {
		all = append(all, o...)
	}
	res.EventsPerSec = float64(len(all)) / elapsed.Seconds()
	res.ops, res.elapsed = all, elapsed
	from, to := time.Duration(0), elapsed
	if mode != ExpiryNone {
		from, to = expStart, expEnd
		res.ExpiryTime = expEnd - expStart
	}
	for _, op := range all {
		if op.Start+op.Dur >= from && op.Start < to {
			res.Ops++
		}
	}
	res.P50 = quantile(all, 0.5, from, to+1)
	res.P99 = quantile(all, 0.99, from, to+1)
	res.Max = quantile(all, 1, from, to+1)
	if mode != ExpiryNone {
		left, err := f.InboxRows(ctx)
		if err != nil {
			return res, err
		}
		if want := int64(len(all)); left != want {
			return res, fmt.Errorf("bench: after expiry (%s) on %s the inbox holds %d rows, want the %d processed", mode, b.Name, left, want)
		}
	}
	return res, nil
}

// DeleteInBatches deletes the rows of table whose day is before cutoff,
// expiryBatch rows per statement, each statement its own transaction, and
// returns how many it deleted.
func DeleteInBatches(ctx context.Context, b *Backend, table string, cutoff time.Time) (int64, error) {
	q := `DELETE FROM ` + table + ` WHERE day < ? LIMIT ` + fmt.Sprint(expiryBatch)
	switch b.Dialect {
	case Postgres:
		// A ctid names a row within one partition only: the day bound
		// keeps the other partitions' rows out.
		q = `DELETE FROM ` + table + ` WHERE day < ?::date AND ctid = ANY(ARRAY(SELECT ctid FROM ` + table + ` WHERE day < ?::date LIMIT ` + fmt.Sprint(expiryBatch) + `))`
	case SQLite:
		q = `DELETE FROM ` + table + ` WHERE rowid IN (SELECT rowid FROM ` + table + ` WHERE day < ? LIMIT ` + fmt.Sprint(expiryBatch) + `)`
	}
	var removed int64
	for {
		arg := cutoffArg(b.Dialect, cutoff)
		args := []any{arg}
		if b.Dialect == Postgres {
			args = append(args, arg)
		}
		r := b.DB.WithContext(ctx).Exec(q, args...)
		if r.Error != nil {
			return removed, r.Error
		}
		removed += r.RowsAffected
		if r.RowsAffected < expiryBatch {
			return removed, nil
		}
	}
}

// cutoffArg is a day as the dialect's day column compares it.
func cutoffArg(d Dialect, day time.Time) any {
	return day.Format(time.DateOnly)
}
