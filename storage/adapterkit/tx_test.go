package adapterkit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
)

// fakeDriver records the statements its connections run and how many
// connections it closed; a statement listed in fail fails.
type fakeDriver struct {
	mu     sync.Mutex
	ran    []string
	closed int
	fail   map[string]error
}

func (d *fakeDriver) Open(string) (driver.Conn, error) { return &fakeConn{d: d}, nil }

type fakeConn struct{ d *fakeDriver }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("no statements") }
func (c *fakeConn) Begin() (driver.Tx, error)           { return nil, errors.New("no BEGIN here") }
func (c *fakeConn) Close() error {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.closed++
	return nil
}

func (c *fakeConn) ExecContext(_ context.Context, q string, _ []driver.NamedValue) (driver.Result, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.ran = append(c.d.ran, q)
	return driver.RowsAffected(0), c.d.fail[q]
}

type fakeConnector struct{ d *fakeDriver }

func (c fakeConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open("") }
func (c fakeConnector) Driver() driver.Driver                        { return c.d }

var testDialect = &TxDialect{
	Commit: func(conn *sql.Conn) error {
		_, err := conn.ExecContext(context.Background(), "COMMIT")
		return err
	},
	Taints: func(q string) bool { return strings.Contains(q, "taint") },
}

func open(t *testing.T, fail map[string]error) (*sql.DB, *fakeDriver) {
	t.Helper()
	d := &fakeDriver{fail: fail}
	db := sql.OpenDB(fakeConnector{d})
	t.Cleanup(func() { _ = db.Close() })
	return db, d
}

func begin(t *testing.T, ctx context.Context, db *sql.DB) *Tx {
	t.Helper()
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return NewTx(ctx, conn, testDialect)
}

// Every way a transaction ends: what it sends, what it returns, and
// whether its connection goes back to the pool or is closed.
func TestTxEnds(t *testing.T) {
	errCommit := errors.New("commit failed")
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name    string
		ctx     context.Context
		fail    map[string]error
		stmt    string
		end     func(*Tx) error
		wantErr error
		want    []string
		closed  int
	}{
		{"commit", context.Background(), nil, "UPDATE", (*Tx).Commit, nil, []string{"UPDATE", "COMMIT"}, 0},
		{"rollback", context.Background(), nil, "UPDATE", (*Tx).Rollback, nil, []string{"UPDATE", "ROLLBACK"}, 0},
		{"commit after the context ended", done, nil, "UPDATE", (*Tx).Commit, context.Canceled, []string{"UPDATE", "ROLLBACK"}, 0},
		{"commit fails", context.Background(), map[string]error{"COMMIT": errCommit}, "UPDATE", (*Tx).Commit, errCommit, []string{"UPDATE", "COMMIT"}, 1},
		{"commit rolled back", context.Background(), map[string]error{"COMMIT": ErrCommitRolledBack}, "UPDATE", (*Tx).Commit, ErrCommitRolledBack, []string{"UPDATE", "COMMIT"}, 0},
		{"rollback fails", context.Background(), map[string]error{"ROLLBACK": errCommit}, "UPDATE", (*Tx).Rollback, errCommit, []string{"UPDATE", "ROLLBACK"}, 1},
		{"tainted commit", context.Background(), nil, "SET taint", (*Tx).Commit, nil, []string{"SET taint", "COMMIT"}, 1},
		{"tainted rollback", context.Background(), nil, "SET taint", (*Tx).Rollback, nil, []string{"SET taint", "ROLLBACK"}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, d := open(t, c.fail)
			tx := begin(t, c.ctx, db)
			if _, err := tx.ExecContext(t.Context(), c.stmt); err != nil {
				t.Fatal(err)
			}
			if err := c.end(tx); !errors.Is(err, c.wantErr) {
				t.Fatalf("end: %v, want %v", err, c.wantErr)
			}
			if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
				t.Errorf("Commit after the end: %v, want sql.ErrTxDone", err)
			}
			if err := tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
				t.Errorf("Rollback after the end: %v, want sql.ErrTxDone", err)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if strings.Join(d.ran, ";") != strings.Join(c.want, ";") || d.closed != c.closed {
				t.Errorf("ran %q, closed %d connections; want %q, %d", d.ran, d.closed, c.want, c.closed)
			}
			if st := db.Stats(); st.InUse != 0 {
				t.Errorf("%d connections in use after the end", st.InUse)
			}
		})
	}
}
