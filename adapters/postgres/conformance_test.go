package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
)

func openDB(dsn string) (*gorm.DB, error) {
	return gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
}

func closeDB(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// genericPool hides the *sql.DB behind a pool type of its own, as a user's
// custom connection pool would: the Store then cannot tell that pgx is the
// driver and takes its generic claim path (multi-row VALUES scanned by GORM).
type genericPool struct{ *sql.DB }

func (p genericPool) GetDBConn() (*sql.DB, error) { return p.DB, nil }

func openGeneric(dsn string) (*gorm.DB, error) {
	sqlDB, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	return gorm.Open(postgres.New(postgres.Config{Conn: genericPool{sqlDB}}), &gorm.Config{Logger: logger.Discard})
}

// newHarness gives every check its own schema (and so its own inbox and
// outbox tables and partitions) on its own connection pool opened by
// openDB, and drops the schema in Close. withOutbox adds the outbox Store:
// its transactions take no TxOptions, so its checks need to run in one
// variant only.
func newHarness(dsn string, txOpts *sql.TxOptions, openDB func(string) (*gorm.DB, error), withOutbox bool) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		db, err := openDB(dsn)
		if err != nil {
			return nil, err
		}
		schema := "inbox_ct_" + conformance.RandomSuffix()
		store, err := inboxpg.New(inboxpg.Options{Schema: schema})
		if err != nil {
			_ = closeDB(db)
			return nil, err
		}
		h := &conformance.Harness{
			DB:        db,
			Store:     store,
			TxOptions: txOpts,
			Open:      func(context.Context) (*gorm.DB, error) { return openDB(dsn) },
			Features:  conformance.Features{ExpiryCountsRows: false, Watermarks: true, Offsets: true},
			Close: func() error {
				err := db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error
				if cerr := closeDB(db); err == nil {
					err = cerr
				}
				return err
			},
		}
		if withOutbox {
			if h.Outbox, err = inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: 16}); err != nil {
				_ = closeDB(db)
				return nil, err
			}
		}
		return h, nil
	}
}

func TestConformance(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	for _, v := range []struct {
		name       string
		opts       *sql.TxOptions
		open       func(string) (*gorm.DB, error)
		withOutbox bool
	}{
		{"read-committed", &sql.TxOptions{Isolation: sql.LevelReadCommitted}, openDB, true},
		{"repeatable-read", &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, openDB, false},
		{"serializable", &sql.TxOptions{Isolation: sql.LevelSerializable}, openDB, false},
		{"generic-claim-path", nil, openGeneric, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			conformance.Run(t, newHarness(dsn, v.opts, v.open, v.withOutbox))
		})
	}
}
