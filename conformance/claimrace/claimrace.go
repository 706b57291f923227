// Package claimrace runs concurrent, overlapping Store.Claim calls against a
// real database and counts the deadlocks they run into. The adapters' tests
// use it to show that Claim takes its row locks in one global order.
package claimrace

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Keys returns n fresh rows of consumer, spread over two days, with ids in
// ascending byte order.
func Keys(consumer string, n int) []storage.InboxRow {
	prefix := fmt.Sprintf("race-%016x-", rand.Uint64())
	today := storage.DayOf(time.Now())
	rows := make([]storage.InboxRow, n)
	for i := range rows {
		d := today.AddDate(0, 0, i%2)
		rows[i] = storage.InboxRow{Consumer: consumer, EventID: fmt.Sprintf("%s%06d", prefix, i), Day: d, EventTime: d.Add(time.Hour),
			Topic: "race", Partition: 0, Offset: int64(i)}
	}
	return rows
}

// OppositeOrders runs rounds rounds; in each, two transactions claim the same
// n fresh rows at the same moment, one in ascending key order and the other
// in descending order, and commit. A claim that fails with isDeadlock counts
// (and its transaction is rolled back); any other error ends the run.
// Claims that lock rows in the order they are given deadlock in most rounds.
func OppositeOrders(ctx context.Context, db *gorm.DB, store storage.InboxStore, rounds, n int, isDeadlock func(error) bool) (deadlocks int, err error) {
	for range rounds {
		asc := Keys("opposite", n)
		desc := slices.Clone(asc)
		slices.Reverse(desc)
		errs := together(ctx, db, store, [][]storage.InboxRow{asc, desc})
		for _, err := range errs {
			switch {
			case err == nil:
			case isDeadlock(err):
				deadlocks++
			default:
				return deadlocks, err
			}
		}
	}
	return deadlocks, nil
}

// together claims each batch in a transaction of its own, all claims
// starting at the same moment, commits those that succeed and returns each
// batch's error.
func together(ctx context.Context, db *gorm.DB, store storage.InboxStore, batches [][]storage.InboxRow) []error {
	errs := make([]error, len(batches))
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i, rows := range batches {
		ready.Add(1)
		done.Go(func() {
			tx := db.WithContext(ctx).Begin()
			if tx.Error != nil {
				ready.Done()
				errs[i] = tx.Error
				return
			}
			// A first statement takes the connection and starts the
			// transaction before the claims race.
			errs[i] = tx.Exec("SELECT 1").Error
			ready.Done()
			<-start
			if errs[i] == nil {
				_, errs[i] = store.Claim(ctx, tx, rows)
			}
			if errs[i] != nil {
				tx.Rollback()
				return
			}
			errs[i] = tx.Commit().Error
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	return errs
}

// StressResult is what Overlapping counts.
type StressResult struct {
	Claims    int // claims that committed
	Retries   int // claims run again after a retryable error
	Deadlocks int // of those retries, the ones after a deadlock
}

// Overlapping runs rounds rounds; in each, workers transactions at once each
// claim batch rows drawn from the same pool of pool fresh rows, shuffled,
// and commit. A claim that fails with a retryable error (store.IsRetryable)
// is run again in a new transaction until it commits, as the inbox does;
// the retries, and those of them caused by a deadlock, are counted.
func Overlapping(ctx context.Context, db *gorm.DB, store storage.InboxStore, workers, rounds, pool, batch int, isDeadlock func(error) bool) (StressResult, error) {
	var res StressResult
	for range rounds {
		keys := Keys("overlap", pool)
		batches := make([][]storage.InboxRow, workers)
		for w := range batches {
			perm := rand.Perm(pool)[:batch]
			for _, i := range perm {
				batches[w] = append(batches[w], keys[i])
			}
		}
		for len(batches) > 0 {
			errs := together(ctx, db, store, batches)
			var again [][]storage.InboxRow
			for i, err := range errs {
				switch {
				case err == nil:
					res.Claims++
				case store.IsRetryable(err):
					res.Retries++
					if isDeadlock(err) {
						res.Deadlocks++
					}
					again = append(again, batches[i])
				default:
					return res, err
				}
			}
			batches = again
		}
	}
	return res, nil
}

// CallerOrder claims every third of n fresh rows and commits, then claims
// all n, shuffled, and returns an error unless Claim reported inserted[i]
// for rows[i] in the order given: true exactly for the rows not claimed
// before. With n above a Store's rows per statement it spans statements.
func CallerOrder(ctx context.Context, db *gorm.DB, store storage.InboxStore, n int) error {
	rows := Keys("order", n)
	claimedBefore := make(map[storage.InboxKey]bool)
	var before []storage.InboxRow
	for i, r := range rows {
		if i%3 == 0 {
			before = append(before, r)
			claimedBefore[r.Key()] = true
		}
	}
	claim := func(rows []storage.InboxRow) (inserted []bool, err error) {
		err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			inserted, err = store.Claim(ctx, tx, rows)
			return err
		})
		return inserted, err
	}
	if _, err := claim(before); err != nil {
		return err
	}
	rand.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	inserted, err := claim(rows)
	if err != nil {
		return err
	}
	var wrong int
	for i, r := range rows {
		if inserted[i] == claimedBefore[r.Key()] {
			wrong++
		}
	}
	if wrong > 0 {
		return fmt.Errorf("claimrace: %d of %d shuffled rows reported wrongly (inserted vs duplicate)", wrong, len(rows))
	}
	return nil
}

// TestOppositeOrders fails t if OppositeOrders over rounds rounds of n keys
// meets a deadlock, or any other error.
func TestOppositeOrders(t testing.TB, db *gorm.DB, store storage.InboxStore, rounds, n int, isDeadlock func(error) bool) {
	t.Helper()
	deadlocks, err := OppositeOrders(t.Context(), db, store, rounds, n, isDeadlock)
	if err != nil {
		t.Fatal(err)
	}
	if deadlocks > 0 {
		t.Errorf("%d deadlocks in %d rounds of two claims of the same %d keys in opposite orders, want 0", deadlocks, rounds, n)
	}
}

// TestStress runs Overlapping with 4 workers over 50 rounds of batches of
// 100 keys out of 200, logs its counts, and fails t on an error or on more
// than a deadlock per ten rounds.
func TestStress(t testing.TB, db *gorm.DB, store storage.InboxStore, isDeadlock func(error) bool) {
	t.Helper()
	const workers, rounds, pool, batch = 4, 50, 200, 100
	res, err := Overlapping(t.Context(), db, store, workers, rounds, pool, batch, isDeadlock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d workers x %d rounds, batches of %d of %d keys: %d claims, %d retries, %d deadlocks",
		workers, rounds, batch, pool, res.Claims, res.Retries, res.Deadlocks)
	if res.Deadlocks > rounds/10 {
		t.Errorf("%d deadlocks in %d rounds, want (near) 0", res.Deadlocks, rounds)
	}
}
