// Package postgres is the inbox Store for PostgreSQL (14 or later for
// expiry without any lock that inserts wait for; 11 or later otherwise;
// tested on 15) through gorm.io/driver/postgres and pgx.
//
// The inbox table is partitioned by RANGE on its day column, one partition
// per UTC day, named <table>_pYYYYMMDD, and nothing else: no DEFAULT
// partition. Its key is (consumer, event_id, day); consumer and event_id are
// text with the "C" collation, so ids are compared byte for byte.
//
// A day gets its partition from Migrate (the day before today through
// Options.InitialDays after it), from [Store.Maintain] (the plan's days from
// Today through PrepareThrough), or on demand: a row of any other day (an
// event dated far ahead, a late event of an expired day under
// inbox.ProcessExpired) fails its claim with SQLSTATE 23514 "no partition
// ... found for row", which [Store.IsMissingDay] recognises by its code and
// table (never its message); the inbox then rolls the transaction back,
// calls [Store.PrepareDays] and runs the transaction again, a bounded number
// of times (storage.MaxDayPreparations). A partition is made as a table of its
// own (with the key and a CHECK of its bounds) and attached, in one short
// transaction that takes SHARE UPDATE EXCLUSIVE on the inbox table: inserts
// (ROW EXCLUSIVE) and open transactions that hold rows of the table do not
// wait for it, nor it for them, whatever the table holds.
//
// Maintain expires the days before plan.ExpireBefore with ALTER TABLE ...
// DETACH PARTITION ... CONCURRENTLY (PostgreSQL 14+), which takes SHARE
// UPDATE EXCLUSIVE on the inbox table, waits for the transactions that
// started before it without holding a lock, and locks only the expired
// partition itself; the detached table is then dropped without any lock on
// the inbox table. No row is deleted one by one and no WAL is written per
// row. The drop's commit frees the day's files at once: on a file system
// mounted with online discard that holds up every other fsync on it, so
// the database's commits stall for a time that grows with the day's size
// (13-20 ms for 153 MB on the test machine); mount it without discard and
// trim periodically. A detach interrupted by Options.LockTimeout (a long transaction that
// uses the table) fails with a retryable error and leaves the partition
// "detach pending": its rows are already out of the inbox's sight, and the
// next Maintain finishes it (DETACH ... FINALIZE) and drops it. On servers
// before 14 a partition is detached in a short transaction that holds ACCESS
// EXCLUSIVE on the inbox table instead. Migrate and Maintain are serialised
// across processes with advisory locks; every step waits at most
// Options.LockTimeout for its locks (a timeout is retryable).
//
// Migrate refuses an existing table of any other layout (a DEFAULT
// partition among them) with an error naming the table and what differs;
// it never converts a table.
//
// [Store.Claim] never raises a unique violation: it inserts with ON CONFLICT
// DO NOTHING RETURNING and matches the returned keys. At REPEATABLE READ and
// SERIALIZABLE a conflict with a row committed after the transaction's
// snapshot fails with SQLSTATE 40001, which [Store.IsRetryable] reports as
// transient, so the inbox runs the transaction again and then sees a
// duplicate.
//
// One internal error (SQLSTATE XX000) is transient too, and only when the
// claim itself raises it: "invalid arbiter index list", raised by the
// server's ExecInitPartitionInfo (PostgreSQL 14 and later; reproduced on 15
// by TestDetachRaceIsRetryable). Why it is safe to run again: an INSERT at
// REPEATABLE READ or SERIALIZABLE routes its rows by a view of the
// partitions, taken once per statement, that still holds a partition whose
// DETACH ... CONCURRENTLY has begun (READ COMMITTED leaves it out). If the
// detach finalizes after the claim took that view but before the claim
// opens that partition (between its rows, e.g. while it waits for a lock of
// another partition), the partition's key index is no longer a child of the
// inbox table's, the ON CONFLICT arbiter cannot be mapped onto it, and the
// statement fails: none of its rows is written, and the transaction is
// rolled back. Run again, the claim takes a new view without the partition:
// the row's day has no partition (IsMissingDay) and the inbox makes it on
// demand. The error is recognised by its code and its routine field (the
// server function that raised it: an error field, not the message text).
// ExecInitPartitionInfo raises no other error with this code for an INSERT
// (its only other one is for MERGE). An internal error of any other
// routine, or one raised by any statement but the claim's (a handler's own
// insert into a partitioned table of its own), is not transient.
//
// The Store implements storage.WatermarkStore, the watermarks of sequenced
// dedup: [Store.MigrateWatermarks] makes <table>_watermarks in the inbox
// table's schema, one row per stream, keyed by (scope, topic, partition_no,
// source, epoch), names in text with the "C" collation, values in bytea. A
// stream's first write is an INSERT ... ON CONFLICT DO NOTHING, every later
// one an UPDATE ... WHERE applied = the value read; a count of 0 affected
// rows is storage.ErrWatermarkMoved. The updates change no indexed column
// and the table keeps half of each page free (fillfactor 50), so they are
// heap-only: no index entry is written per transaction.
//
// The Store implements storage.OffsetStore, the consumer's stored offsets
// (consumer.Config.Offsets.Store): [Store.MigrateOffsets] makes the table the
// consumer names (inbox_offsets by default) in the connection's search path,
// under an advisory lock so that replicas starting together take turns; a
// write that must know the committed row reads it FOR UPDATE.
//
// The package name collides with gorm.io/driver/postgres; import it with an
// alias:
//
//	import (
//		"gorm.io/driver/postgres"
//		inboxpg "github.com/inboxgo/inbox/adapters/postgres"
//	)
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// Defaults for Options.
const (
	DefaultSchema      = "public"
	DefaultTable       = "inbox_messages"
	DefaultLockTimeout = 5 * time.Second
	DefaultInitialDays = 7
)

// MaxTableBytes is the longest table name New accepts: a day partition's
// name, <table>_pYYYYMMDD, must fit PostgreSQL's 63-byte identifiers.
const MaxTableBytes = 63 - len("_pYYYYMMDD")

// Options configures a Store.
type Options struct {
	// Schema holds the inbox table and its partitions. It is created by
	// Migrate if it does not exist. Default DefaultSchema.
	Schema string
	// Table is the inbox table name, at most MaxTableBytes bytes. Names are
	// used quoted, so they are case sensitive. Default DefaultTable.
	Table string
	// LockTimeout bounds how long one maintenance step waits for its lock on
	// the inbox table; inserts queue behind a waiting step, so keep it short.
	// A step that times out fails with a retryable error. Default
	// DefaultLockTimeout.
	LockTimeout time.Duration
	// InitialDays is how many days after today (UTC, by the wall clock)
	// Migrate makes partitions for; the day before today gets one as well.
	// Later days are made by Maintain, and any other day on demand.
	// Default DefaultInitialDays.
	InitialDays int
}

// Store is the PostgreSQL inbox Store. It is safe for concurrent use.
type Store struct {
	schema, table string
	lockTimeout   time.Duration
	initialDays   int
	lockKey       int64 // transaction-level: Migrate, partition creation, drops
	expiryKey     int64 // session-level: concurrent detaches
	schemaKey     int64 // transaction-level: creating the schema, shared by every store in it

	claimOneSQL, claimArraysSQL string
	wm                          watermarkSQL
}

// New validates opts and returns a Store. It does not touch the database.
func New(opts Options) (*Store, error) {
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if err := storage.ValidateIdentifier("schema name", opts.Schema); err != nil {
		return nil, err
	}
	if err := storage.ValidateIdentifier("table name", opts.Table); err != nil {
		return nil, err
	}
	if len(opts.Table) > MaxTableBytes {
		return nil, fmt.Errorf("%w: table name %q is %d bytes; at most %d, so that its day partitions %s_pYYYYMMDD fit PostgreSQL's 63-byte names",
			storage.ErrInvalidConfig, opts.Table, len(opts.Table), MaxTableBytes, opts.Table)
	}
	if opts.LockTimeout < 0 {
		return nil, fmt.Errorf("%w: negative lock timeout %v", storage.ErrInvalidConfig, opts.LockTimeout)
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.InitialDays < 0 {
		return nil, fmt.Errorf("%w: negative initial days %d", storage.ErrInvalidConfig, opts.InitialDays)
	}
	if opts.InitialDays == 0 {
		opts.InitialDays = DefaultInitialDays
	}
	h := fnv.New64a()
	h.Write([]byte("github.com/inboxgo/inbox/adapters/postgres\x00" + opts.Schema + "\x00" + opts.Table))
	s := &Store{schema: opts.Schema, table: opts.Table, lockTimeout: opts.LockTimeout, initialDays: opts.InitialDays, lockKey: int64(h.Sum64())}
	h.Write([]byte("\x00expiry"))
	s.expiryKey = int64(h.Sum64())
	h = fnv.New64a()
	h.Write([]byte("github.com/inboxgo/inbox/adapters/postgres schema\x00" + opts.Schema))
	s.schemaKey = int64(h.Sum64())
	s.buildClaimSQL()
	s.wm = newWatermarkSQL(s)
	return s, nil
}

// Schema returns the schema of the inbox table.
func (s *Store) Schema() string { return s.schema }

// Table returns the inbox table name.
func (s *Store) Table() string { return s.table }

// qualified returns the quoted, schema-qualified name of relation rel.
func (s *Store) qualified(rel string) string { return quoteIdent(s.schema) + "." + quoteIdent(rel) }

// parent is the quoted name of the partitioned inbox table.
func (s *Store) parent() string { return s.qualified(s.table) }

// defaultPartition is the unquoted name of the outbox table's DEFAULT
// partition.
func (s *Store) defaultPartition() string { return s.table + "_default" }

// quoteIdent quotes a name that storage.ValidateIdentifier accepted (so it
// holds no quote).
func quoteIdent(name string) string { return `"` + name + `"` }

// SQLSTATEs after which the whole transaction can run again.
const (
	sqlstateCheckViolation       = "23514" // also "no partition of relation found for row"
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
	sqlstateLockNotAvailable     = "55P03" // lock_timeout, NOWAIT
	sqlstateAdminShutdown        = "57P01" // pg_terminate_backend, fast shutdown
	sqlstateCrashShutdown        = "57P02"
	sqlstateCannotConnectNow     = "57P03" // starting up, shutting down
	sqlstateClassConnection      = "08"    // connection exceptions
	sqlstateInternalError        = "XX000"
	sqlstateUndefinedTable       = "42P01"
	// routingRaceRoutine is the server function (the error's routine
	// field) that raises XX000 "invalid arbiter index list" when a claim
	// routes a row into a partition whose concurrent detach finalized after
	// the claim took its view of the partitions.
	routingRaceRoutine = "ExecInitPartitionInfo"
)

// detachRaceError is the error of a claim that PostgreSQL refused with an
// internal error (XX000) raised in ExecInitPartitionInfo: the claim routed a
// row into a partition whose DETACH ... CONCURRENTLY finalized meanwhile
// (see the package documentation). Nothing was written; it is retryable.
type detachRaceError struct{ Err error }

func (e *detachRaceError) Error() string {
	return e.Err.Error() + " (a partition's concurrent detach finalized while the claim routed its rows; run the transaction again)"
}

func (e *detachRaceError) Unwrap() error { return e.Err }

// claimError wraps err, an error of the claim statement itself, in a
// *detachRaceError if it is the routing race with a concurrent detach. Only
// the claim's errors are looked at: the same internal error raised by any
// other statement says nothing this package knows about.
func claimError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlstateInternalError && pe.Routine == routingRaceRoutine {
		return &detachRaceError{Err: err}
	}
	return err
}

// sqlStater is implemented by the errors of pgx (*pgconn.PgError, the
// default driver of gorm.io/driver/postgres) and of lib/pq.
type sqlStater interface{ SQLState() string }

var _ sqlStater = (*pgconn.PgError)(nil)

// IsRetryable reports, by SQLSTATE and error type, failures after which the
// whole transaction can run again: serialization failures (40001), deadlocks
// (40P01), lock timeouts (55P03), and a lost connection: a connection
// exception (class 08), a server that terminated the session or is shutting
// down or starting up (57P01, 57P02, 57P03), a connection that could not be
// made or broke (pgconn's connect errors, errors pgconn reports safe to
// retry, a bad or closed connection, a network error). A retry after a lost
// COMMIT is safe: if the COMMIT did land, the inbox row turns the retry into
// a Duplicate. Also retryable: a *DayBusyError, and a claim whose rows were
// routed into a partition whose concurrent detach finalized meanwhile (see
// the package documentation). The caller's own context
// ending is never retryable.
func (s *Store) IsRetryable(err error) bool { return isRetryable(err) }

// IsMissingTable reports SQLSTATE 42P01 (undefined_table): a statement
// named a table that does not exist, never migrated or dropped
// (storage.MissingTableReporter).
func (s *Store) IsMissingTable(err error) bool { return isMissingTable(err) }

func isMissingTable(err error) bool {
	var se sqlStater
	return errors.As(err, &se) && se.SQLState() == sqlstateUndefinedTable
}

func isRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var race *detachRaceError
	if errors.As(err, &race) {
		return true
	}
	var se sqlStater
	if errors.As(err, &se) {
		code := se.SQLState()
		switch {
		case code == sqlstateSerializationFailure, code == sqlstateDeadlockDetected, code == sqlstateLockNotAvailable,
			code == sqlstateAdminShutdown, code == sqlstateCrashShutdown, code == sqlstateCannotConnectNow,
			strings.HasPrefix(code, sqlstateClassConnection):
			return true
		}
		return false
	}
	var busy *DayBusyError
	if errors.As(err, &busy) {
		return true
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || pgconn.SafeToRetry(err) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, &ne)
}

// lock takes the store's advisory lock for the rest of tx, then bounds the
// wait for every further lock of tx by the lock timeout. The advisory lock
// itself is waited for without a timeout (but not beyond ctx): it is only
// held by other Migrate and Maintain calls, never by inbox traffic.
func (s *Store) lock(tx *gorm.DB) error {
	if err := tx.Exec(`SELECT pg_advisory_xact_lock(?)`, s.lockKey).Error; err != nil {
		return fmt.Errorf("postgres: advisory lock for %s: %w", s.parent(), err)
	}
	ms := max(s.lockTimeout.Milliseconds(), 1)
	if err := tx.Exec(fmt.Sprintf(`SET LOCAL lock_timeout = %d`, ms)).Error; err != nil {
		return fmt.Errorf("postgres: set lock_timeout: %w", err)
	}
	return nil
}

var (
	_ storage.InboxStore    = (*Store)(nil)
	_ storage.Verifier      = (*Store)(nil)
	_ storage.StatsReporter = (*Store)(nil)
	_ storage.SchemaPrinter = (*Store)(nil)
	_ storage.DayPreparer   = (*Store)(nil)
)
