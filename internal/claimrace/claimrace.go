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
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

// Keys returns n fresh rows of consumer, spread over two days, with ids in
// ascending byte order.
func Keys(consumer string, n int) []inbox.Row {
	prefix := fmt.Sprintf("race-%016x-", rand.Uint64())
	today := inbox.DayOf(time.Now())
	rows := make([]inbox.Row, n)
	for i := range rows {
		d := today.AddDate(0, 0, i%2)
		rows[i] = inbox.Row{Consumer: consumer, EventID: fmt.Sprintf("%s%06d", prefix, i), Day: d, EventTime: d.Add(time.Hour),
			Topic: "race", Partition: 0, Offset: int64(i)}
	}
	return rows
}

// OppositeOrders runs rounds rounds; in each, two transactions claim the same
// n fresh rows at the same moment, one in ascending key order and the other
// in descending order, and commit. A claim that fails with isDeadlock counts
// (and its transaction is rolled back); any other error ends the run.
// Claims that lock rows in the order they are given deadlock in most rounds.
func OppositeOrders(ctx context.Context, db *gorm.DB, store inbox.Store, rounds, n int, isDeadlock func(error) bool) (deadlocks int, err error) {
	for range rounds {
		asc := Keys("opposite", n)
		desc := slices.Clone(asc)
		slices.Reverse(desc)
		errs := together(ctx, db, store, [][]inbox.Row{asc, desc})
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
func together(ctx context.Context, db *gorm.DB, store inbox.Store, batches [][]inbox.Row) []error {
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
func Overlapping(ctx context.Context, db *gorm.DB, store inbox.Store, workers, rounds, pool, batch int, isDeadlock func(error) bool) (StressResult, error) {
	var res StressResult
	for range rounds {
		keys := Keys("overlap", pool)
		batches := make([][]inbox.Row, workers)
		for w := range batches {
			perm := rand.Perm(pool)[:batch]
			for _, i := range perm {
				batches[w] = append(batches[w], keys[i])
			}
		}
		for len(batches) > 0 {
			errs := together(ctx, db, store, batches)
			var again [][]inbox.Row
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
