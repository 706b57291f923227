package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
)

// TestCommitTimeFailuresArePinnedOnTheMessage: two failures PostgreSQL
// reports only at COMMIT, a deferred foreign key and a transaction aborted
// by a statement error the handler ignored (pgx's commit-after-error
// rollback), are the failing message's: a *CommitError after one try, never
// a database failure, and in a batch the other messages commit.
func TestCommitTimeFailuresArePinnedOnTheMessage(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	schema := store.Schema()
	parents, children := `"`+schema+`".parents`, `"`+schema+`".children`
	for _, q := range []string{
		`CREATE TABLE ` + parents + ` (id text PRIMARY KEY)`,
		`CREATE TABLE ` + children + ` (id text PRIMARY KEY, parent_id text REFERENCES ` + parents + `(id) DEFERRABLE INITIALLY DEFERRED)`,
		`INSERT INTO ` + parents + ` VALUES ('p')`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	ib, err := inbox.New(db, store, inbox.Config{MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	h := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		calls[m.ID]++
		switch {
		case strings.HasPrefix(m.ID, "orphan"):
			return tx.Exec(`INSERT INTO `+children+` VALUES (?, 'no-such-parent')`, m.ID).Error
		case strings.HasPrefix(m.ID, "careless"):
			_ = tx.Exec(`INSERT INTO ` + parents + ` VALUES ('p')`).Error // 23505, ignored: the transaction is aborted
			return nil
		}
		return tx.Exec(`INSERT INTO `+children+` VALUES (?, 'p')`, m.ID).Error
	}
	now := time.Now()
	m := func(id string) inbox.Message { return inbox.Message{Consumer: "c", ID: id, Time: now} }
	for _, id := range []string{"orphan-1", "careless-1"} {
		out, err := ib.Process(t.Context(), m(id), h)
		var ce *inbox.CommitError
		if out != inbox.Failed || !errors.As(err, &ce) || inbox.IsDatabaseFailure(err) || calls[id] != 1 {
			t.Errorf("%s: %v, %v after %d calls; want a CommitError after 1", id, out, err, calls[id])
		}
	}
	msgs := []inbox.Message{m("a"), m("orphan-2"), m("b"), m("careless-2"), m("c")}
	results, err := ib.ProcessBatch(t.Context(), msgs, h)
	if err != nil {
		t.Fatalf("batch: %v (a message's commit-time failure failed the whole batch)", err)
	}
	for i, r := range results {
		want := inbox.Processed
		if strings.Contains(msgs[i].ID, "-") {
			want = inbox.Failed
		}
		if r.Outcome != want {
			t.Errorf("%s: %v (%v), want %v", msgs[i].ID, r.Outcome, r.Err, want)
		}
	}
	var n int64
	if err := db.Raw(`SELECT COUNT(*) FROM ` + children).Row().Scan(&n); err != nil || n != 3 {
		t.Errorf("%d children (%v), want 3", n, err)
	}
}
