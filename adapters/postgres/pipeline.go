package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// BeginClaim opens a transaction and claims rows in it in one round trip:
// BEGIN and the claim travel as one pgx pipeline on a connection taken from
// db's pool. The transaction is then one database/sql does not know about,
// so the returned *gorm.DB runs on a connection pool value (adapterkit.Tx)
// that commits and rolls back itself, takes savepoints for GORM's nested
// transactions, refuses Begin, and rolls back (or, failing that, discards
// the connection) on every path that does not commit. It is used only on
// pgx's database/sql driver without GORM's prepared statements; elsewhere
// ok is false and the inbox begins and claims as usual. db must be a
// session of the caller's alone (as from WithContext): on success it is
// the transaction returned, with its Statement.ConnPool replaced.
func (s *Store) BeginClaim(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, rows []storage.InboxRow) (*gorm.DB, []bool, bool, error) {
	if len(rows) == 0 {
		return nil, nil, false, nil
	}
	sorted, order := adapterkit.SortRows(rows)
	var inserted []bool
	tx, ok, err := beginPipelined(ctx, db, opts, func(b *pgx.Batch) {
		if len(rows) == 1 {
			r := rows[0]
			b.Queue(s.claimOneSQL, r.Consumer, r.EventID, dayText(r.Day), r.EventTime.UTC(), r.Topic, r.Partition, r.Offset)
		} else {
			b.Queue(s.claimArraysSQL, arrayArgs(sorted)...)
		}
	}, func(br pgx.BatchResults) error {
		var err error
		if len(rows) == 1 {
			inserted, err = claimOneResult(br)
		} else {
			inserted, err = claimArraysResult(br, sorted, order)
		}
		if err != nil {
			return claimError(fmt.Errorf("postgres: claim in %s: %w", s.parent(), err))
		}
		return nil
	})
	return tx, inserted, ok, err
}

// BeginSaveWatermarks opens a transaction and saves writes in it in one
// round trip, as BeginClaim claims (storage.WatermarkBeginner): BEGIN and
// one statement per write travel as one pgx pipeline.
func (s *Store) BeginSaveWatermarks(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, writes []storage.WatermarkWrite) (*gorm.DB, bool, error) {
	if s.wm.err != nil {
		return nil, false, s.wm.err
	}
	if len(writes) == 0 {
		return nil, false, nil
	}
	if err := storage.CheckWatermarkWrites(writes); err != nil {
		return nil, false, fmt.Errorf("postgres: save watermarks in %s: %w", s.wm.table, err)
	}
	return beginPipelined(ctx, db, opts, func(b *pgx.Batch) {
		for _, w := range writes {
			if w.Old == nil {
				b.Queue(s.wm.insert, w.Scope, w.Source, w.Epoch, w.Topic, w.Partition, w.New)
			} else {
				b.Queue(s.wm.update, w.New, w.Scope, w.Topic, w.Partition, w.Source, w.Epoch, w.Old)
			}
		}
	}, func(br pgx.BatchResults) error {
		for _, w := range writes {
			ct, err := br.Exec()
			if err := storage.CheckWatermarkSaved(w, commandTag{ct}, err); err != nil {
				return fmt.Errorf("postgres: save the watermark in %s: %w", s.wm.table, err)
			}
		}
		return nil
	})
}

// commandTag is a pgx command tag as a sql.Result.
type commandTag struct{ ct pgconn.CommandTag }

func (c commandTag) LastInsertId() (int64, error) { return 0, errors.New("postgres: no insert id") }
func (c commandTag) RowsAffected() (int64, error) { return c.ct.RowsAffected(), nil }

// beginPipelined sends BEGIN and the statements queue adds as one pgx
// pipeline on a connection taken from db's pool, and read reads their
// results (after BEGIN's). The transaction is then one database/sql does
// not know about, so the returned *gorm.DB runs on a connection pool value
// (adapterkit.Tx) that commits and rolls back itself, takes savepoints for
// GORM's nested transactions, refuses Begin, and rolls back (or, failing
// that, discards the connection) on every path that does not commit. ok is
// false, with nothing opened, on another driver than pgx's database/sql
// one, or with GORM's prepared statements. db must be a session of the
// caller's alone (as from WithContext): on success it is the transaction
// returned, with its Statement.ConnPool replaced. On an error nothing is
// left open.
func beginPipelined(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, queue func(*pgx.Batch), read func(pgx.BatchResults) error) (*gorm.DB, bool, error) {
	pool, ok := db.Statement.ConnPool.(*sql.DB)
	if !ok {
		return nil, false, nil
	}
	if _, isPgx := pool.Driver().(*stdlib.Driver); !isPgx {
		return nil, false, nil
	}
	beginSQL, err := beginStatement(opts)
	if err != nil {
		return nil, false, err
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("postgres: take a connection: %w", err)
	}
	err = conn.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn()
		var b pgx.Batch
		b.Queue(beginSQL)
		queue(&b)
		br := pc.SendBatch(ctx, &b)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("postgres: begin: %w", err)
		}
		err := read(br)
		if cerr := br.Close(); err == nil && cerr != nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		adapterkit.AbandonTx(conn, pipelined)
		return nil, false, err
	}
	// The transaction goes by db's context, not by the call's; db is the
	// caller's own session, so it becomes the transaction without another
	// copy of its statement.
	txCtx := db.Statement.Context
	if txCtx == nil {
		txCtx = ctx
		db.Statement.Context = ctx
	}
	db.Statement.ConnPool = adapterkit.NewTx(txCtx, conn, pipelined)
	return db, true, nil
}

// beginStatement is the BEGIN for opts.
func beginStatement(opts *sql.TxOptions) (string, error) {
	if opts == nil {
		return "BEGIN", nil
	}
	if opts.ReadOnly {
		return "", errors.New("postgres: a read-only transaction cannot hold inbox rows")
	}
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
		return "BEGIN", nil
	case sql.LevelReadUncommitted:
		return "BEGIN ISOLATION LEVEL READ UNCOMMITTED", nil
	case sql.LevelReadCommitted:
		return "BEGIN ISOLATION LEVEL READ COMMITTED", nil
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		return "BEGIN ISOLATION LEVEL REPEATABLE READ", nil
	case sql.LevelSerializable:
		return "BEGIN ISOLATION LEVEL SERIALIZABLE", nil
	}
	return "", fmt.Errorf("postgres: isolation level %v is not supported", sql.IsolationLevel(opts.Isolation))
}

func claimOneResult(br pgx.BatchResults) ([]bool, error) {
	ct, err := br.Exec()
	if err != nil {
		return nil, err
	}
	if n := ct.RowsAffected(); n > 1 {
		return nil, fmt.Errorf("%d rows affected by a one-row claim", n)
	}
	return []bool{ct.RowsAffected() == 1}, nil
}

// claimArraysResult reads the keys the claim of sorted returned and
// answers in the caller's order (adapterkit.Unsort with order).
func claimArraysResult(br pgx.BatchResults, sorted []storage.InboxRow, order []int) ([]bool, error) {
	got, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer got.Close()
	inserted := make([]bool, len(sorted))
	if err := markReturned(got, sorted, inserted); err != nil {
		return nil, err
	}
	return adapterkit.Unsort(order, inserted), nil
}

// pipelined ends the transactions beginPipelined opens (adapterkit.Tx). A
// COMMIT that the server answers with ROLLBACK (an aborted transaction) is
// an error, as pgx's own Tx.Commit reports it.
var pipelined = &adapterkit.TxDialect{Commit: func(conn *sql.Conn) error {
	return conn.Raw(func(dc any) error {
		ct, err := dc.(*stdlib.Conn).Conn().Exec(context.Background(), "COMMIT")
		if err != nil {
			return err
		}
		if strings.EqualFold(ct.String(), "ROLLBACK") {
			return fmt.Errorf("postgres: %w", adapterkit.ErrCommitRolledBack)
		}
		return nil
	})
}}

var (
	_ storage.ClaimBeginner     = (*Store)(nil)
	_ storage.WatermarkBeginner = (*Store)(nil)
)
