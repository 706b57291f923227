// Package mysql is the inbox Store for MySQL 8 and MariaDB 10.5+ (through
// gorm.io/driver/mysql and github.com/go-sql-driver/mysql).
//
// The package name collides with gorm.io/driver/mysql; import it with an
// alias, e.g. inboxmysql.
//
// # Table
//
// The inbox table is InnoDB, keyed by (consumer, event_id, day) and
// partitioned by LIST COLUMNS(day): one partition per day that has rows,
// named pYYYYMMDD, and no catch-all. A day without a partition makes a
// claim fail with error 1526 (ER_NO_PARTITION_FOR_GIVEN_VALUE), or, for a
// day the Store already knows has none, with a *DayMissingError before the
// claim touches the table; [Store.IsMissingDay] recognises both by number
// and type, and the inbox then adds the day's partition
// ([Store.PrepareDays]) and claims again, a bounded number of times.
// Consumer and event id are VARBINARY, compared byte
// for byte: the usual utf8mb4 collations are case-insensitive and PAD SPACE,
// and would make "Order-1", "order-1" and "order-1 " one key.
//
// # Claim
//
// Claim writes its own SQL, straight to the transaction's connection (GORM
// would rewrite it: a []byte bound right after "(" becomes one placeholder
// per byte, "@" starts a named parameter): INSERT ... ON DUPLICATE KEY UPDATE
// deliveries = deliveries + 1. A duplicate is really updated, so the server
// reports 1 affected row for an inserted row and 2 for a duplicate whatever
// the DSN's clientFoundRows setting (a no-op update such as GORM's
// clause.OnConflict{DoNothing: true} reports 1 for a duplicate under
// clientFoundRows, the same as an insert). INSERT IGNORE is never used: it
// would also turn a missing partition, truncation or a NULL into a silent
// "duplicate". A duplicate therefore costs a row write and holds the row's
// exclusive lock until the transaction ends; the deliveries column counts
// how often an event was claimed.
//
// Every row of one statement carries a random claim token that the update
// does not touch: when a multi-row statement reports a mix of new rows and
// duplicates, the rows holding this statement's token (read back in the same
// transaction by primary key) are the new ones. No RETURNING is needed, so
// MySQL 8 and MariaDB take the same path: MariaDB's ODKU ... RETURNING
// returns the existing row for a duplicate and so cannot tell the two apart
// by itself (with the token column it could, saving the read-back of mixed
// batches; not done, to keep one path for both servers). Claim checks every
// value against its column before sending it, and sends dates and times as
// UTC text, so nothing is truncated even under a lax sql_mode and nothing
// depends on the DSN's parseTime, loc or the session time_zone.
//
// # Maintenance
//
// Migrate makes the partitions of the day before today through
// Options.InitialDays after it; Maintain adds the plan's days with one ADD
// PARTITION (a LIST partition is added without copying a row), and any
// other day (an event dated far ahead, a late event of an expired day) is
// added on demand. An expired day leaves with CONVERT PARTITION ... TO TABLE
// (a rename: its time does not grow with the day's rows) and the table is
// dropped afterwards, when the inbox table is no longer locked (on a file
// system mounted with online discard, freeing the dropped table's blocks
// stalls every commit's fsync for a time that grows with its size: mount it
// without discard and trim periodically). Each partition change holds the
// table's metadata lock for a time that does not depend on the rows (3-5 ms
// on an idle test server, 10-14 ms under load) after waiting for the
// transactions that use the table; meanwhile new transactions on it queue. MariaDB allows 8192 partitions per table:
// far-future events spread over thousands of distinct days would exhaust
// them.
//
// Migrate refuses an existing table of another layout (RANGE COLUMNS(day)
// with a catch-all among them) with an error naming the table and what it
// found; it never converts a table.
//
// Migrate and Maintain take a named lock (GET_LOCK) so that concurrent
// processes serialise, and DDL waits at most Options.DDLLockWait for the
// table's metadata lock, so that maintenance never stalls live traffic for
// long: on timeout it fails with a retryable error.
//
// # Watermarks
//
// The Store implements storage.WatermarkStore, the watermarks of sequenced
// dedup: [Store.MigrateWatermarks] makes the InnoDB table
// <table>_watermarks, one row per stream, keyed by (scope, topic,
// partition_no, source, epoch), names VARBINARY, values a BLOB (up to
// storage.MaxWatermarkBytes). A stream's first write is a plain INSERT,
// which fails with ER_DUP_ENTRY (1062, storage.ErrWatermarkMoved) when the
// stream has a row: INSERT IGNORE would also turn a value that does not fit
// into a warning and 0 rows, and a no-op ON DUPLICATE KEY UPDATE reports 1
// row for a duplicate under clientFoundRows. Every later write is an UPDATE
// ... WHERE applied = the value read: the affected rows are the rows
// changed, or matched under clientFoundRows, the same since the new value
// always differs (one equal to the old value is refused), and 0 is
// storage.ErrWatermarkMoved.
//
// The Store implements storage.OffsetStore, the consumer's stored offsets
// (consumer.Config.Offsets.Store): [Store.MigrateOffsets] makes the InnoDB
// table the consumer names (inbox_offsets by default) in the connection's
// database, group ids and topics compared byte for byte, under a named lock
// (GET_LOCK) so that replicas starting together take turns.
//
// # Three round trips
//
// BEGIN is a round trip of its own on go-sql-driver/mysql (stacking it
// with the claim would need the DSN's multiStatements, which lets every
// statement on the pool carry stacked queries). So the Store opens, per
// DSN and isolation level it is used with, a connection pool of its own
// from the DSN of db's GORM dialector, whose connections run with
// autocommit off and that level as their session default: the claim's
// statement (or, with nothing to claim, the watermark write's) opens the
// transaction, and Process costs the claim, the handler's statements and
// COMMIT, as the bare effect costs BEGIN, its statements and COMMIT
// ([Store.BeginClaim], storage.ClaimBeginner). After COMMIT or ROLLBACK
// such a connection has no transaction open until its next statement; a
// connection that fails to roll back, or whose transaction ran a statement
// that mentions autocommit, is closed instead of pooled. The caller's pool
// is not touched: its connections keep autocommit on.
//
// The cost is server connections: each such pool holds up to
// OwnedPool.MaxOpen connections (by default the caller's pool's
// MaxOpenConnections), on top of the caller's pool, and they count against
// the server's max_connections; an idle one closes after
// OwnedPool.MaxIdleTime (one minute). The handler's statements run on the
// Store's connection, with the caller's DSN settings. [Store.Close]
// closes the pools; the application calls it when it is done with the
// Store (the inbox and the consumer never do).
//
// The Store uses its own connections only where it can open the caller's
// pool again: a *sql.DB that GORM's mysql dialector opened from a DSN
// with go-sql-driver/mysql (not a Conn of the caller's own, a custom
// DriverName, or a wrapped dialector), outside a transaction, without
// GORM's prepared statements (PrepareStmt), for a read-write transaction
// at the default level or one of MySQL's four. Elsewhere, and with
// OwnedPool.Disabled, the inbox begins with BEGIN on the caller's pool:
// four round trips; so it does for a transaction for which the Store's
// pool cannot connect (the server's max_connections or the user's
// MAX_USER_CONNECTIONS reached, say).
//
// # Settings
//
// Open the database with [Open] (or a DSN from [StrictDSN]) so that every
// connection runs with a strict sql_mode; [Store.Verify] checks it.
//
// Tested on MariaDB 10.11 only (the server available where it was
// written). MySQL 8 runs the same statements (no RETURNING, no sequence
// tables, no MariaDB-only syntax); [DetectServer] and Verify tell the two
// apart and check the version.
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/inboxgo/inbox/storage"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
)

// DefaultTable is the inbox table name used when Options.Table is empty.
const DefaultTable = "inbox_messages"

// topicColumnBytes is the longest topic (provenance only) a row may carry:
// the column's size, more than storage.MaxTopicBytes.
const topicColumnBytes = 1024

// Options configures a Store.
type Options struct {
	// Table is the inbox table name, a plain identifier. Default DefaultTable.
	Table string
	// Schema is the database holding the table; empty means the
	// connection's current database.
	Schema string
	// LockWait bounds how long Migrate and Maintain wait for another
	// process's maintenance to finish. Default 60s.
	LockWait time.Duration
	// DDLLockWait bounds how long one partition change waits for the
	// table's metadata lock (lock_wait_timeout). While it waits, new
	// transactions on the table queue behind it, so keep it short; on
	// timeout Maintain fails with a retryable error. Default 5s.
	DDLLockWait time.Duration
	// InitialDays is how many days from today (UTC) Migrate creates
	// partitions for when it creates the table; the day before today gets
	// one as well. Default 7.
	InitialDays int
	// OwnedPool configures the connections, autocommit off, on which
	// Process and ProcessBatch open their transactions with the claim
	// (see "Three round trips" in the package documentation).
	OwnedPool OwnedPool
}

// Store is the MySQL/MariaDB inbox Store.
type Store struct {
	table       string // quoted, possibly schema-qualified
	name        string
	schema      string
	deleteBatch int // the outbox table's: rows per DELETE of published expired rows
	lockWait    time.Duration
	ddlLockWait time.Duration
	initialDays int

	// Whether the Store has read the table's days (list), and the days it
	// knows have a partition (known, time.Time keys).
	list  atomic.Bool
	known sync.Map

	claimOne string // buildClaimSQL(1), made by New
	wm       watermarkSQL
	owned    *ownedPools
}

// New returns a Store for the configured table.
func New(opts Options) (*Store, error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if err := storage.ValidateIdentifier("table name", opts.Table); err != nil {
		return nil, err
	}
	qualified := "`" + opts.Table + "`"
	if opts.Schema != "" {
		if err := storage.ValidateIdentifier("schema name", opts.Schema); err != nil {
			return nil, err
		}
		qualified = "`" + opts.Schema + "`." + qualified
	}
	if opts.LockWait < 0 || opts.DDLLockWait < 0 || opts.InitialDays < 0 ||
		opts.OwnedPool.MaxOpen < 0 || opts.OwnedPool.MaxIdle < 0 || opts.OwnedPool.MaxIdleTime < 0 || opts.OwnedPool.MaxLifetime < 0 {
		return nil, fmt.Errorf("%w: negative value in %+v", storage.ErrInvalidConfig, opts)
	}
	if opts.LockWait == 0 {
		opts.LockWait = time.Minute
	}
	if opts.DDLLockWait == 0 {
		opts.DDLLockWait = 5 * time.Second
	}
	if opts.InitialDays == 0 {
		opts.InitialDays = 7
	}
	s := &Store{
		table:       qualified,
		name:        opts.Table,
		schema:      opts.Schema,
		lockWait:    opts.LockWait,
		ddlLockWait: opts.DDLLockWait,
		initialDays: opts.InitialDays,
	}
	s.claimOne = s.buildClaimSQL(1)
	s.wm = newWatermarkSQL(s)
	s.owned = newOwnedPools(opts.OwnedPool)
	// A Store dropped without Close closes its pools once it is collected.
	runtime.AddCleanup(s, func(p *ownedPools) { _ = p.close() }, s.owned)
	return s, nil
}

// Table returns the inbox table name (unqualified).
func (s *Store) Table() string { return s.name }

// StrictDSN returns dsn (go-sql-driver/mysql form) with settings the inbox
// relies on: unless the DSN already sets sql_mode, every connection adds
// STRICT_TRANS_TABLES to the server's sql_mode, so that a value that does not
// fit its column is an error and never silently truncated. It also turns on
// interpolateParams: without it every statement with arguments is a
// PREPARE, an EXECUTE and a CLOSE, so Process costs six round trips against
// the bare effect's four. The driver interpolates safely (it escapes by the
// connection's sql_mode, sends []byte as _binary literals, and falls back
// to a prepared statement for the multibyte charsets where escaping is not
// safe); the conformance suite runs with it.
func StrictDSN(dsn string) (string, error) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("%w: mysql DSN: %w", storage.ErrInvalidConfig, err)
	}
	cfg.InterpolateParams = true
	if _, ok := cfg.Params["sql_mode"]; !ok {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["sql_mode"] = "CONCAT(@@sql_mode,',STRICT_TRANS_TABLES')"
	}
	return cfg.FormatDSN(), nil
}

// Open returns a GORM dialector for dsn with [StrictDSN]'s settings and
// GORM's use of RETURNING on MariaDB turned off: with it, GORM reports
// RowsAffected = 1 for an INSERT ... ON DUPLICATE KEY UPDATE that hit a
// duplicate, which misleads handlers that count on RowsAffected.
func Open(dsn string) (gorm.Dialector, error) {
	strict, err := StrictDSN(dsn)
	if err != nil {
		return nil, err
	}
	return gormmysql.New(gormmysql.Config{DSN: strict, DisableWithReturning: true}), nil
}

// MySQL and MariaDB error numbers the Store classifies as transient.
const (
	errLockWaitTimeout   = 1205 // ER_LOCK_WAIT_TIMEOUT: row lock, or metadata lock under lock_wait_timeout
	errLockDeadlock      = 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back
	errTableDefChanged   = 1412 // ER_TABLE_DEF_CHANGED: a partition change since this transaction's snapshot
	errCheckRead         = 1020 // ER_CHECKREAD: record changed since last read (snapshot isolation)
	errTooManyConcurrent = 1637 // ER_TOO_MANY_CONCURRENT_TRXS
	errConnectionKilled  = 1927 // ER_CONNECTION_KILLED (MariaDB)
)

// errNoSuchTable is ER_NO_SUCH_TABLE: a statement named a table that does
// not exist.
const errNoSuchTable = 1146

// IsMissingTable reports error 1146 (ER_NO_SUCH_TABLE): a statement named a
// table that does not exist, never migrated or dropped
// (storage.MissingTableReporter).
func (s *Store) IsMissingTable(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == errNoSuchTable
}

// IsRetryable reports deadlocks (1213), lock wait timeouts (1205, also for
// metadata locks), a table definition changed by maintenance under a running
// transaction (1412), a record changed under snapshot isolation (1020), too
// many concurrent transactions (1637), a killed connection (1927), a broken
// connection, and a timed-out maintenance lock. A retry of the whole inbox
// transaction is safe even after a connection broke during COMMIT: a
// committed row makes the retry a duplicate.
func (s *Store) IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errLockWaitTimeout, errLockDeadlock, errTableDefChanged, errCheckRead, errTooManyConcurrent, errConnectionKilled:
			return true
		}
		return false
	}
	var busy *LockBusyError
	return errors.As(err, &busy) || errors.Is(err, gomysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn)
}

// LockBusyError says that another process held the maintenance lock for
// longer than Options.LockWait. It is retryable.
type LockBusyError struct {
	Table string
	Wait  time.Duration
}

func (e *LockBusyError) Error() string {
	return fmt.Sprintf("mysql: another process kept the maintenance lock of %s for more than %v", e.Table, e.Wait)
}

// withLock runs fn on one pinned connection holding the table's named
// maintenance lock, with lock_wait_timeout set to DDLLockWait. The lock and
// the setting are undone even when ctx has ended, and a connection on which
// that fails is discarded: a pooled connection must not keep the lock (other
// processes would wait for it until the connection closes).
func (s *Store) withLock(ctx context.Context, db *gorm.DB, fn func(conn *gorm.DB) error) error {
	return s.withNamedLock(ctx, db, s.name, fn)
}

// withNamedLock is withLock with the named lock of table name instead of
// the inbox table's.
func (s *Store) withNamedLock(ctx context.Context, db *gorm.DB, name string, fn func(conn *gorm.DB) error) error {
	return db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		lockName := "CONCAT('inbox:', LEFT(SHA2(CONCAT(COALESCE(?, DATABASE(), ''), '.', ?), 256), 40))"
		var got sql.NullInt64
		secs := max(int64(s.lockWait.Round(time.Second)/time.Second), 1)
		err := conn.Raw("SELECT GET_LOCK("+lockName+", ?)", nullIfEmpty(s.schema), name, secs).Row().Scan(&got)
		if err != nil {
			return fmt.Errorf("mysql: take the maintenance lock of %s: %w", name, err)
		}
		if !got.Valid || got.Int64 != 1 {
			return &LockBusyError{Table: name, Wait: s.lockWait}
		}
		defer func() {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			c := conn.WithContext(cleanup)
			if c.Exec("SET SESSION lock_wait_timeout = DEFAULT").Error != nil ||
				c.Exec("SELECT RELEASE_LOCK("+lockName+")", nullIfEmpty(s.schema), name).Error != nil {
				if pinned, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
					_ = pinned.Raw(func(any) error { return driver.ErrBadConn }) // discard the connection
				}
			}
		}()
		wait := max(int64(s.ddlLockWait.Round(time.Second)/time.Second), 1)
		if err := conn.Exec(fmt.Sprintf("SET SESSION lock_wait_timeout = %d", wait)).Error; err != nil {
			return fmt.Errorf("mysql: set lock_wait_timeout: %w", err)
		}
		return fn(conn)
	})
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

var (
	_ storage.InboxStore    = (*Store)(nil)
	_ storage.Verifier      = (*Store)(nil)
	_ storage.StatsReporter = (*Store)(nil)
	_ storage.SchemaPrinter = (*Store)(nil)
	_ storage.DayPreparer   = (*Store)(nil)
)
