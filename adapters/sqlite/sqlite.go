// Package sqlite is the inbox Store for SQLite (github.com/mattn/go-sqlite3
// through gorm.io/driver/sqlite).
//
// SQLite allows one writer at a time. Open the database with [Open] (or a
// DSN from [DSN]): write-ahead logging so readers never block the writer,
// immediate transactions so a transaction takes the write lock at BEGIN
// instead of failing with "database is locked" when it upgrades from a read,
// and a busy timeout. SQLITE_BUSY that still escapes is classified as
// retryable and retried by the inbox.
//
// SQLite's busy handler is not fair: a writer that waits sleeps longer and
// longer between tries while newcomers take the lock, so with several
// connections writing at once (a consumer with many partitions) a few
// transactions wait for seconds while the rest are fast (8 writers on the
// test machine: p99 0.65-0.8 ms, maximum 2.3-3.6 s, near the 5 s busy
// timeout). A pool of one connection (sqlDB.SetMaxOpenConns(1)) queues the
// writers in the process instead: 0.87-0.94x the throughput, a
// maximum of 15-19 ms, and a p99 of 5.7-6.7 ms, as every writer now waits
// its turn. With an outbox, its relay and two consumers in one process at
// 1,000 events/s, one connection took commit to effect from a p99 of
// 0.8-1.1 s to 31-35 ms (docs/BENCHMARKS.md, latency). Choose by what
// hurts you more; give readers a pool of their own if they must not queue
// behind writes.
//
// A fresh database file is switched to WAL by its first connection, under an
// exclusive lock the busy handler does not wait for: several processes
// opening a new file at the same instant can see SQLITE_BUSY on a
// connection's first statement. [Open] retries its first connection for up
// to the busy timeout, so gorm.Open does not fail on it; a dialector of your
// own (gormsqlite.Open(DSN(path))) does not, and gorm.Open may then return
// "database is locked" (retryable: open again). Migrate itself is safe with
// concurrent callers.
//
// SQLite has no partitions: expiry deletes expired days in small batches, each
// in its own short transaction, through an index on the day column, so
// concurrent inserts wait at most one batch.
//
// The Store implements storage.WatermarkStore, the watermarks of sequenced
// dedup: [Store.MigrateWatermarks] makes the STRICT table
// <table>_watermarks, one row per stream, keyed by (scope, topic,
// partition_no, source, epoch), names TEXT compared byte for byte, values
// a BLOB. A stream's first write is an INSERT ... ON CONFLICT DO NOTHING,
// every later one an UPDATE ... WHERE applied = the value read; 0 changed
// rows is storage.ErrWatermarkMoved. The write lock serialises the
// transactions that write watermarks, as every writer.
//
// The Store implements storage.OffsetStore, the consumer's stored offsets
// (consumer.Config.Offsets.Store): [Store.MigrateOffsets] makes the table the
// consumer names (inbox_offsets by default) in one transaction, which
// SQLite's write lock orders among replicas starting together.
//
// The package name collides with gorm.io/driver/sqlite; import it with an
// alias, e.g. inboxsqlite.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/storage"
	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// DefaultTable is the inbox table name used when Options.Table is empty.
const DefaultTable = "inbox_messages"

// Options configures a Store.
type Options struct {
	// Table is the inbox table name, a plain identifier. Default DefaultTable.
	Table string
	// DeleteBatch is how many rows one expiry transaction deletes. Default 1000.
	DeleteBatch int
}

// Store is the SQLite inbox Store.
type Store struct {
	table       string
	deleteBatch int
	claimOneSQL string // the single-row claim
}

// New returns a Store for the configured table.
func New(opts Options) (*Store, error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if err := storage.ValidateIdentifier("table name", opts.Table); err != nil {
		return nil, err
	}
	if opts.DeleteBatch < 0 {
		return nil, fmt.Errorf("%w: negative delete batch %d", storage.ErrInvalidConfig, opts.DeleteBatch)
	}
	if opts.DeleteBatch == 0 {
		opts.DeleteBatch = 1000
	}
	return &Store{
		table:       opts.Table,
		deleteBatch: opts.DeleteBatch,
		claimOneSQL: `INSERT INTO ` + opts.Table + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) ` +
			`VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, event_id, day) DO NOTHING`,
	}, nil
}

// DSN returns a go-sqlite3 DSN for the database file at path with the
// settings the inbox needs: WAL, immediate transactions, a 5 s busy timeout,
// and synchronous=FULL, so a commit is durable before the offset is.
func DSN(path string) string {
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_txlock", "immediate")
	q.Set("_busy_timeout", "5000")
	// go-sqlite3 defaults to synchronous=NORMAL, under which a WAL commit is
	// not fsynced: a power loss can undo a commit whose Kafka offset was
	// already committed, and that event would be lost.
	q.Set("_synchronous", "FULL")
	q.Set("_foreign_keys", "1")
	return "file:" + path + "?" + q.Encode()
}

// Open returns a GORM dialector for the database file at path, with [DSN]'s
// settings. gorm.Open with it retries the pool's first connection while it
// fails with SQLITE_BUSY, for up to the 5 s busy timeout: the switch of a
// fresh file to WAL, which another process opening the same file at the same
// instant can hold (see the package doc).
func Open(path string) gorm.Dialector {
	return &openDialector{Dialector: &gormsqlite.Dialector{DriverName: gormsqlite.DriverName, DSN: DSN(path)}}
}

// openDialector is gorm.io/driver/sqlite's dialector with a first
// connection that waits out SQLITE_BUSY.
type openDialector struct{ *gormsqlite.Dialector }

// firstConnectionWait bounds Open's retries, the busy timeout DSN sets.
const firstConnectionWait = 5 * time.Second

func (d *openDialector) Initialize(db *gorm.DB) error {
	if d.Conn != nil {
		return d.Dialector.Initialize(db)
	}
	sqlDB, err := sql.Open(d.DriverName, d.DSN)
	if err != nil {
		return err
	}
	if err := firstConnection(sqlDB, firstConnectionWait); err != nil {
		_ = sqlDB.Close()
		return fmt.Errorf("sqlite: open %s: %w", d.DSN, err)
	}
	// A copy, so that a dialector passed to gorm.Open twice opens a pool
	// for each, as gorm.io/driver/sqlite's own does.
	withPool := *d.Dialector
	withPool.Conn = sqlDB
	return withPool.Initialize(db)
}

// firstConnection opens sqlDB's first connection, running the DSN's
// pragmas, and tries again while that fails with SQLITE_BUSY or
// SQLITE_LOCKED, for up to wait.
func firstConnection(sqlDB *sql.DB, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := sqlDB.PingContext(ctx)
		if err == nil || !isRetryable(err) {
			return err
		}
		if backoff.Sleep(ctx, backoff.Wait(5*time.Millisecond, 100*time.Millisecond, attempt)) != nil {
			return err
		}
	}
}

// Table returns the inbox table name.
func (s *Store) Table() string { return s.table }

// Migrate creates the inbox table and its day index. Concurrent callers are
// serialised by SQLite's write lock.
func (s *Store) Migrate(ctx context.Context, db *gorm.DB) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, q := range s.createStatements() {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("sqlite: migrate %s: %w", s.table, err)
			}
		}
		return nil
	})
}

// MigrationSQL returns Migrate's statements (SQLite has no partitions to
// prepare) and MigrateWatermarks' watermark table, unless the inbox
// table's name leaves no room for one.
func (s *Store) MigrationSQL(storage.MaintenancePlan) ([]string, error) {
	stmts := s.createStatements()
	if table, err := s.watermarkTable(); err == nil {
		stmts = append(stmts, watermarkStatements(table)...)
	}
	return stmts, nil
}

func (s *Store) createStatements() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.table + ` (
			consumer     TEXT    NOT NULL,
			event_id     TEXT    NOT NULL,
			day          TEXT    NOT NULL,
			event_time   TEXT    NOT NULL,
			topic        TEXT    NOT NULL DEFAULT '',
			partition_no INTEGER NOT NULL DEFAULT 0,
			offset_no    INTEGER NOT NULL DEFAULT 0,
			processed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
			PRIMARY KEY (consumer, event_id, day)
		) STRICT`,
		`CREATE INDEX IF NOT EXISTS ` + s.table + `_day ON ` + s.table + ` (day)`,
	}
}

// SQLite's default limit on bound parameters is 32766; 7 per row.
const claimChunk = 1000

// Claim inserts rows with INSERT ... ON CONFLICT DO NOTHING, sent on the
// transaction's connection as it is (GORM's statement building and result
// scanning cost as much as SQLite's own work on the row). A single row is
// told new or duplicate by the affected-row count; several rows by the keys
// RETURNING gives back, which are only the inserted ones.
func (s *Store) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	conn := tx.Statement.ConnPool
	if conn == nil {
		return nil, fmt.Errorf("sqlite: claim in %s: the *gorm.DB has no connection", s.table)
	}
	if len(rows) == 1 {
		return s.claimOne(ctx, conn, rows[0])
	}
	// Under gorm.Config{PrepareStmt: true} every distinct statement would be
	// prepared and cached per connection, one per batch size; the
	// single-row statement above has one text and may be.
	switch p := conn.(type) {
	case *gorm.PreparedStmtTX:
		conn = p.Tx
	case *gorm.PreparedStmtDB:
		conn = p.ConnPool
	}
	inserted := make([]bool, len(rows))
	for lo := 0; lo < len(rows); lo += claimChunk {
		hi := min(lo+claimChunk, len(rows))
		if err := s.claimChunk(ctx, conn, rows[lo:hi], inserted[lo:hi]); err != nil {
			return nil, err
		}
	}
	return inserted, nil
}

// claimOne claims one row by the affected-row count: ON CONFLICT DO NOTHING
// changes 0 rows only on a conflict of the key; any other reason not to
// store the row is an error (the table has no other unique key, and STRICT
// refuses a value of the wrong type).
func (s *Store) claimOne(ctx context.Context, conn gorm.ConnPool, r storage.InboxRow) ([]bool, error) {
	res, err := conn.ExecContext(ctx, s.claimOneSQL, r.Consumer, r.EventID, dayText(r.Day),
		r.EventTime.UTC().Format(time.RFC3339Nano), r.Topic, r.Partition, r.Offset)
	if err != nil {
		return nil, fmt.Errorf("sqlite: claim in %s: %w", s.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil || n < 0 || n > 1 {
		return nil, fmt.Errorf("sqlite: claim in %s: %d rows affected (%v)", s.table, n, err)
	}
	return []bool{n == 1}, nil
}

type returnedKey struct {
	Consumer string
	EventID  string
	Day      string
}

func (s *Store) claimChunk(ctx context.Context, conn gorm.ConnPool, rows []storage.InboxRow, inserted []bool) error {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + s.table + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) VALUES `)
	args := make([]any, 0, 7*len(rows))
	index := make(map[returnedKey]int, len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?)")
		day := dayText(r.Day)
		args = append(args, r.Consumer, r.EventID, day, r.EventTime.UTC().Format(time.RFC3339Nano), r.Topic, r.Partition, r.Offset)
		index[returnedKey{r.Consumer, r.EventID, day}] = i
	}
	b.WriteString(` ON CONFLICT (consumer, event_id, day) DO NOTHING RETURNING consumer, event_id, day`)
	got, err := conn.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return fmt.Errorf("sqlite: claim in %s: %w", s.table, err)
	}
	defer got.Close()
	for got.Next() {
		var k returnedKey
		if err := got.Scan(&k.Consumer, &k.EventID, &k.Day); err != nil {
			return fmt.Errorf("sqlite: claim in %s: %w", s.table, err)
		}
		i, ok := index[k]
		if !ok || inserted[i] {
			return fmt.Errorf("sqlite: claim returned a key that was not inserted: %q/%q/%s", k.Consumer, k.EventID, k.Day)
		}
		inserted[i] = true
	}
	if err := got.Err(); err != nil {
		return fmt.Errorf("sqlite: claim in %s: %w", s.table, err)
	}
	return nil
}

func dayText(d time.Time) string { return d.UTC().Format(time.DateOnly) }

// Maintain deletes rows of expired days in batches of Options.DeleteBatch,
// each batch its own transaction. There is nothing to prepare.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	db = db.WithContext(ctx)
	cutoff := dayText(plan.ExpireBefore)
	var days []string
	if err := db.Raw(`SELECT DISTINCT day FROM `+s.table+` WHERE day < ? ORDER BY day`, cutoff).Scan(&days).Error; err != nil {
		return storage.MaintenanceReport{}, fmt.Errorf("sqlite: list expired days of %s: %w", s.table, err)
	}
	report := storage.MaintenanceReport{}
	for _, d := range days {
		t, err := time.Parse(time.DateOnly, d)
		if err != nil {
			return report, fmt.Errorf("sqlite: %s holds a malformed day %q: %w", s.table, d, err)
		}
		report.Expired = append(report.Expired, t)
	}
	if plan.DryRun {
		err := db.Raw(`SELECT COUNT(*) FROM `+s.table+` WHERE day < ?`, cutoff).Scan(&report.RowsRemoved).Error
		return report, err
	}
	del := `DELETE FROM ` + s.table + ` WHERE rowid IN (SELECT rowid FROM ` + s.table + ` WHERE day < ? LIMIT ?)`
	for {
		res := db.Exec(del, cutoff, s.deleteBatch)
		if res.Error != nil {
			return report, fmt.Errorf("sqlite: expire days before %s from %s: %w", cutoff, s.table, res.Error)
		}
		report.RowsRemoved += res.RowsAffected
		if res.RowsAffected < int64(s.deleteBatch) {
			return report, nil
		}
		if err := ctx.Err(); err != nil {
			return report, err
		}
	}
}

// SQLite's primary result codes that the Store classifies as transient.
const (
	codeBusy   = 5 // SQLITE_BUSY
	codeLocked = 6 // SQLITE_LOCKED
)

// IsRetryable reports SQLITE_BUSY and SQLITE_LOCKED (with their extended
// codes).
func (s *Store) IsRetryable(err error) bool { return isRetryable(err) }

// IsMissingTable reports SQLITE_ERROR raised for a statement that named a
// table that does not exist, never migrated or dropped
// (storage.MissingTableReporter). SQLite has no result code of its own for
// it: the generic SQLITE_ERROR is told apart by its "no such table" text.
func (s *Store) IsMissingTable(err error) bool { return noSuchTable(err) }

func isRetryable(err error) bool {
	code, ok := ErrorCode(err)
	return ok && (code == codeBusy || code == codeLocked)
}

// Verify checks that the connection uses write-ahead logging, a busy
// timeout and durable commits (synchronous FULL or EXTRA), and, if the
// watermark table exists, its layout (see MigrateWatermarks; without one,
// sequenced dedup is not in use, which is no problem).
func (s *Store) Verify(ctx context.Context, db *gorm.DB) error {
	err := verifySettings(ctx, db)
	table, noTable := s.watermarkTable()
	if noTable != nil {
		return err
	}
	return errors.Join(err, checkWatermarkLayout(db.WithContext(ctx), table, false))
}

func verifySettings(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	var problems []error
	var mode string
	if err := db.Raw(`PRAGMA journal_mode`).Scan(&mode).Error; err != nil {
		return fmt.Errorf("sqlite: read journal_mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		problems = append(problems, fmt.Errorf("journal_mode is %q, want wal (readers block the writer otherwise; open with sqlite.DSN)", mode))
	}
	var busy int
	if err := db.Raw(`PRAGMA busy_timeout`).Scan(&busy).Error; err != nil {
		return fmt.Errorf("sqlite: read busy_timeout: %w", err)
	}
	if busy <= 0 {
		problems = append(problems, errors.New("busy_timeout is 0: concurrent writers fail at once with SQLITE_BUSY (open with sqlite.DSN)"))
	}
	var sync int
	if err := db.Raw(`PRAGMA synchronous`).Scan(&sync).Error; err != nil {
		return fmt.Errorf("sqlite: read synchronous: %w", err)
	}
	if sync < 2 {
		problems = append(problems, fmt.Errorf("synchronous is %d, want 2 (FULL) or 3 (EXTRA): a power loss can undo a commit whose broker offset was already committed (open with sqlite.DSN)", sync))
	}
	if len(problems) > 0 {
		return fmt.Errorf("sqlite: unsafe settings: %w", errors.Join(problems...))
	}
	return nil
}

// Stats counts rows per consumer and day.
func (s *Store) Stats(ctx context.Context, db *gorm.DB) ([]storage.DayStats, error) {
	var raw []struct {
		Consumer string
		Day      string
		Rows     int64
	}
	if err := db.WithContext(ctx).Raw(`SELECT consumer, day, COUNT(*) AS rows FROM ` + s.table + ` GROUP BY consumer, day ORDER BY consumer, day`).Scan(&raw).Error; err != nil {
		return nil, fmt.Errorf("sqlite: stats of %s: %w", s.table, err)
	}
	out := make([]storage.DayStats, 0, len(raw))
	for _, r := range raw {
		d, err := time.Parse(time.DateOnly, r.Day)
		if err != nil {
			return nil, fmt.Errorf("sqlite: %s holds a malformed day %q: %w", s.table, r.Day, err)
		}
		out = append(out, storage.DayStats{Consumer: r.Consumer, Day: d, Rows: r.Rows})
	}
	return out, nil
}

var (
	_ storage.InboxStore    = (*Store)(nil)
	_ storage.Verifier      = (*Store)(nil)
	_ storage.StatsReporter = (*Store)(nil)
	_ storage.SchemaPrinter = (*Store)(nil)
)
