// Package bench measures what the inbox costs: the same business effect with
// no deduplication, through the inbox (one transaction per event and
// batched), through the common hand-rolled alternatives, and as a naturally
// idempotent upsert; the dedup cost as the inbox table grows; expiry under
// load; and Kafka to database end to end. internal/bench/bench_test.go (Go
// benchmarks) and dev/cmd/inbox-bench (a runner writing markdown tables) call the
// same code, so every number comes from one code path.
//
// Every variant of one comparison runs on the same backend with the same
// number of events, the same concurrency, the same pool and the same
// database settings, each on fresh tables.
package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	gormpg "gorm.io/driver/postgres"
	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// Dialect is the SQL dialect of a backend.
type Dialect int

// Dialects.
const (
	SQLite Dialect = iota + 1
	Postgres
	MySQL
)

func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "SQLite"
	case Postgres:
		return "PostgreSQL"
	case MySQL:
		return "MariaDB"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Backend is one database the benchmarks run on.
type Backend struct {
	Name    string
	Dialect Dialect
	DB      *gorm.DB
	// PoolSize is the connection pool's maximum size.
	PoolSize int

	dir string // SQLite: the directory holding the database file

	rawMu sync.Mutex
	raw   *sql.DB // MariaDB: the raw floors' pool with autocommit off (autocommitOff)
}

// Close closes the pool and removes what Open created locally.
func (b *Backend) Close() error {
	var errs []error
	if sqlDB, err := b.DB.DB(); err == nil {
		errs = append(errs, sqlDB.Close())
	}
	if b.raw != nil {
		errs = append(errs, b.raw.Close())
	}
	if b.dir != "" {
		errs = append(errs, os.RemoveAll(b.dir))
	}
	return errors.Join(errs...)
}

func gormConfig() *gorm.Config {
	// A fresh config per Open: a shared one shares clause builders between
	// dialects.
	return &gorm.Config{Logger: logger.Discard}
}

func setPool(db *gorm.DB, size int) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	sqlDB.SetMaxOpenConns(size)
	sqlDB.SetMaxIdleConns(size)
	sqlDB.SetConnMaxLifetime(0)
	return nil
}

// SQLiteSynchronous is the PRAGMA synchronous the benchmarks run SQLite
// with: FULL, as the adapter's DSN sets it, so that every commit is fsynced
// as on the other backends (fsync=on, innodb_flush_log_at_trx_commit=1).
const SQLiteSynchronous = "FULL"

// OpenSQLite opens a fresh SQLite database file in a temporary directory,
// with the settings the sqlite adapter requires (WAL, immediate
// transactions, busy timeout, synchronous FULL), with PRAGMA synchronous
// replaced by synchronous unless it is empty.
func OpenSQLite(poolSize int, synchronous string) (*Backend, error) {
	dir, err := os.MkdirTemp("", "inbox-bench-")
	if err != nil {
		return nil, err
	}
	dsn := inboxsqlite.DSN(filepath.Join(dir, "bench.db"))
	if synchronous != "" {
		base, query, _ := strings.Cut(dsn, "?")
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, err
		}
		q.Del("_sync")
		q.Set("_synchronous", synchronous)
		dsn = base + "?" + q.Encode()
	}
	db, err := gorm.Open(gormsqlite.Open(dsn), gormConfig())
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := setPool(db, poolSize); err != nil {
		return nil, err
	}
	return &Backend{Name: "sqlite", Dialect: SQLite, DB: db, PoolSize: poolSize, dir: dir}, nil
}

// OpenPostgres opens the PostgreSQL server at dsn (pgx through GORM).
func OpenPostgres(dsn string, poolSize int) (*Backend, error) {
	db, err := gorm.Open(gormpg.Open(dsn), gormConfig())
	if err != nil {
		return nil, err
	}
	if err := setPool(db, poolSize); err != nil {
		return nil, err
	}
	return &Backend{Name: "postgres", Dialect: Postgres, DB: db, PoolSize: poolSize}, nil
}

// OpenMySQL opens the MariaDB/MySQL server at dsn the way the mysql adapter
// recommends (strict sql_mode, GORM's RETURNING off).
func OpenMySQL(dsn string, poolSize int) (*Backend, error) {
	d, err := inboxmysql.Open(dsn)
	if err != nil {
		return nil, err
	}
	db, err := gorm.Open(d, gormConfig())
	if err != nil {
		return nil, err
	}
	if err := setPool(db, poolSize); err != nil {
		return nil, err
	}
	return &Backend{Name: "mariadb", Dialect: MySQL, DB: db, PoolSize: poolSize}, nil
}

// Version returns the server's version string.
func (b *Backend) Version(ctx context.Context) (string, error) {
	q := map[Dialect]string{SQLite: `SELECT sqlite_version()`, Postgres: `SHOW server_version`, MySQL: `SELECT VERSION()`}[b.Dialect]
	var v string
	err := b.DB.WithContext(ctx).Raw(q).Scan(&v).Error
	return v, err
}

// Fixture is one set of fresh tables on a backend: the stock table the
// effect updates, the hand-rolled dedup table, the upsert target and the
// inbox table with its Store.
type Fixture struct {
	Backend *Backend
	Suffix  string
	Stock   string // stock(sku, reserved)
	Dedup   string // hand-rolled dedup table (consumer, event_id)
	Level   string // upsert target level(sku, qty, version)
	Store   storage.InboxStore
	Inbox   *inbox.Inbox
	SKUs    int
	// InboxTable is the inbox table's name as it goes into SQL (quoted and
	// schema-qualified where the dialect needs it).
	InboxTable string
	// WatermarkTable is the store's watermark table (sequenced dedup), as
	// it goes into SQL.
	WatermarkTable string

	wm rawWatermarks // the watermarks of variant s20
}

// randomSuffix returns 8 random hex digits for table names.
func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewFixture creates fresh tables with skus stock rows and a migrated inbox
// table whose storage is prepared for the days from today-pastDays through
// today+7 (where the Store has per-day storage).
func NewFixture(ctx context.Context, b *Backend, skus int, cfg inbox.Config, pastDays int) (*Fixture, error) {
	sfx := randomSuffix()
	f := &Fixture{Backend: b, Suffix: sfx, Stock: "bench_stock_" + sfx, Dedup: "bench_dedup_" + sfx, Level: "bench_level_" + sfx, SKUs: skus}
	table := "bench_inbox_" + sfx
	var err error
	switch b.Dialect {
	case SQLite:
		f.Store, err = inboxsqlite.New(inboxsqlite.Options{Table: table})
		f.InboxTable = table
		f.WatermarkTable = table + "_watermarks"
	case Postgres:
		f.Store, err = inboxpg.New(inboxpg.Options{Schema: "public", Table: table})
		f.InboxTable = `"public"."` + table + `"`
		f.WatermarkTable = `"public"."` + table + `_watermarks"`
	case MySQL:
		f.Store, err = inboxmysql.New(inboxmysql.Options{Table: table})
		f.InboxTable = "`" + table + "`"
		f.WatermarkTable = "`" + table + "_watermarks`"
	}
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger
	}
	f.Inbox, err = inbox.New(b.DB, f.Store, cfg)
	if err != nil {
		return nil, err
	}
	db := b.DB.WithContext(ctx)
	for _, q := range f.createStatements() {
		if err := db.Exec(q).Error; err != nil {
			return nil, fmt.Errorf("bench: %s: %w", firstLine(q), err)
		}
	}
	if err := f.fillStock(ctx); err != nil {
		return nil, err
	}
	if err := f.Inbox.Migrate(ctx); err != nil {
		return nil, err
	}
	if ws, ok := f.Store.(storage.WatermarkStore); ok {
		if err := ws.MigrateWatermarks(ctx, db); err != nil {
			return nil, err
		}
	}
	if err := f.Prepare(ctx, Today().AddDate(0, 0, -pastDays), Today().AddDate(0, 0, 7)); err != nil {
		return nil, err
	}
	return f, nil
}

// Prepare makes the Store ready for the days from..through (day partitions).
func (f *Fixture) Prepare(ctx context.Context, from, through time.Time) error {
	plan := storage.MaintenancePlan{Today: from, PrepareThrough: through, ExpireBefore: from.AddDate(0, 0, -1)}
	if _, err := f.Store.Maintain(ctx, f.Backend.DB.WithContext(ctx), plan); err != nil {
		return fmt.Errorf("bench: prepare %s..%s: %w", from.Format(time.DateOnly), through.Format(time.DateOnly), err)
	}
	return nil
}

// Today is the current UTC day.
func Today() time.Time { return storage.DayOf(time.Now()) }

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func (f *Fixture) createStatements() []string {
	switch f.Backend.Dialect {
	case MySQL:
		return []string{
			`CREATE TABLE ` + f.Stock + ` (sku BIGINT NOT NULL PRIMARY KEY, reserved BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB`,
			`CREATE TABLE ` + f.Dedup + ` (consumer VARBINARY(128) NOT NULL, event_id VARBINARY(255) NOT NULL, processed_at DATETIME(6) NOT NULL, PRIMARY KEY (consumer, event_id)) ENGINE=InnoDB`,
			`CREATE TABLE ` + f.Level + ` (sku BIGINT NOT NULL PRIMARY KEY, qty BIGINT NOT NULL, version BIGINT NOT NULL) ENGINE=InnoDB`,
		}
	case Postgres:
		return []string{
			`CREATE TABLE ` + f.Stock + ` (sku bigint PRIMARY KEY, reserved bigint NOT NULL DEFAULT 0)`,
			`CREATE TABLE ` + f.Dedup + ` (consumer text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL, processed_at timestamptz NOT NULL, PRIMARY KEY (consumer, event_id))`,
			`CREATE TABLE ` + f.Level + ` (sku bigint PRIMARY KEY, qty bigint NOT NULL, version bigint NOT NULL)`,
		}
	default:
		return []string{
			`CREATE TABLE ` + f.Stock + ` (sku INTEGER PRIMARY KEY, reserved INTEGER NOT NULL DEFAULT 0)`,
			`CREATE TABLE ` + f.Dedup + ` (consumer TEXT NOT NULL, event_id TEXT NOT NULL, processed_at TEXT NOT NULL, PRIMARY KEY (consumer, event_id))`,
			`CREATE TABLE ` + f.Level + ` (sku INTEGER PRIMARY KEY, qty INTEGER NOT NULL, version INTEGER NOT NULL)`,
		}
	}
}

func (f *Fixture) fillStock(ctx context.Context) error {
	db := f.Backend.DB.WithContext(ctx)
	var q string
	switch f.Backend.Dialect {
	case Postgres:
		q = `INSERT INTO ` + f.Stock + ` (sku, reserved) SELECT g, 0 FROM generate_series(0, ? - 1) AS g`
	case MySQL:
		// MariaDB's SEQUENCE engine (MySQL 8 has none: use a recursive CTE there).
		q = fmt.Sprintf(`INSERT INTO `+f.Stock+` (sku, reserved) SELECT seq, 0 FROM seq_0_to_%d WHERE ? > 0`, f.SKUs-1)
	default:
		q = `INSERT INTO ` + f.Stock + ` (sku, reserved) WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < ?) SELECT n, 0 FROM g`
	}
	if err := db.Exec(q, f.SKUs).Error; err != nil {
		return fmt.Errorf("bench: fill %s: %w", f.Stock, err)
	}
	return nil
}

// Drop removes the fixture's tables.
func (f *Fixture) Drop(ctx context.Context) error {
	db := f.Backend.DB.WithContext(ctx)
	var errs []error
	if c, ok := f.Store.(io.Closer); ok {
		errs = append(errs, c.Close()) // the mysql Store's own connections
	}
	for _, t := range []string{f.Stock, f.Dedup, f.Level, f.InboxTable, f.WatermarkTable} {
		q := `DROP TABLE IF EXISTS ` + t
		if f.Backend.Dialect == Postgres {
			q += ` CASCADE`
		}
		errs = append(errs, db.Exec(q).Error)
	}
	return errors.Join(errs...)
}

// Reserved returns SUM(reserved) over the stock table: the number of
// increments applied.
func (f *Fixture) Reserved(ctx context.Context) (int64, error) {
	var n int64
	err := f.Backend.DB.WithContext(ctx).Raw(`SELECT COALESCE(SUM(reserved), 0) FROM ` + f.Stock).Scan(&n).Error
	return n, err
}

// WatermarkRows counts the rows of the watermark table.
func (f *Fixture) WatermarkRows(ctx context.Context) (int64, error) {
	var n int64
	err := f.Backend.DB.WithContext(ctx).Raw(`SELECT COUNT(*) FROM ` + f.WatermarkTable).Scan(&n).Error
	return n, err
}

// InboxRows counts the rows of the inbox table.
func (f *Fixture) InboxRows(ctx context.Context) (int64, error) {
	var n int64
	err := f.Backend.DB.WithContext(ctx).Raw(`SELECT COUNT(*) FROM ` + f.InboxTable).Scan(&n).Error
	return n, err
}
