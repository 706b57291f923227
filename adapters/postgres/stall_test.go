package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// waitForWaiter waits until some backend running a statement that starts
// with prefix waits for a lock.
func waitForWaiter(t *testing.T, db *gorm.DB, prefix string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		if err := db.Raw(`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND starts_with(query, ?))`, prefix).Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no backend running %q waits for a lock", prefix)
}

// claimAtOnce claims r in a transaction whose statements may wait 3 s at
// most, and reports how long it took.
func claimAtOnce(t *testing.T, db *gorm.DB, store *inboxpg.Store, r storage.InboxRow) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SET LOCAL statement_timeout = '3s'`).Error; err != nil {
			return err
		}
		_, err := store.Claim(t.Context(), tx, []storage.InboxRow{r})
		return err
	})
	return time.Since(start), err
}

// While an expiry's concurrent detach waits for a transaction that started
// before it (here one that holds an uncommitted row of today), claims of
// live days go through, and so does making a far-future day's partition on
// demand: nothing that inserts waits for the detach. With the earlier
// layout, DETACH took ACCESS EXCLUSIVE on the inbox table and every insert
// queued behind it for as long as it waited.
func TestExpiryDoesNotHoldUpInserts(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "held", LockTimeout: 20 * time.Second})
	ctx := t.Context()
	today := storage.DayOf(time.Now())
	yesterday := today.AddDate(0, 0, -1)
	claim(t, db, store, row("old", yesterday))
	holder := db.Begin()
	defer holder.Rollback()
	if _, err := store.Claim(ctx, holder, []storage.InboxRow{row("held", today)}); err != nil {
		t.Fatal(err)
	}
	maintained := make(chan error, 1)
	go func() {
		_, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today})
		maintained <- err
	}()
	waitForWaiter(t, db, "ALTER TABLE")

	if waited, err := claimAtOnce(t, db, store, row("live-1", today)); err != nil || waited > time.Second {
		t.Errorf("claim of a live day while the detach waits: %v after %v; want it through at once", err, waited)
	}
	far := time.Date(2150, 6, 1, 0, 0, 0, 0, time.UTC)
	start := time.Now()
	if err := store.PrepareDays(ctx, db, []time.Time{far}); err != nil || time.Since(start) > time.Second {
		t.Errorf("making a far-future day while the detach waits: %v after %v; want it done at once", err, time.Since(start))
	}
	if waited, err := claimAtOnce(t, db, store, row("far-1", far)); err != nil || waited > time.Second {
		t.Errorf("claim of the far-future day: %v after %v", err, waited)
	}
	holder.Rollback()
	if err := <-maintained; err != nil {
		t.Fatal(err)
	}
	got := rowsPerPartition(t, db, store)
	if got["held_p"+yesterday.Format("20060102")] != 0 || got["held_p"+today.Format("20060102")] != 1 || got["held_p"+far.Format("20060102")] != 1 {
		t.Errorf("rows per partition: %v", got)
	}
}

// Making a day's partition on demand while a transaction holds uncommitted
// rows of the inbox table (the caller's own, under ProcessTx) does not wait
// for it, and that transaction then claims into the new partition: ProcessTx
// of a far-future event, in a transaction that claimed a row of today
// first, is processed and is a duplicate afterwards.
func TestDayIsMadeBesideOpenTransactions(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "beside", LockTimeout: 20 * time.Second})
	ctx := t.Context()
	today := storage.DayOf(time.Now())
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *gorm.DB, inbox.Message) error { return nil }
	for i, far := range []time.Time{today.AddDate(3, 0, 0), today.AddDate(4, 0, 0)} {
		msg := inbox.Message{Consumer: "c", ID: fmt.Sprintf("far-%d", i), Time: far}
		err := db.Transaction(func(tx *gorm.DB) error {
			if _, err := store.Claim(ctx, tx, []storage.InboxRow{row(fmt.Sprintf("open-%d", i), today)}); err != nil {
				return err
			}
			if i == 1 {
				// Another transaction makes the day meanwhile.
				if err := store.PrepareDays(ctx, db, []time.Time{far}); err != nil {
					return err
				}
			}
			out, err := ib.ProcessTx(ctx, tx, msg, nop)
			if err == nil && out != inbox.Processed {
				err = fmt.Errorf("outcome %v", out)
			}
			return err
		})
		if err != nil {
			t.Fatalf("ProcessTx of a far-future event in a transaction holding a row of today: %v", err)
		}
		if out, err := ib.Process(ctx, msg, nop); err != nil || out != inbox.Duplicate {
			t.Errorf("redelivery: %v %v", out, err)
		}
	}
}
