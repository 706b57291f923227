package mysql_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// newOutboxHarness gives every check its own tables, dropped again in Close.
func newOutboxHarness(dsn string, open opener) conformance.OutboxHarnessMaker {
	return func(ctx context.Context) (*conformance.OutboxHarness, error) {
		db, err := openDB(dsn, open)
		if err != nil {
			return nil, err
		}
		store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "outbox_" + conformance.RandomSuffix(), Shards: 16})
		if err != nil {
			return nil, err
		}
		return &conformance.OutboxHarness{
			DB:    db,
			Store: store,
			Open:  func(context.Context) (*gorm.DB, error) { return openDB(dsn, open) },
			Close: func() error {
				var dropErr error
				for _, suffix := range []string{"", "_shards", "_relay"} {
					if err := db.Exec("DROP TABLE IF EXISTS `" + store.Table() + suffix + "`").Error; err != nil && dropErr == nil {
						dropErr = err
					}
				}
				sqlDB, err := db.DB()
				if err != nil {
					return err
				}
				if err := sqlDB.Close(); err != nil {
					return err
				}
				return dropErr
			},
		}, nil
	}
}

func TestOutboxConformance(t *testing.T) {
	dsn := testservers.MySQLDSN(t)
	t.Run("recommended", func(t *testing.T) { conformance.RunOutbox(t, newOutboxHarness(dsn, recommended)) })
	t.Run("plain-gorm+interpolateParams", func(t *testing.T) {
		conformance.RunOutbox(t, newOutboxHarness(withParams(t, dsn, map[string]string{"interpolateParams": "true"}), plainGORM))
	})
}

// TestOutboxDropsOnlyPublishedPartitions runs Maintain with a plan dated
// ahead so that the day partitions Migrate made expire: the one whose rows
// are published is dropped, the one holding an unpublished row is kept
// until a relay publishes it.
func TestOutboxDropsOnlyPublishedPartitions(t *testing.T) {
	ctx := t.Context()
	h, err := newOutboxHarness(testservers.MySQLDSN(t), recommended)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	today := storage.DayOf(time.Now())
	clock := today.AddDate(0, 0, -1).Add(12 * time.Hour)
	ob, err := outbox.New(h.DB, h.Store, outbox.Config{Now: func() time.Time { return clock }})
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
	report, err := h.Store.Maintain(ctx, h.DB, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(report.Expired, today.AddDate(0, 0, -1).Equal) || !slices.ContainsFunc(report.Held, today.Equal) || report.RowsRemoved != -1 {
		t.Fatalf("report %+v: want yesterday dropped and today held", report)
	}
	if n, err := conformance.Drain(ctx, relay); err != nil || n != 1 {
		t.Fatalf("the held row: published %d (err %v), want 1", n, err)
	}
	if report, err = h.Store.Maintain(ctx, h.DB, plan); err != nil || len(report.Held) != 0 || !slices.ContainsFunc(report.Expired, today.Equal) {
		t.Fatalf("after publishing, report %+v (err %v): want today dropped", report, err)
	}
	stats, err := h.Store.(storage.StatsReporter).Stats(ctx, h.DB)
	if err != nil || len(stats) != 0 {
		t.Fatalf("rows left: %+v (err %v)", stats, err)
	}
}
