package adapterkit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"
)

// ErrCommitRolledBack is wrapped by a TxDialect's Commit when the server
// answered COMMIT by rolling the transaction back (PostgreSQL, for a
// transaction an earlier failed statement had aborted): nothing was
// committed, and the connection is fit for the pool.
var ErrCommitRolledBack = errors.New("COMMIT rolled back the transaction, which an earlier failed statement had aborted")

// TxDialect is what differs between adapters in ending a transaction.
type TxDialect struct {
	// Commit sends COMMIT on conn and reports its outcome. After an error
	// that does not wrap ErrCommitRolledBack the connection's state is
	// unknown, and it is discarded.
	Commit func(conn *sql.Conn) error
	// Taints, if set, reports whether a statement sent through the
	// transaction may change the session so that the connection must not
	// serve another transaction (on MySQL, one that sets autocommit): the
	// connection is then closed once the transaction ends.
	Taints func(query string) bool
}

// rollbackTimeout bounds ROLLBACK: a connection that does not answer within
// it is discarded.
const rollbackTimeout = 10 * time.Second

// Tx is a transaction that an adapter opened itself on one connection,
// without database/sql's BeginTx, so that BEGIN costs no round trip of its
// own (PostgreSQL sends BEGIN in one pipeline with the claim; MySQL claims
// on a connection with autocommit off, where the claim opens the
// transaction). database/sql does not know about such a transaction, so Tx
// is the connection pool value (gorm.ConnPool and gorm.TxCommitter) that
// GORM runs it on: it commits and rolls back itself, takes savepoints for
// GORM's nested transactions (through GORM's own SavePoint, as on a
// *sql.Tx), refuses Begin (it has no BeginTx), and rolls back, or, failing
// that, discards the connection, on every path that does not commit, so
// that no pooled connection is ever left in a transaction. This is what
// storage.ClaimBeginner asks of the transaction BeginClaim returns.
//
// It is used by one goroutine at a time, as a *sql.Tx handed to a handler
// is.
type Tx struct {
	ctx     context.Context // the transaction's: once it is done, COMMIT is refused, as database/sql does
	conn    *sql.Conn
	d       *TxDialect
	ended   bool
	tainted bool
}

// NewTx returns the transaction open on conn, whose life goes by ctx (see
// Commit). The Tx owns conn from now on: Commit or Rollback returns it to
// its pool (or discards it). Set it as the Statement.ConnPool of a
// *gorm.DB session to run GORM on it.
func NewTx(ctx context.Context, conn *sql.Conn, d *TxDialect) *Tx {
	return &Tx{ctx: ctx, conn: conn, d: d}
}

// Conn is the transaction's connection, for the adapter's own statements
// (which TxDialect.Taints need not see).
func (t *Tx) Conn() *sql.Conn { return t.conn }

func (t *Tx) note(query string) {
	if !t.tainted && t.d.Taints != nil && t.d.Taints(query) {
		t.tainted = true
	}
}

// PrepareContext prepares on the transaction's connection.
func (t *Tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	t.note(query)
	return t.conn.PrepareContext(ctx, query)
}

// ExecContext runs query on the transaction's connection.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	t.note(query)
	return t.conn.ExecContext(ctx, query, args...)
}

// QueryContext runs query on the transaction's connection.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	t.note(query)
	return t.conn.QueryContext(ctx, query, args...)
}

// QueryRowContext runs query on the transaction's connection.
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	t.note(query)
	return t.conn.QueryRowContext(ctx, query, args...)
}

// Commit commits, unless the transaction's context is done: it then rolls
// back and returns the context's error, as database/sql's Tx.Commit does.
// A second Commit or Rollback returns sql.ErrTxDone.
func (t *Tx) Commit() error {
	if t.ended {
		return sql.ErrTxDone
	}
	if err := t.ctx.Err(); err != nil {
		_ = t.Rollback()
		return err
	}
	t.ended = true
	err := t.d.Commit(t.conn)
	if (err != nil && !errors.Is(err, ErrCommitRolledBack)) || t.tainted {
		DiscardConn(t.conn)
	}
	_ = t.conn.Close()
	return err
}

// Rollback rolls back; a connection that cannot roll back within
// rollbackTimeout (10 s) is discarded.
func (t *Tx) Rollback() error {
	if t.ended {
		return sql.ErrTxDone
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_, err := t.conn.ExecContext(ctx, "ROLLBACK")
	if err != nil || t.tainted {
		DiscardConn(t.conn)
	}
	_ = t.conn.Close()
	return err
}

// AbandonTx rolls back whatever a begin that failed half-way opened on
// conn and hands conn back (or discards it).
func AbandonTx(conn *sql.Conn, d *TxDialect) { _ = NewTx(context.Background(), conn, d).Rollback() }

// DiscardConn makes database/sql close conn instead of pooling it once it
// is closed: for a connection whose session state is unknown or changed.
func DiscardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}
