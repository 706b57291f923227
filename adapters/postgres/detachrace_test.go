package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/storage"
)

// TestDetachRaceIsRetryable reproduces, step by step, the one race in which
// PostgreSQL raises XX000 "invalid arbiter index list" from
// ExecInitPartitionInfo: a claim at REPEATABLE READ (or SERIALIZABLE) takes
// its view of the partitions, which at snapshot isolation still holds a
// partition whose DETACH ... CONCURRENTLY has begun, before the detach
// finalizes, and opens that partition after it did, when the partition's
// key index no longer belongs to the inbox table's.
//
// The error must be retryable, and running the claim again must find no
// partition for the row (a missing day, made again on demand), not the same
// internal error. At READ COMMITTED the claim's view leaves the partition
// out from the start: a missing day at once.
func TestDetachRaceIsRetryable(t *testing.T) {
	for _, c := range []struct {
		name string
		iso  sql.IsolationLevel
	}{{"repeatable-read", sql.LevelRepeatableRead}, {"serializable", sql.LevelSerializable}} {
		t.Run(c.name, func(t *testing.T) {
			db, store, rows, err := claimDuringDetach(t, c.iso)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "XX000" || pe.Routine != "ExecInitPartitionInfo" {
				t.Fatalf("claim routed into the partition whose detach finalized meanwhile: %v (%#v), want XX000 raised in ExecInitPartitionInfo", err, pe)
			}
			t.Logf("reproduced: %v (routine %s, %s:%d)", err, pe.Routine, pe.File, pe.Line)
			if !store.IsRetryable(err) {
				t.Errorf("the claim's routing race with a concurrent detach is not retryable: %v", err)
			}
			err = db.WithContext(t.Context()).Transaction(func(tx *gorm.DB) error {
				_, err := store.Claim(t.Context(), tx, rows)
				return err
			}, &sql.TxOptions{Isolation: c.iso})
			if err == nil || !store.IsMissingDay(err) {
				t.Fatalf("the claim run again: %v, want a missing day for yesterday's row", err)
			}
		})
	}
	t.Run("read-committed", func(t *testing.T) {
		_, store, _, err := claimDuringDetach(t, sql.LevelReadCommitted)
		if err == nil || !store.IsMissingDay(err) {
			t.Fatalf("claim at READ COMMITTED during a concurrent detach: %v, want a missing day", err)
		}
	})
}

// claimDuringDetach claims, at iso, a row of today and then one of
// yesterday, while yesterday's partition is detached concurrently: the
// claim takes its view of the partitions after the detach began, waits at
// today's partition (locked by another session) while the detach
// finalizes, and then routes yesterday's row. It returns the claim's error.
func claimDuringDetach(t *testing.T, iso sql.IsolationLevel) (*gorm.DB, *inboxpg.Store, []storage.InboxRow, error) {
	t.Helper()
	db, store := fresh(t, inboxpg.Options{Table: "race"})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	today := storage.DayOf(time.Now())
	yesterday := today.AddDate(0, 0, -1)
	parent := `"` + store.Schema() + `".race`
	partition := func(d time.Time) string { return `"` + store.Schema() + `".race_p` + d.Format("20060102") }

	// A transaction that holds the inbox table (ONLY: not its partitions):
	// the detach's first step commits, then the detach waits for it before
	// it finalizes.
	holder := db.WithContext(ctx).Begin()
	if err := holder.Exec(`LOCK TABLE ONLY ` + parent + ` IN ROW EXCLUSIVE MODE`).Error; err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	detached := make(chan error, 1)
	go func() {
		detached <- db.WithContext(ctx).Exec(`ALTER TABLE ` + parent + ` DETACH PARTITION ` + partition(yesterday) + ` CONCURRENTLY`).Error
	}()
	waitFor(t, db, `SELECT COALESCE((SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass(?)), false)`, partition(yesterday))

	blocker := db.WithContext(ctx).Begin()
	if err := blocker.Exec(`LOCK TABLE ` + partition(today) + ` IN SHARE MODE`).Error; err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback()
	// Claim sorts rows by key: today's ("a-...") is routed first.
	rows := []storage.InboxRow{row("a-today", today), row("b-yesterday", yesterday)}
	claimed := make(chan error, 1)
	go func() {
		claimed <- db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			_, err := store.Claim(ctx, tx, rows)
			return err
		}, &sql.TxOptions{Isolation: iso})
	}()
	waitForWaiter(t, db, "INSERT INTO")

	if err := holder.Commit().Error; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-detached:
		if err != nil {
			t.Fatalf("detach: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the detach did not finish while the claim waited")
	}
	if err := blocker.Commit().Error; err != nil {
		t.Fatal(err)
	}
	return db, store, rows, <-claimed
}

// waitFor polls query (one boolean) until it answers true.
func waitFor(t *testing.T, db *gorm.DB, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		if err := db.Raw(query, args...).Scan(&ok).Error; err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("still false after 10s: %s %v", query, args)
}
