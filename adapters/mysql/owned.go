package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// OwnedPool configures the connection pools the Store opens for the
// transactions it begins with the claim ([Store.BeginClaim]): one pool per
// DSN and isolation level it is used with, every connection of which runs
// with autocommit off.
type OwnedPool struct {
	// Disabled leaves every transaction to the inbox, which begins it on
	// the caller's pool with BEGIN: one round trip more per transaction,
	// and no connections of the Store's own.
	Disabled bool
	// MaxOpen bounds the open connections of each pool. 0 takes the
	// MaxOpenConnections of the caller's pool when the pool is opened
	// (unlimited if that is).
	MaxOpen int
	// MaxIdle bounds the idle connections each pool keeps. 0 keeps up to
	// MaxOpen (with MaxOpen unlimited, every connection that was idle for
	// less than MaxIdleTime).
	MaxIdle int
	// MaxIdleTime closes a connection idle for longer. 0 means one minute.
	MaxIdleTime time.Duration
	// MaxLifetime closes a connection older than this once it is idle
	// (set it as on the caller's pool when that rotates connections, e.g.
	// to follow a failover). 0 means no limit.
	MaxLifetime time.Duration
}

// defaultOwnedIdleTime is OwnedPool.MaxIdleTime's default: long enough to
// keep the connections of a consumer between polls, short enough that an
// unused pool soon holds none.
const defaultOwnedIdleTime = time.Minute

// ownedPools are a Store's pools with autocommit off, by DSN and isolation
// level. A closed ownedPools opens no more.
type ownedPools struct {
	cfg    OwnedPool
	mu     sync.Mutex
	closed bool
	pools  map[ownedKey]*sql.DB
}

type ownedKey struct {
	dsn   string
	level sql.IsolationLevel
}

func newOwnedPools(cfg OwnedPool) *ownedPools {
	return &ownedPools{cfg: cfg, pools: map[ownedKey]*sql.DB{}}
}

// Close closes the connection pools the Store opened for the transactions
// it begins with the claim (see [OwnedPool]); after it the inbox begins
// every transaction with BEGIN on the caller's pool. Transactions still
// open end as usual, and their connections close as they end. The
// application calls it when it is done with the Store, as it closes its
// own *sql.DB, once the inbox or consumer using the Store has
// stopped; a Store that is never closed closes its pools once it is
// garbage collected, and idle connections close after
// OwnedPool.MaxIdleTime meanwhile. Close is idempotent.
func (s *Store) Close() error { return s.owned.close() }

func (p *ownedPools) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for k, db := range p.pools {
		errs = append(errs, db.Close())
		delete(p.pools, k)
	}
	return errors.Join(errs...)
}

// poolFor returns the pool with autocommit off for db's DSN and opts'
// isolation level, opening it on first use; ok is false when db is not a
// pool the Store can open again: not go-sql-driver/mysql's through GORM's
// mysql dialector from a DSN (a connection of the caller's own, a custom
// driver name, a wrapped dialector), inside a transaction already, GORM's
// prepared statements, a read-only transaction, or an isolation level
// MySQL does not have.
func (p *ownedPools) poolFor(db *gorm.DB, opts *sql.TxOptions) (*sql.DB, bool) {
	if p.cfg.Disabled {
		return nil, false
	}
	user, ok := db.Statement.ConnPool.(*sql.DB)
	if !ok {
		return nil, false
	}
	d, ok := db.Dialector.(*gormmysql.Dialector)
	if !ok || d.Config == nil || d.Conn != nil || d.DSN == "" ||
		(d.DriverName != "" && d.DriverName != gormmysql.DefaultDriverName) {
		return nil, false
	}
	if _, ok := user.Driver().(*gomysql.MySQLDriver); !ok {
		return nil, false
	}
	level := sql.LevelDefault
	if opts != nil {
		if opts.ReadOnly {
			return nil, false
		}
		level = sql.IsolationLevel(opts.Isolation)
	}
	setup, ok := sessionSetup(level)
	if !ok {
		return nil, false
	}
	key := ownedKey{dsn: d.DSN, level: level}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	if pool := p.pools[key]; pool != nil {
		return pool, true
	}
	cfg, err := gomysql.ParseDSN(d.DSN)
	if err != nil {
		return nil, false
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, false
	}
	pool := sql.OpenDB(setupConnector{Connector: connector, setup: setup})
	maxOpen := p.cfg.MaxOpen
	if maxOpen == 0 {
		maxOpen = user.Stats().MaxOpenConnections
	}
	maxIdle := p.cfg.MaxIdle
	switch {
	case maxIdle == 0 && maxOpen > 0:
		maxIdle = maxOpen
	case maxIdle == 0:
		maxIdle = 1 << 20 // bounded by the pool's peak use and MaxIdleTime
	}
	pool.SetMaxOpenConns(maxOpen)
	pool.SetMaxIdleConns(maxIdle)
	pool.SetConnMaxIdleTime(cmp.Or(p.cfg.MaxIdleTime, defaultOwnedIdleTime))
	pool.SetConnMaxLifetime(p.cfg.MaxLifetime)
	p.pools[key] = pool
	return pool, true
}

// sessionSetup is what every connection of a pool for level runs once,
// when it connects: autocommit off, and the level as the session's
// default, so that no transaction needs a statement of its own to set it.
// ok is false for a level MySQL does not have.
func sessionSetup(level sql.IsolationLevel) ([]string, bool) {
	setup := []string{"SET autocommit = 0"}
	var name string
	switch level {
	case sql.LevelDefault:
		return setup, true
	case sql.LevelReadUncommitted:
		name = "READ UNCOMMITTED"
	case sql.LevelReadCommitted:
		name = "READ COMMITTED"
	case sql.LevelRepeatableRead:
		name = "REPEATABLE READ"
	case sql.LevelSerializable:
		name = "SERIALIZABLE"
	default:
		return nil, false
	}
	return append(setup, "SET SESSION TRANSACTION ISOLATION LEVEL "+name), true
}

// setupConnector runs setup on every connection it opens, before
// database/sql hands the connection out; a connection whose setup fails is
// closed and its error returned.
type setupConnector struct {
	driver.Connector
	setup []string
}

func (c setupConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("mysql: the driver's connection %T cannot run statements", conn)
	}
	for _, q := range c.setup {
		if _, err := ex.ExecContext(ctx, q, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("mysql: %s on a new connection: %w", q, err)
		}
	}
	return conn, nil
}

// autocommitOff ends the Store's transactions on connections with
// autocommit off: after COMMIT or ROLLBACK the connection has no
// transaction open until its next statement opens one. A statement of the
// handler that sets autocommit would make the connection's later claims
// commit on their own, so such a connection is closed once its transaction
// ends.
var autocommitOff = &adapterkit.TxDialect{
	Commit: func(conn *sql.Conn) error {
		_, err := conn.ExecContext(context.Background(), "COMMIT")
		return err
	},
	Taints: mentionsAutocommit,
}

// mentionsAutocommit reports whether q contains "autocommit" in any letter
// case.
func mentionsAutocommit(q string) bool {
	const word = "autocommit"
	for i := 0; i+len(word) <= len(q); i++ {
		if q[i]|0x20 == 'a' && strings.EqualFold(q[i:i+len(word)], word) {
			return true
		}
	}
	return false
}

// beginOwned takes a connection with autocommit off for db (see poolFor)
// under ctx, and returns the transaction its first statement will open,
// which goes by db's context. ok is false, with nothing taken, when the
// Store has no such pool for db.
func (s *Store) beginOwned(ctx context.Context, db *gorm.DB, opts *sql.TxOptions) (*adapterkit.Tx, bool, error) {
	pool, ok := s.owned.poolFor(db, opts)
	if !ok {
		return nil, false, nil
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, fmt.Errorf("mysql: take a connection: %w", err)
		}
		// Closed since poolFor, or unable to connect while the caller's
		// pool may still have connections (the Store's own count against
		// the server's max_connections and the user's limits): the inbox
		// begins on the caller's pool as usual, which fails in turn if the
		// server is down.
		return nil, false, nil
	}
	txCtx := db.Statement.Context
	if txCtx == nil {
		txCtx = ctx
	}
	return adapterkit.NewTx(txCtx, conn, autocommitOff), true, nil
}

// become makes db, the caller's own session, the transaction tx.
func become(ctx context.Context, db *gorm.DB, tx *adapterkit.Tx) *gorm.DB {
	if db.Statement.Context == nil {
		db.Statement.Context = ctx
	}
	db.Statement.ConnPool = tx
	return db
}

// BeginClaim claims rows on a connection of the Store's own with autocommit
// off (see [OwnedPool]), where the claim's statement opens the
// transaction: Process costs the claim, the handler's statements and
// COMMIT, one round trip fewer than BEGIN and Claim. The returned *gorm.DB
// runs on a connection pool value (adapterkit.Tx) that commits and rolls back
// itself, takes savepoints for GORM's nested transactions, refuses Begin,
// and rolls back (or, failing that, discards the connection) on every path
// that does not commit. ok is false, with nothing opened, where the Store
// cannot open such a pool for db (see OwnedPool's conditions in the
// package documentation): the inbox then begins and claims as usual. db
// must be a session of the caller's alone (as from WithContext): on
// success it is the transaction returned, with its Statement.ConnPool
// replaced.
func (s *Store) BeginClaim(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, rows []storage.InboxRow) (*gorm.DB, []bool, bool, error) {
	if len(rows) == 0 {
		return nil, nil, false, nil
	}
	if err := s.checkClaim(rows); err != nil {
		return nil, nil, false, err
	}
	tx, ok, err := s.beginOwned(ctx, db, opts)
	if !ok || err != nil {
		return nil, nil, false, err
	}
	inserted, err := s.claimOn(ctx, tx.Conn(), rows)
	if err != nil {
		_ = tx.Rollback()
		return nil, nil, false, err
	}
	return become(ctx, db, tx), inserted, true, nil
}

// BeginSaveWatermarks saves writes on a connection of the Store's own with
// autocommit off, whose first write opens the transaction, as BeginClaim
// claims (storage.WatermarkBeginner).
func (s *Store) BeginSaveWatermarks(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, writes []storage.WatermarkWrite) (*gorm.DB, bool, error) {
	if s.wm.err != nil {
		return nil, false, s.wm.err
	}
	if len(writes) == 0 {
		return nil, false, nil
	}
	tx, ok, err := s.beginOwned(ctx, db, opts)
	if !ok || err != nil {
		return nil, false, err
	}
	// SaveWatermarks checks the writes before its first statement, and
	// runs its statements on the session's connection pool value.
	pool := db.Statement.ConnPool
	db.Statement.ConnPool = tx.Conn()
	if err := s.SaveWatermarks(ctx, db, writes); err != nil {
		_ = tx.Rollback()
		db.Statement.ConnPool = pool
		return nil, false, err
	}
	return become(ctx, db, tx), true, nil
}

var (
	_ storage.ClaimBeginner     = (*Store)(nil)
	_ storage.WatermarkBeginner = (*Store)(nil)
)
