package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// withParams returns dsn with the given driver parameters set.
func withParams(t testing.TB, dsn string, params map[string]string) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	for k, v := range params {
		switch k {
		case "clientFoundRows":
			cfg.ClientFoundRows = v == "true"
		case "interpolateParams":
			cfg.InterpolateParams = v == "true"
		case "parseTime":
			cfg.ParseTime = v == "true"
		case "loc":
			loc, err := time.LoadLocation(v)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Loc = loc
		default:
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params[k] = v
		}
	}
	return cfg.FormatDSN()
}

// opener opens dsn either the way the package recommends (Open) or with
// GORM's plain dialector, whose use of RETURNING on MariaDB stays on.
type opener func(dsn string) (*gorm.DB, error)

// A fresh gorm.Config per Open: a shared one shares clause builders between
// dialects.

func recommended(dsn string) (*gorm.DB, error) {
	d, err := inboxmysql.Open(dsn)
	if err != nil {
		return nil, err
	}
	return gorm.Open(d, &gorm.Config{Logger: logger.Discard})
}

func plainGORM(dsn string) (*gorm.DB, error) {
	return gorm.Open(gormmysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
}

func preparedGORM(dsn string) (*gorm.DB, error) {
	return gorm.Open(gormmysql.Open(dsn), &gorm.Config{Logger: logger.Discard, PrepareStmt: true})
}

func openDB(dsn string, open opener) (*gorm.DB, error) { return open(dsn) }

// newHarness gives every check its own table, dropped again in Close.
func newHarness(dsn string, open opener, txOptions *sql.TxOptions) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		db, err := openDB(dsn, open)
		if err != nil {
			return nil, err
		}
		store, err := inboxmysql.New(inboxmysql.Options{Table: "inbox_" + conformance.RandomSuffix()})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{
			DB:        db,
			Store:     store,
			TxOptions: txOptions,
			Open:      func(context.Context) (*gorm.DB, error) { return openDB(dsn, open) },
			Features:  conformance.Features{ExpiryCountsRows: false},
			Close: func() error {
				dropErr := db.Exec("DROP TABLE IF EXISTS `" + store.Table() + "`").Error
				sqlDB, err := db.DB()
				if err != nil {
					return err
				}
				if err := sqlDB.Close(); err != nil {
					return err
				}
				return dropErr
			},
		}, nil
	}
}

// TestConformance runs the suite under the driver settings users run:
// clientFoundRows off (the default) and on, through GORM's plain dialector
// with interpolated parameters (RETURNING left on by GORM), with GORM's
// prepared statement cache, with times left unparsed in a local time zone
// on both sides, and at the isolation levels other than the default
// REPEATABLE READ that users choose.
func TestConformance(t *testing.T) {
	dsn := testservers.MySQLDSN(t)
	for _, v := range []struct {
		name   string
		params map[string]string
		open   opener
		tx     *sql.TxOptions
	}{
		{"clientFoundRows=false", map[string]string{"clientFoundRows": "false"}, recommended, nil},
		{"clientFoundRows=true", map[string]string{"clientFoundRows": "true"}, recommended, nil},
		{"plain-gorm+interpolateParams+clientFoundRows", map[string]string{"clientFoundRows": "true", "interpolateParams": "true"}, plainGORM, nil},
		{"plain-gorm+PrepareStmt", nil, preparedGORM, nil},
		{"plain-gorm, server-side prepared statements", map[string]string{"interpolateParams": "false"}, plainGORM, nil},
		{"parseTime=false+loc=Asia/Tokyo+time_zone=-10:00", map[string]string{"parseTime": "false", "loc": "Asia/Tokyo", "time_zone": "'-10:00'"}, recommended, nil},
		{"READ-COMMITTED", nil, recommended, &sql.TxOptions{Isolation: sql.LevelReadCommitted}},
		{"SERIALIZABLE", nil, recommended, &sql.TxOptions{Isolation: sql.LevelSerializable}},
	} {
		t.Run(v.name, func(t *testing.T) {
			conformance.Run(t, newHarness(withParams(t, dsn, v.params), v.open, v.tx))
		})
	}
}
