//go:build cgo

package outbox_test

import (
	"path/filepath"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

func init() {
	chainBackends = append(chainBackends, struct {
		name string
		open func(t *testing.T) chainDB
	}{"sqlite", sqliteChain})
}

func sqliteChain(t *testing.T) chainDB {
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "chain.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return chainDB{
		db: db,
		newInbox: func(table string) (storage.InboxStore, error) {
			return inboxsqlite.New(inboxsqlite.Options{Table: table})
		},
		newOutbox: func(table string) (storage.OutboxStore, error) {
			return inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: table, Shards: 16})
		},
		drop:    func(...string) {},
		qualify: func(table string) string { return table },
	}
}
