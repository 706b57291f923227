package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// backend is what inboxctl needs to know about one dialect: how to open it,
// which Store to use, and the raw SQL of its catalogue.
type backend struct {
	name          string
	defaultTable  string
	defaultSchema string // "" for dialects without schemas
	// checkDSN rejects DSNs the command cannot work with.
	checkDSN func(dsn string) error
	// mustExist, if set, reports a database that does not exist yet and
	// that opening it would create (an SQLite file): only migrate may.
	mustExist func(dsn string) error
	open      func(dsn string) gorm.Dialector
	newStore  func(table, schema string) (storage.InboxStore, error)
	// watermarkSuffix follows the inbox table's name in its watermark
	// table's (storage.WatermarkStore), in the same schema.
	watermarkSuffix string
	// defaultOutboxTable and newOutboxStore are the outbox's.
	defaultOutboxTable string
	newOutboxStore     func(table, schema string, shards int) (storage.OutboxStore, error)
	// tables lists the tables (in schema, where the dialect has schemas)
	// whose names start with prefix.
	tables func(ctx context.Context, db *gorm.DB, schema, prefix string) ([]string, error)
	// dropTable drops a table (and, on PostgreSQL, what depends on it).
	dropTable func(ctx context.Context, db *gorm.DB, schema, name string) error
	// schemaExists and dropEmptySchema, for dialects with schemas, let check
	// remove a schema that the Store's Migrate created for its scratch tables.
	schemaExists    func(ctx context.Context, db *gorm.DB, schema string) (bool, error)
	dropEmptySchema func(ctx context.Context, db *gorm.DB, schema string) error
	// sessionCheck, if set, reports connection settings that break the
	// atomicity of the applications' own writes (not only the inbox
	// table's); check adds it to settings/verify.
	sessionCheck func(ctx context.Context, db *gorm.DB) error
	// size reports the table's size on disk.
	size func(ctx context.Context, db *gorm.DB, schema, table string) (*sizeInfo, error)
	// features describe the Store to the conformance suite.
	features conformance.Features
}

// sizeInfo is what a dialect can tell about the space the table takes.
type sizeInfo struct {
	Bytes      int64           `json:"bytes"`
	Scope      string          `json:"scope"`  // what Bytes covers
	Method     string          `json:"method"` // how it was measured
	Partitions []partitionSize `json:"partitions,omitempty"`
}

type partitionSize struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	// Rows is the catalogue's estimate, -1 where it has none.
	Rows int64 `json:"rows_estimate"`
}

// backends holds the dialects this build supports; dialect_*.go files
// register themselves.
var backends = map[string]*backend{}

// unavailable explains, for a dialect whose adapter this build lacks, why.
var unavailable = map[string]string{
	dialectPostgres: "the PostgreSQL adapter (adapters/postgres) is not part of this build of inboxctl yet",
	dialectMySQL:    "the MySQL/MariaDB adapter (adapters/mysql) is not part of this build of inboxctl yet",
}

func lookupBackend(dialect string) (*backend, error) {
	if b, ok := backends[dialect]; ok {
		return b, nil
	}
	if why, ok := unavailable[dialect]; ok {
		return nil, fmt.Errorf("dialect %s is not available: %s", dialect, why)
	}
	return nil, fmt.Errorf("dialect %s is not available", dialect)
}

// conn is an open database with its backend and the Store for the inbox
// table.
type conn struct {
	b      *backend
	db     *gorm.DB
	store  storage.InboxStore
	table  string // the inbox table's name, without schema
	schema string // its schema; "" where the dialect has none
}

// connect opens the database of o and builds the Store for o's table.
func connect(ctx context.Context, o *options) (*conn, error) {
	b, err := lookupBackend(o.dialect)
	if err != nil {
		return nil, err
	}
	table := o.table
	if table == "" {
		table = b.defaultTable
	}
	store, err := b.newStore(table, o.schema)
	if err != nil {
		return nil, err
	}
	if b.mustExist != nil && !o.create {
		if err := b.mustExist(o.dsn); err != nil {
			return nil, err
		}
	}
	db, err := openDB(ctx, b, o.dsn)
	if err != nil {
		return nil, err
	}
	schema := o.schema
	if schema == "" {
		schema = b.defaultSchema
	}
	return &conn{b: b, db: db, store: store, table: table, schema: schema}, nil
}

// openDB opens a new connection pool to dsn and checks that it answers.
func openDB(ctx context.Context, b *backend, dsn string) (*gorm.DB, error) {
	if b.checkDSN != nil {
		if err := b.checkDSN(dsn); err != nil {
			return nil, err
		}
	}
	db, err := gorm.Open(b.open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", b.name, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", b.name, err)
	}
	if err := sqlDB.PingContext(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("connect to the %s database: %w", b.name, err)
	}
	return db, nil
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

func (c *conn) close() { closeDB(c.db) }

// newInbox returns an inbox over c with the command's windows.
func (c *conn) newInbox(o *options, stderr io.Writer) (*inbox.Inbox, error) {
	return inbox.New(c.db, c.store, inbox.Config{
		RetentionDays: o.retentionDays,
		PrepareDays:   o.prepareDays,
		Logger:        newLogger(o, stderr),
	})
}

func newLogger(o *options, stderr io.Writer) *slog.Logger {
	if !o.verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// likePrefix returns a LIKE pattern matching names that start with prefix,
// with \ as the escape character.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}

// keepPrefixed keeps the names that start with prefix exactly (LIKE may
// ignore case).
func keepPrefixed(names []string, prefix string) []string {
	out := names[:0]
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}
