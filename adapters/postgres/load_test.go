package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// TestMaintainUnderLoad runs Maintain in a loop that creates partitions
// (some of which the workers' events have already made on demand) and
// detaches and drops filled partitions concurrently, while 8 workers
// deliver 400 events, each 8 times, dated on the ten days being prepared,
// one more each round. Every event must be applied exactly once
// and no delivery may fail, at each isolation level.
func TestMaintainUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			db, store := fresh(t, inboxpg.Options{Table: "load", LockTimeout: 200 * time.Millisecond})
			ctx := t.Context()
			effects := `"` + store.Schema() + `".effects`
			if err := db.Exec(`CREATE TABLE ` + effects + ` (id text NOT NULL)`).Error; err != nil {
				t.Fatal(err)
			}
			d := storage.DayOf(time.Now())
			// Old days with rows, to be dropped while the load runs.
			for k := 20; k >= 15; k-- {
				old := d.AddDate(0, 0, -k)
				if _, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: old, PrepareThrough: old, ExpireBefore: old.AddDate(0, 0, -1)}); err != nil {
					t.Fatal(err)
				}
				claim(t, db, store, row(fmt.Sprintf("old-%d", k), old))
			}
			ib, err := inbox.New(db, store, inbox.Config{
				RetentionDays: 12, TxOptions: &sql.TxOptions{Isolation: level}, MaxAttempts: 100,
				MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			apply := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				return tx.Exec(`INSERT INTO `+effects+` (id) VALUES (?)`, m.ID).Error
			}
			const ids, workers = 400, 8
			msg := func(j int) inbox.Message {
				return inbox.Message{Consumer: "load", ID: fmt.Sprintf("m-%d", j), Time: d.AddDate(0, 0, j%10).Add(time.Hour)}
			}
			var mu sync.Mutex
			var processed int
			var errs []error
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := range ids {
						out, err := ib.Process(ctx, msg((i+w*3)%ids), apply)
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
						} else if out == inbox.Processed {
							processed++
						}
						mu.Unlock()
					}
				})
			}
			maintDone := make(chan error, 1)
			stop := make(chan struct{})
			go func() {
				rounds := 0
				defer func() { t.Logf("%d maintenance rounds", rounds) }()
				for k := 0; ; k++ {
					select {
					case <-stop:
						maintDone <- nil
						return
					default:
					}
					plan := storage.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, min(k, 10)), ExpireBefore: d.AddDate(0, 0, -20+min(k, 6))}
					if _, err := ib.MaintainPlan(ctx, plan); err != nil {
						maintDone <- err
						return
					}
					rounds++
					time.Sleep(40 * time.Millisecond)
				}
			}()
			wg.Wait()
			close(stop)
			if err := <-maintDone; err != nil {
				t.Fatalf("maintenance under load: %v", err)
			}
			if len(errs) > 0 || processed != ids {
				t.Fatalf("%d processed, want %d; errors: %v", processed, ids, errors.Join(errs...))
			}
			var dup []string
			if err := db.Raw(`SELECT id FROM ` + effects + ` GROUP BY id HAVING count(*) > 1`).Scan(&dup).Error; err != nil || len(dup) > 0 {
				t.Fatalf("effects applied twice: %v %v", dup, err)
			}
			// Every day has its partition, the old ones are gone.
			if _, err := ib.MaintainPlan(ctx, storage.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 10), ExpireBefore: d.AddDate(0, 0, -14)}); err != nil {
				t.Fatal(err)
			}
			if got := rowsPerPartition(t, db, store); len(got) != 10 {
				t.Errorf("rows per partition after the load: %v", got)
			}
			// Everything is a duplicate now.
			for j := range ids {
				if out, err := ib.Process(ctx, msg(j), apply); err != nil || out != inbox.Duplicate {
					t.Fatalf("redelivery of %d: %v %v", j, out, err)
				}
			}
		})
	}
}
