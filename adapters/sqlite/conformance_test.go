package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
)

// newHarness gives every check its own database file, opened with GORM's
// prepared statements or without, with the inbox Store and the outbox Store.
func newHarness(t *testing.T, prepared bool) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		path := filepath.Join(t.TempDir(), "inbox.db")
		open := func(context.Context) (*gorm.DB, error) {
			return gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard, PrepareStmt: prepared})
		}
		db, err := open(ctx)
		if err != nil {
			return nil, err
		}
		store, err := inboxsqlite.New(inboxsqlite.Options{})
		if err != nil {
			return nil, err
		}
		ob, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 16})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{
			DB:       db,
			Store:    store,
			Outbox:   ob,
			Open:     open,
			Features: conformance.Features{ExpiryCountsRows: true, Watermarks: true, Offsets: true},
			Close: func() error {
				sqlDB, err := db.DB()
				if err != nil {
					return err
				}
				return sqlDB.Close()
			},
		}, nil
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t, false))
}

// TestConformancePrepareStmt runs the suite with GORM's prepared
// statements: the claim then runs on GORM's prepared-statement transaction
// (the single-row statement prepared once, multi-row ones sent as they are).
func TestConformancePrepareStmt(t *testing.T) {
	conformance.Run(t, newHarness(t, true))
}
