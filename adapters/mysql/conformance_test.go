package mysql_test

import (
	"context"
	"database/sql"
	"errors"
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

// newHarness gives every check its own inbox table (and its watermark
// table), dropped again in Close. withOutbox adds the outbox Store, on
// tables of its own (the outbox's, with their _shards, _relay and _source
// tables), dropped in Close too.
//
// Each harness's Close tells owned whether its Store ran a transaction on
// a connection of its own with autocommit off (BeginClaim,
// BeginSaveWatermarks), then closes the Store.
func newHarness(dsn string, open opener, txOptions *sql.TxOptions, withOutbox bool, owned func(used bool)) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		db, err := openDB(dsn, open)
		if err != nil {
			return nil, err
		}
		store, err := inboxmysql.New(inboxmysql.Options{Table: "inbox_" + conformance.RandomSuffix()})
		if err != nil {
			return nil, err
		}
		tables := []string{store.Table(), store.Table() + inboxmysql.WatermarkSuffix} // to drop in Close
		h := &conformance.Harness{
			DB:        db,
			Store:     store,
			TxOptions: txOptions,
			Open:      func(context.Context) (*gorm.DB, error) { return openDB(dsn, open) },
			Features:  conformance.Features{ExpiryCountsRows: false, Watermarks: true, Offsets: true},
			Close: func() error {
				owned(len(inboxmysql.OwnedPools(store)) > 0)
				if err := store.Close(); err != nil {
					return err
				}
				var dropErr error
				for _, table := range tables {
					if err := db.Exec("DROP TABLE IF EXISTS `" + table + "`").Error; err != nil && dropErr == nil {
						dropErr = err
					}
				}
				sqlDB, err := db.DB()
				if err != nil {
					return err
				}
				if err := sqlDB.Close(); err != nil {
					return err
				}
				return dropErr
			},
		}
		if withOutbox {
			ob, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "outbox_" + conformance.RandomSuffix(), Shards: 16})
			if err != nil {
				return nil, err
			}
			h.Outbox = ob
			tables = append(tables, ob.Table(), ob.Table()+"_shards", ob.Table()+"_relay", ob.Table()+"_source")
		}
		return h, nil
	}
}

// TestConformance runs the suite under the driver settings users run:
// clientFoundRows off (the default) and on, through GORM's plain dialector
// with interpolated parameters (RETURNING left on by GORM), with GORM's
// prepared statement cache, with times left unparsed in a local time zone
// on both sides, and at the isolation levels other than the default
// REPEATABLE READ that users choose. The outbox checks run with the
// recommended Open and with GORM's plain dialector and interpolated
// parameters; the other settings are the inbox's (the outbox's transactions
// take no TxOptions, and it reads no affected-row counts of UPDATEs).
func TestConformance(t *testing.T) {
	dsn := testservers.MySQLDSN(t)
	for _, v := range []struct {
		name       string
		params     map[string]string
		open       opener
		tx         *sql.TxOptions
		withOutbox bool
	}{
		{"clientFoundRows=false", map[string]string{"clientFoundRows": "false"}, recommended, nil, true},
		{"clientFoundRows=true", map[string]string{"clientFoundRows": "true"}, recommended, nil, false},
		{"plain-gorm+interpolateParams+clientFoundRows", map[string]string{"clientFoundRows": "true", "interpolateParams": "true"}, plainGORM, nil, true},
		{"plain-gorm+PrepareStmt", nil, preparedGORM, nil, false}, // the generic path: BEGIN, then Claim
		{"plain-gorm, server-side prepared statements", map[string]string{"interpolateParams": "false"}, plainGORM, nil, false},
		{"parseTime=false+loc=Asia/Tokyo+time_zone=-10:00", map[string]string{"parseTime": "false", "loc": "Asia/Tokyo", "time_zone": "'-10:00'"}, recommended, nil, false},
		{"READ-COMMITTED", nil, recommended, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, false},
		{"SERIALIZABLE", nil, recommended, &sql.TxOptions{Isolation: sql.LevelSerializable}, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			dsn := withParams(t, dsn, v.params)
			// The checks that process messages ran their transactions on
			// connections of the Store's own, except under GORM's prepared
			// statements, where the inbox begins them with BEGIN.
			prepared := v.name == "plain-gorm+PrepareStmt"
			for _, c := range conformance.Checks() {
				t.Run(c.ID(), func(t *testing.T) {
					closed, used := false, false
					err := conformance.RunCheck(t.Context(), newHarness(dsn, v.open, v.tx, v.withOutbox, func(u bool) { closed, used = true, u }), c)
					if closed && used == prepared && (prepared || ownedChecks[c.ID()]) {
						t.Errorf("a connection of the Store's own opened: %v, want %v", used, !prepared)
					}
					if errors.Is(err, conformance.ErrSkipped) {
						t.Skip(err)
					}
					if err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
}

// ownedChecks are checks whose inbox transactions begin with a claim or a
// watermark write.
var ownedChecks = map[string]bool{
	"atomicity/first-delivery-commits-row-and-effect":    true,
	"atomicity/handler-error-rolls-back":                 true,
	"atomicity/handler-panic-rolls-back":                 true,
	"atomicity/cancelled-context-rolls-back":             true,
	"atomicity/begin-in-handler-is-refused":              true,
	"atomicity/nested-transaction-is-a-savepoint":        true,
	"atomicity/duplicate-skips-handler":                  true,
	"concurrency/concurrent-deliveries-of-one-id":        true,
	"concurrency/concurrent-deliveries-first-rolls-back": true,
	"batch/failing-message-is-isolated":                  true,
	"retention/maintain-while-inserting":                 true,
	"watermark/begin-and-save":                           true,
}
