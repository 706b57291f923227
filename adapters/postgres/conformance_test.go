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

// newHarness gives every check its own schema (and so its own inbox table
// and partitions) on its own connection pool, and drops the schema in Close.
func newHarness(dsn string, txOpts *sql.TxOptions) conformance.HarnessMaker {
	return newHarnessWith(dsn, txOpts, openDB)
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

func newHarnessWith(dsn string, txOpts *sql.TxOptions, openDB func(string) (*gorm.DB, error)) conformance.HarnessMaker {
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
		return &conformance.Harness{
			DB:        db,
			Store:     store,
			TxOptions: txOpts,
			Open:      func(context.Context) (*gorm.DB, error) { return openDB(dsn) },
			Features:  conformance.Features{ExpiryCountsRows: false},
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

func TestConformance(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	for _, level := range []struct {
		name string
		opts *sql.TxOptions
	}{
		{"read-committed", &sql.TxOptions{Isolation: sql.LevelReadCommitted}},
		{"repeatable-read", &sql.TxOptions{Isolation: sql.LevelRepeatableRead}},
		{"serializable", &sql.TxOptions{Isolation: sql.LevelSerializable}},
	} {
		t.Run(level.name, func(t *testing.T) {
			conformance.Run(t, newHarness(dsn, level.opts))
		})
	}
	t.Run("generic-claim-path", func(t *testing.T) {
		conformance.Run(t, newHarnessWith(dsn, nil, openGeneric))
	})
}
