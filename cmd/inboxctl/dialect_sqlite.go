//go:build cgo

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
)

func init() {
	backends[dialectSQLite] = &backend{
		name:         dialectSQLite,
		defaultTable: inboxsqlite.DefaultTable,
		checkDSN:     sqliteCheckDSN,
		mustExist: func(dsn string) error {
			if err := sqliteCheckDSN(dsn); err != nil {
				return err
			}
			path := sqlitePath(dsn)
			if path == "" {
				return nil
			}
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("SQLite database file %s does not exist (inboxctl migrate creates it)", path)
			}
			return nil
		},
		open: func(dsn string) gorm.Dialector { return gormsqlite.Open(dsn) },
		newStore: func(table, _ string) (storage.InboxStore, error) {
			return inboxsqlite.New(inboxsqlite.Options{Table: table})
		},
		watermarkSuffix:    inboxsqlite.WatermarkSuffix,
		defaultOutboxTable: inboxsqlite.DefaultOutboxTable,
		newOutboxStore: func(table, _ string, shards int) (storage.OutboxStore, error) {
			return inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: table, Shards: shards})
		},
		tables: func(ctx context.Context, db *gorm.DB, _, prefix string) ([]string, error) {
			var names []string
			err := db.WithContext(ctx).Raw(`SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\' ORDER BY name`,
				likePrefix(prefix)).Scan(&names).Error
			return keepPrefixed(names, prefix), err
		},
		dropTable: func(ctx context.Context, db *gorm.DB, _, name string) error {
			return db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS "` + name + `"`).Error
		},
		size:     sqliteSize,
		features: conformance.Features{ExpiryCountsRows: true},
	}
}

// sqliteSize sums the table's and its indexes' pages from the dbstat virtual
// table where the SQLite build has it, and otherwise reports the size of the
// whole database file.
func sqliteSize(ctx context.Context, db *gorm.DB, _, table string) (*sizeInfo, error) {
	db = db.WithContext(ctx)
	var bytes *int64
	err := db.Raw(`SELECT SUM(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = ?)`, table).Scan(&bytes).Error
	if err == nil && bytes != nil {
		return &sizeInfo{Bytes: *bytes, Scope: "table and its indexes", Method: "dbstat"}, nil
	}
	var pages, pageSize int64
	if err := db.Raw(`PRAGMA page_count`).Scan(&pages).Error; err != nil {
		return nil, fmt.Errorf("read page_count: %w", err)
	}
	if err := db.Raw(`PRAGMA page_size`).Scan(&pageSize).Error; err != nil {
		return nil, fmt.Errorf("read page_size: %w", err)
	}
	if pages == 0 || pageSize == 0 {
		return nil, errors.New("the database reports no pages")
	}
	return &sizeInfo{Bytes: pages * pageSize, Scope: "whole database file (this SQLite build has no dbstat table)", Method: "page_count*page_size"}, nil
}
