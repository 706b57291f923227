package mysql_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// TestOutboxDropsOnlyPublishedPartitions runs Maintain with a plan dated
// ahead so that the day partitions Migrate made expire: the one whose rows
// are published is dropped, the one holding an unpublished row is kept
// until a relay publishes it.
func TestOutboxDropsOnlyPublishedPartitions(t *testing.T) {
	ctx := t.Context()
	h, err := newHarness(testservers.MySQLDSN(t), recommended, nil, true, func(bool) {})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	today := storage.DayOf(time.Now())
	clock := today.AddDate(0, 0, -1).Add(12 * time.Hour)
	ob, err := outbox.New(h.DB, h.Outbox, outbox.Config{Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	enqueue := func(v string) {
		t.Helper()
		if err := h.DB.Transaction(func(tx *gorm.DB) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte(v)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	rec := &conformance.Recorder{}
	relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	enqueue("yesterday")
	if _, err := conformance.Drain(ctx, relay); err != nil {
		t.Fatal(err)
	}
	clock = clock.AddDate(0, 0, 1)
	enqueue("today")
	plan := storage.MaintenancePlan{Today: today.AddDate(0, 0, 1), PrepareThrough: today.AddDate(0, 0, 2), ExpireBefore: today.AddDate(0, 0, 1)}
	report, err := h.Outbox.Maintain(ctx, h.DB, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(report.Expired, today.AddDate(0, 0, -1).Equal) || !slices.ContainsFunc(report.Held, today.Equal) || report.RowsRemoved != -1 {
		t.Fatalf("report %+v: want yesterday dropped and today held", report)
	}
	if n, err := conformance.Drain(ctx, relay); err != nil || n != 1 {
		t.Fatalf("the held row: published %d (err %v), want 1", n, err)
	}
	if report, err = h.Outbox.Maintain(ctx, h.DB, plan); err != nil || len(report.Held) != 0 || !slices.ContainsFunc(report.Expired, today.Equal) {
		t.Fatalf("after publishing, report %+v (err %v): want today dropped", report, err)
	}
	stats, err := h.Outbox.(storage.StatsReporter).Stats(ctx, h.DB)
	if err != nil || len(stats) != 0 {
		t.Fatalf("rows left: %+v (err %v)", stats, err)
	}
}

// TestOutboxAppendFewShardsNoDeadlock: transactions that each append to
// most of a small table's shards (an aligned outbox of 8 partitions) wait
// for each other and never deadlock. The counter UPDATE must lock only its
// own shards' rows: on a table this small InnoDB's optimizer would scan the
// whole index for it, locking the others' rows out of order.
func TestOutboxAppendFewShardsNoDeadlock(t *testing.T) {
	ctx := t.Context()
	db, err := openDB(testservers.MySQLDSN(t), recommended)
	if err != nil {
		t.Fatal(err)
	}
	store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "outbox_" + conformance.RandomSuffix(), Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, suffix := range []string{"", "_shards", "_relay", "_source"} {
			db.Exec("DROP TABLE IF EXISTS `" + store.Table() + suffix + "`")
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	// Random keys: each transaction takes about 6 of the 8 shards, a
	// different subset each time.
	const writers, txs, perTx = 8, 25, 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range txs {
				rows := make([]storage.OutboxRow, perTx)
				for j := range rows {
					rows[j] = storage.OutboxRow{KeyHash: rng.Uint32(), Day: storage.DayOf(time.Now()), EventID: fmt.Sprintf("%d-%d-%d", w, i, j), Topic: "t", Value: []byte{}, Headers: []byte("[]")}
				}
				if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return store.Append(ctx, tx, rows) }); err != nil {
					t.Errorf("writer %d, transaction %d: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
