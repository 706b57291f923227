package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/dev/faulttest"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/batchopt"
)

func newFaultInbox(t *testing.T, cfg inbox.Config, transient func(error) bool, gcfg *gorm.Config) (*inbox.Inbox, *gorm.DB) {
	t.Helper()
	if gcfg == nil {
		gcfg = &gorm.Config{}
	}
	gcfg.Logger = logger.Discard
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "t.db")), gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	base, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 2*time.Millisecond
	ib, err := inbox.New(db, faulttest.ClassifyingStore{InboxStore: base, Transient: transient}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, ddl := range []string{
		`CREATE TABLE effects (id TEXT PRIMARY KEY)`,
		`CREATE TABLE parents (id TEXT PRIMARY KEY)`,
		`CREATE TABLE children (id TEXT PRIMARY KEY, parent_id TEXT REFERENCES parents(id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if err := db.Exec(ddl).Error; err != nil {
			t.Fatal(err)
		}
	}
	return ib, db
}

func countRows(t *testing.T, db *gorm.DB, table string) int64 {
	t.Helper()
	var n int64
	if err := db.Table(table).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func writeEffect(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
	return tx.WithContext(ctx).Exec(`INSERT INTO effects (id) VALUES (?)`, m.ID).Error
}

// handlerFaults are errors a handler produces by itself, each the way real
// code gets it.
func handlerFaults(t *testing.T) map[string]error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().String()
	_ = ln.Close()
	_, httpErr := http.Get("http://" + closedPort + "/stock")
	var v map[string]any
	eofErr := json.NewDecoder(strings.NewReader("")).Decode(&v)
	truncErr := json.NewDecoder(strings.NewReader(`{"sku":`)).Decode(&v)
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	faults := map[string]error{
		"net/http error":           httpErr,
		"json of an empty payload": eofErr,
		"json of a truncated one":  truncErr,
		"own context deadline":     ctx.Err(),
	}
	for name, err := range faults {
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
	}
	var ne net.Error
	if !errors.As(httpErr, &ne) || !errors.Is(eofErr, io.EOF) || !errors.Is(truncErr, io.ErrUnexpectedEOF) {
		t.Fatalf("the faults are not what real code sees: %v, %v, %v", httpErr, eofErr, truncErr)
	}
	return faults
}

// TestHandlerFaultsAreNotDatabaseFailures: a handler's own network error,
// EOF or deadline is the message's failure: returned after one call (or
// MaxAttempts calls when marked Retryable), never a database failure, even
// with a Store that counts such errors as lost connections.
func TestHandlerFaultsAreNotDatabaseFailures(t *testing.T) {
	const maxAttempts = 4
	ib, db := newFaultInbox(t, inbox.Config{MaxAttempts: maxAttempts}, faulttest.PostgresLike, nil)
	n := 0
	for name, fault := range handlerFaults(t) {
		for _, marked := range []bool{false, true} {
			n++
			m := msg("fault-" + strings.ReplaceAll(name, " ", "-") + map[bool]string{false: "", true: "-marked"}[marked])
			calls := 0
			out, err := ib.Process(t.Context(), m, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				calls++
				if err := writeEffect(ctx, tx, m); err != nil {
					return err
				}
				if marked {
					return inbox.Retryable(fault)
				}
				return fault
			})
			want := 1
			if marked {
				want = maxAttempts
			}
			if out != inbox.Failed || !errors.Is(err, fault) || calls != want {
				t.Errorf("%s (marked %v): %v, %v after %d calls; want Failed after %d", name, marked, out, err, calls, want)
			}
			if inbox.IsDatabaseFailure(err) {
				t.Errorf("%s (marked %v): reported as a database failure: %v", name, marked, err)
			}
			if ib.IsRetryable(err) != marked {
				t.Errorf("%s (marked %v): IsRetryable = %v", name, marked, !marked)
			}
		}
	}
	if got := countRows(t, db, "effects"); got != 0 {
		t.Errorf("%d effects of failed messages committed", got)
	}
	if got := ib.Counters().Failed; got != uint64(n) {
		t.Errorf("%d failures counted, want %d", got, n)
	}
}

// TestTransientStatementErrorDoomsTheTransaction: once a statement of the
// transaction fails with an error the Store calls transient (on MariaDB a
// deadlock, which has already rolled the transaction back), the handler's
// later statements are refused and nothing commits, even if the handler
// ignores the error and returns nil: the transaction is retried as a
// database failure.
func TestTransientStatementErrorDoomsTheTransaction(t *testing.T) {
	ib, db := newFaultInbox(t, inbox.Config{MaxAttempts: 3}, faulttest.NoSuchTable, nil)
	calls := 0
	var later error
	careless := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		calls++
		_ = tx.Exec(`UPDATE missing_table SET x = 1`).Error // the error a careless handler drops
		later = writeEffect(ctx, tx.WithContext(context.Background()), m)
		return nil
	}
	out, err := ib.Process(t.Context(), msg("careless"), careless)
	if out != inbox.Failed || !inbox.IsDatabaseFailure(err) || calls != 3 {
		t.Fatalf("careless handler: %v, %v after %d calls; want a database failure after 3", out, err, calls)
	}
	if !errors.Is(later, inbox.ErrTransactionAborted) {
		t.Errorf("the statement after the failed one ran: %v", later)
	}
	if got := countRows(t, db, "effects"); got != 0 {
		t.Fatalf("%d effects committed without their inbox row", got)
	}
	if out, err := ib.Process(t.Context(), msg("careless"), func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		return writeEffect(ctx, tx, m)
	}); out != inbox.Processed || err != nil {
		t.Fatalf("redelivery: %v %v, want Processed (nothing of the failed runs committed)", out, err)
	}
	// A statement error that is not transient is the handler's business.
	out, err = ib.Process(t.Context(), msg("handled"), func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		if err := tx.Exec(`INSERT INTO effects (id) VALUES ('careless')`).Error; err == nil {
			return errors.New("the duplicate insert succeeded")
		}
		return writeEffect(ctx, tx, m)
	})
	if out != inbox.Processed || err != nil {
		t.Fatalf("a handler that handles a constraint error: %v %v", out, err)
	}
}

// TestCommitRefusalIsPinnedOnTheMessage: a deferred foreign key fails only
// at COMMIT. The message that violates it fails (a *CommitError, counted
// once, not a database failure); in a batch, the other messages commit.
func TestCommitRefusalIsPinnedOnTheMessage(t *testing.T) {
	ib, db := newFaultInbox(t, inbox.Config{MaxAttempts: 3}, faulttest.PostgresLike, nil)
	if err := db.Exec(`INSERT INTO parents (id) VALUES ('p')`).Error; err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	h := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		calls[m.ID]++
		parent := "p"
		if strings.HasPrefix(m.ID, "orphan") {
			parent = "no-such-parent"
		}
		return tx.Exec(`INSERT INTO children (id, parent_id) VALUES (?, ?)`, m.ID, parent).Error
	}
	out, err := ib.Process(t.Context(), msg("orphan-1"), h)
	var ce *inbox.CommitError
	if out != inbox.Failed || !errors.As(err, &ce) || inbox.IsDatabaseFailure(err) || calls["orphan-1"] != 1 {
		t.Fatalf("orphan: %v, %v after %d calls; want a CommitError after 1", out, err, calls["orphan-1"])
	}
	msgs := []inbox.Message{msg("a"), msg("orphan-2"), msg("b"), msg("c")}
	results, err := ib.ProcessBatch(t.Context(), msgs, h)
	if err != nil {
		t.Fatalf("batch: %v (a message's commit-time failure failed the whole batch)", err)
	}
	for i, r := range results {
		want := inbox.Processed
		if strings.HasPrefix(msgs[i].ID, "orphan") {
			want = inbox.Failed
			if !errors.As(r.Err, &ce) {
				t.Errorf("%s: %v, want a CommitError", msgs[i].ID, r.Err)
			}
		}
		if r.Outcome != want {
			t.Errorf("%s: %v (%v), want %v", msgs[i].ID, r.Outcome, r.Err, want)
		}
	}
	if got := countRows(t, db, "children"); got != 3 {
		t.Errorf("%d children committed, want 3", got)
	}
}

// TestProcessTxIssuesItsOwnSavepoint: with DisableNestedTransaction, GORM's
// nested Transaction runs without a savepoint; ProcessTx must still roll
// back a failing handler's writes and its inbox row, and keep the caller's
// own writes.
func TestProcessTxIssuesItsOwnSavepoint(t *testing.T) {
	ib, db := newFaultInbox(t, inbox.Config{}, faulttest.PostgresLike, &gorm.Config{DisableNestedTransaction: true})
	failing := errors.New("handler failed half-way")
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`INSERT INTO parents (id) VALUES ('callers-own')`).Error; err != nil {
			return err
		}
		out, err := ib.ProcessTx(t.Context(), tx, msg("half"), func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
			if err := writeEffect(ctx, tx, m); err != nil {
				return err
			}
			return failing
		})
		if out != inbox.Failed || !errors.Is(err, failing) {
			t.Errorf("ProcessTx: %v %v", out, err)
		}
		return nil // the caller commits its own work
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := countRows(t, db, "effects"); got != 0 {
		t.Errorf("%d effects of the failed handler committed with the caller's transaction", got)
	}
	if got := countRows(t, db, "parents"); got != 1 {
		t.Errorf("the caller's own write: %d rows, want 1", got)
	}
	if out, err := ib.Process(t.Context(), msg("half"), func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		return writeEffect(ctx, tx, m)
	}); out != inbox.Processed || err != nil {
		t.Fatalf("redelivery: %v %v, want Processed", out, err)
	}
	if _, err := ib.ProcessTx(t.Context(), db, msg("no-tx"), noop); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Errorf("ProcessTx outside a transaction: %v, want ErrInvalidConfig", err)
	}
}

// TestBatchAdmitsAgainstOneClockReading: the retention window is applied
// from one reading of the clock per call, so a midnight passing during the
// call cannot admit a message in one check and expire it in another.
func TestBatchAdmitsAgainstOneClockReading(t *testing.T) {
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	readings := 0
	clock := func() time.Time {
		readings++
		if readings == 1 {
			return day.Add(24*time.Hour - time.Nanosecond)
		}
		return day.Add(24 * time.Hour)
	}
	ib, _ := newFaultInbox(t, inbox.Config{RetentionDays: 1, Now: clock}, faulttest.PostgresLike, nil)
	msgs := []inbox.Message{
		{Consumer: "c", ID: "today", Time: day},
		{Consumer: "c", ID: "oldest-day", Time: day.AddDate(0, 0, -1)},
		{Consumer: "c", ID: "today-2", Time: day},
	}
	var seen []inbox.Outcome
	results, err := runEngine(t.Context(), ib, msgs, noop, nil, batchopt.Options[inbox.Outcome]{BeforeCommit: func(_ context.Context, _ *gorm.DB, o []inbox.Outcome) error {
		seen = o
		return nil
	}})
	if err != nil || readings != 1 {
		t.Fatalf("%v; %d clock readings, want 1", err, readings)
	}
	for i, r := range results {
		if r.Outcome != inbox.Processed || seen[i] != inbox.Processed {
			t.Errorf("%s: %v (%v), BeforeCommit saw %v; want Processed", msgs[i].ID, r.Outcome, r.Err, seen[i])
		}
	}
}

// flakyMigrateStore fails its first Migrate with an error it classifies as
// transient.
type flakyMigrateStore struct {
	faulttest.ClassifyingStore
	failures int
}

func (s *flakyMigrateStore) Migrate(ctx context.Context, db *gorm.DB) error {
	if s.failures > 0 {
		s.failures--
		return errTransient
	}
	return s.ClassifyingStore.Migrate(ctx, db)
}

// TestStoreOperationsAreDatabaseFailures: the Store's own operations
// (Migrate, Maintain) fail as the database, so transient failures are
// retried; and an Inbox is never built on a transaction.
func TestStoreOperationsAreDatabaseFailures(t *testing.T) {
	_, db := newFaultInbox(t, inbox.Config{}, faulttest.PostgresLike, nil)
	base, err := inboxsqlite.New(inboxsqlite.Options{Table: "inbox_flaky"})
	if err != nil {
		t.Fatal(err)
	}
	store := &flakyMigrateStore{ClassifyingStore: faulttest.ClassifyingStore{InboxStore: base, Transient: func(err error) bool { return errors.Is(err, errTransient) }}, failures: 2}
	ib, err := inbox.New(db, store, inbox.Config{MinBackoff: time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil || store.failures != 0 {
		t.Fatalf("Migrate: %v with %d failures left; want two transient failures retried", err, store.failures)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if _, err := inbox.New(tx, store, inbox.Config{}); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("New on a transaction: %v, want ErrInvalidConfig", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
