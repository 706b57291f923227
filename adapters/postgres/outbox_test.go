package postgres_test

import (
	"context"
	"testing"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// newOutboxHarness gives every check its own schema and drops it in Close.
func newOutboxHarness(dsn string) conformance.OutboxHarnessMaker {
	return func(ctx context.Context) (*conformance.OutboxHarness, error) {
		db, err := openDB(dsn)
		if err != nil {
			return nil, err
		}
		schema := "outbox_ct_" + conformance.RandomSuffix()
		store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: 16})
		if err != nil {
			_ = closeDB(db)
			return nil, err
		}
		return &conformance.OutboxHarness{
			DB:    db,
			Store: store,
			Open:  func(context.Context) (*gorm.DB, error) { return openDB(dsn) },
			Close: func() error {
				err := db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error
				if cerr := closeDB(db); err == nil {
					err = cerr
				}
				return err
			},
		}, nil
	}
}

func TestOutboxConformance(t *testing.T) {
	conformance.RunOutbox(t, newOutboxHarness(testservers.PostgresDSN(t)))
}
