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

// newOutboxHarness gives every check its own database file.
func newOutboxHarness(t *testing.T) conformance.OutboxHarnessMaker {
	return func(ctx context.Context) (*conformance.OutboxHarness, error) {
		path := filepath.Join(t.TempDir(), "outbox.db")
		open := func(context.Context) (*gorm.DB, error) {
			return gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
		}
		db, err := open(ctx)
		if err != nil {
			return nil, err
		}
		store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 16})
		if err != nil {
			return nil, err
		}
		return &conformance.OutboxHarness{
			DB:    db,
			Store: store,
			Open:  open,
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

func TestOutboxConformance(t *testing.T) {
	conformance.RunOutbox(t, newOutboxHarness(t))
}
