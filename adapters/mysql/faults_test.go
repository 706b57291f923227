package mysql_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/inbox"
)

// TestHandlerIgnoringADeadlockCommitsNothing: InnoDB rolls back the whole
// transaction of a deadlock victim, and the session goes on in autocommit
// mode. A handler that ignores the deadlock error and writes on must not
// commit those writes without the inbox row: the inbox refuses its later
// statements and runs the transaction again, so each effect lands once.
func TestHandlerIgnoringADeadlockCommitsNothing(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	suffix := conformance.RandomSuffix()
	locks, effects := "locks_"+suffix, "effects_"+suffix
	for _, q := range []string{
		"CREATE TABLE " + locks + " (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB",
		"INSERT INTO " + locks + " VALUES (1, 0), (2, 0)",
		"CREATE TABLE " + effects + " (id VARCHAR(64) NOT NULL) ENGINE=InnoDB",
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS " + locks + ", " + effects).Error })
	ib, err := inbox.New(db, store, inbox.Config{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}

	const rounds = 5
	deadlocks := 0
	for round := range rounds {
		var firstLocks sync.WaitGroup
		firstLocks.Add(2)
		var mu sync.Mutex
		runs := map[string]int{}
		careless := func(first, second int) inbox.Handler {
			return func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				mu.Lock()
				runs[m.ID]++
				run := runs[m.ID]
				mu.Unlock()
				_ = tx.Exec("UPDATE "+locks+" SET n = n + 1 WHERE id = ?", first).Error
				if run == 1 {
					firstLocks.Done()
					firstLocks.Wait() // both hold their first lock: one of them deadlocks below
				}
				if err := tx.Exec("UPDATE "+locks+" SET n = n + 1 WHERE id = ?", second).Error; err != nil && store.IsRetryable(err) {
					mu.Lock()
					deadlocks++
					mu.Unlock()
				} // the error is ignored, as careless handlers do
				_ = tx.Exec("INSERT INTO "+effects+" (id) VALUES (?)", m.ID).Error
				return nil
			}
		}
		now := time.Now()
		a := inbox.Message{Consumer: "c", ID: "a-" + string(rune('0'+round)), Time: now}
		b := inbox.Message{Consumer: "c", ID: "b-" + string(rune('0'+round)), Time: now}
		var wg sync.WaitGroup
		for _, run := range []struct {
			m             inbox.Message
			first, second int
		}{{a, 1, 2}, {b, 2, 1}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if out, err := ib.Process(t.Context(), run.m, careless(run.first, run.second)); out != inbox.Processed || err != nil {
					t.Errorf("%s: %v %v", run.m.ID, out, err)
				}
			}()
		}
		wg.Wait()
		for _, m := range []inbox.Message{a, b} {
			var n int64
			if err := db.Raw("SELECT COUNT(*) FROM "+effects+" WHERE id = ?", m.ID).Row().Scan(&n); err != nil || n != 1 {
				t.Errorf("%s: effect committed %d times (%v), want 1", m.ID, n, err)
			}
			if out, err := ib.Process(t.Context(), m, careless(1, 2)); out != inbox.Duplicate || err != nil {
				t.Errorf("redelivery of %s: %v %v, want Duplicate (the inbox row must have committed with the effect)", m.ID, out, err)
			}
		}
	}
	if deadlocks == 0 {
		t.Fatalf("no deadlock in %d rounds: the test did not exercise the fault", rounds)
	}
	t.Logf("%d deadlocks in %d rounds, each absorbed", deadlocks, rounds)
}
