package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// TestPipelinedTransactionKeepsTheContract: Process opens its transaction
// with BEGIN and the claim in one round trip, a transaction database/sql
// does not know about. No path (success, error, panic, an aborted
// transaction) may leave a connection in a transaction.
func TestPipelinedTransactionKeepsTheContract(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	effects := `"` + store.Schema() + `".effects`
	if err := db.Exec(`CREATE TABLE ` + effects + ` (id text PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{MaxAttempts: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	m := func(id string) inbox.Message { return inbox.Message{Consumer: "c", ID: id, Time: now} }
	insert := func(tx *gorm.DB, id string) error { return tx.Exec(`INSERT INTO `+effects+` VALUES (?)`, id).Error }

	// Begin inside a handler and nested transactions: the conformance
	// checks atomicity/begin-in-handler-is-refused and
	// atomicity/nested-transaction-is-a-savepoint, which run on this path.

	// Every way out leaves the connections idle.
	for i, h := range []inbox.Handler{
		func(context.Context, *gorm.DB, inbox.Message) error { return errors.New("fails") },
		func(context.Context, *gorm.DB, inbox.Message) error { panic("panics") },
		func(_ context.Context, tx *gorm.DB, _ inbox.Message) error { _ = insert(tx, "outer"); return nil }, // aborted: 23505 ignored
		func(_ context.Context, tx *gorm.DB, msg inbox.Message) error { return insert(tx, msg.ID) },
	} {
		for j := range 5 {
			_, _ = ib.Process(t.Context(), m("path-"+string(rune('a'+i))+string(rune('0'+j))), h)
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	// A connection never handed back (a transaction never ended) stays in use.
	if st := sqlDB.Stats(); st.InUse != 0 {
		t.Errorf("%d connections still in use after every Process returned: %+v", st.InUse, st)
	}
	if out, err := ib.Process(t.Context(), m("path-d0"), func(context.Context, *gorm.DB, inbox.Message) error { return nil }); out != inbox.Duplicate || err != nil {
		t.Errorf("redelivery of a committed message: %v %v", out, err)
	}
}

// TestPreparedStatementsTakeTheGenericPath: with GORM's PrepareStmt the pool
// is not a *sql.DB, so Process begins and claims as usual, and still works.
func TestPreparedStatementsTakeTheGenericPath(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	prepared := db.Session(&gorm.Session{PrepareStmt: true})
	if _, _, ok, err := store.BeginClaim(t.Context(), prepared, nil, []storage.InboxRow{row("x", time.Now())}); ok || err != nil {
		t.Fatalf("BeginClaim on a prepared-statement pool: ok %v, %v; want the generic path", ok, err)
	}
	ib, err := inbox.New(prepared, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	msg := inbox.Message{Consumer: "c", ID: "p", Time: time.Now()}
	for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
		if out, err := ib.Process(t.Context(), msg, func(context.Context, *gorm.DB, inbox.Message) error { return nil }); out != want || err != nil {
			t.Fatalf("Process: %v %v, want %v", out, err, want)
		}
	}
}
