package consumer_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/internal/offsets"
)

// The offsets table on every database: created idempotently, upserted (the
// column "partition" is a reserved word in MySQL), read back per group,
// topic and partition, and rolled back with its transaction.
func TestOffsetStoreOnEachDatabase(t *testing.T) {
	opens := map[string]func(t *testing.T) gorm.Dialector{
		"sqlite":   func(t *testing.T) gorm.Dialector { return inboxsqlite.Open(filepath.Join(t.TempDir(), "o.db")) },
		"postgres": func(t *testing.T) gorm.Dialector { return postgres.Open(testservers.PostgresDSN(t)) },
		"mysql":    func(t *testing.T) gorm.Dialector { return mysql.Open(testservers.MySQLDSN(t)) },
	}
	for name, open := range opens {
		t.Run(name, func(t *testing.T) {
			db, err := gorm.Open(open(t), &gorm.Config{Logger: logger.Discard})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			s := offsets.Store{Table: "inbox_offsets_" + conformance.RandomSuffix(), Group: "g1"}
			t.Cleanup(func() {
				_ = db.Exec(`DROP TABLE ` + s.Table).Error
				if sqlDB, err := db.DB(); err == nil {
					sqlDB.Close()
				}
			})
			for range 2 {
				if err := s.Migrate(ctx, db); err != nil {
					t.Fatal(err)
				}
			}
			other := offsets.Store{Table: s.Table, Group: "g2"}
			for _, step := range []struct {
				st   offsets.Store
				p    int
				next int64
			}{{s, 0, 5}, {s, 1, 7}, {s, 0, 9}, {other, 0, 100}} {
				err := db.Transaction(func(tx *gorm.DB) error { return step.st.Save(ctx, tx, "orders", step.p, step.next) })
				if err != nil {
					t.Fatal(err)
				}
			}
			// A rolled-back transaction leaves no offset behind.
			_ = db.Transaction(func(tx *gorm.DB) error {
				if err := s.Save(ctx, tx, "orders", 1, 1000); err != nil {
					t.Fatal(err)
				}
				return errRollback
			})
			// advance writes only over a stored offset at or past its floor;
			// the same value again is no move back (MySQL reports 0 rows).
			if err := db.Transaction(func(tx *gorm.DB) error { return s.Save(ctx, tx, "advance", 0, 7) }); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				p           int
				floor, next int64
				moved       bool
			}{{0, 7, 7, false}, {0, 5, 8, false}, {0, 9, 10, true}, {1, 0, 3, true}, {1, -1, 3, false}, {1, 3, 3, false}} {
				err := db.Transaction(func(tx *gorm.DB) error { return s.Advance(ctx, tx, "advance", c.p, c.floor, c.next) })
				if moved := errors.Is(err, offsets.ErrPositionMoved); moved != c.moved || err != nil && !moved {
					t.Errorf("advance(%d, floor %d, next %d) = %v, want moved %v", c.p, c.floor, c.next, err, c.moved)
				}
			}
			if got, err := s.Load(ctx, db, "advance", 0); got != 8 || err != nil {
				t.Errorf("advance left %d (%v), want 8", got, err)
			}
			for _, c := range []struct {
				st    offsets.Store
				group string
				topic string
				p     int
				want  int64
			}{{s, "g1", "orders", 0, 9}, {s, "g1", "orders", 1, 7}, {s, "g1", "orders", 2, -1}, {s, "g1", "payments", 0, -1}, {other, "g2", "orders", 0, 100}} {
				got, err := c.st.Load(ctx, db, c.topic, c.p)
				if err != nil || got != c.want {
					t.Errorf("%s %s/%d: got %d (%v), want %d", c.group, c.topic, c.p, got, err, c.want)
				}
			}
		})
	}
}

var errRollback = errorString("roll back")

type errorString string

func (e errorString) Error() string { return string(e) }

// On a MariaDB/MySQL server whose default engine is MyISAM the offsets
// table is still created, as InnoDB (on MyISAM its key is too long, error
// 1071, and its rows would survive a rollback), and an existing offsets
// table that is not transactional makes Migrate fail, saying so.
func TestOffsetsTableIsTransactionalOnMySQL(t *testing.T) {
	dsn := testservers.MySQLDSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	// go-sql-driver/mysql sends unknown DSN parameters as SET statements.
	db, err := gorm.Open(mysql.Open(dsn+sep+"default_storage_engine=MyISAM"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fresh := offsets.Store{Table: "inbox_offsets_" + conformance.RandomSuffix(), Group: "g1"}
	myisam := offsets.Store{Table: "inbox_offsets_" + conformance.RandomSuffix(), Group: "g1"}
	t.Cleanup(func() {
		for _, table := range []string{fresh.Table, myisam.Table} {
			_ = db.Exec("DROP TABLE IF EXISTS `" + table + "`").Error
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	var engine string
	if err := db.Raw(`SELECT @@default_storage_engine`).Scan(&engine).Error; err != nil || !strings.EqualFold(engine, "MyISAM") {
		t.Fatalf("the session's default engine is %q (%v), want MyISAM", engine, err)
	}

	if err := fresh.Migrate(ctx, db); err != nil {
		t.Fatalf("migrate with MyISAM as the default engine: %v", err)
	}
	if err := db.Raw(`SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, fresh.Table).Scan(&engine).Error; err != nil {
		t.Fatal(err)
	}
	if !strings.EqualFold(engine, "InnoDB") {
		t.Errorf("offsets table created with engine %q, want InnoDB", engine)
	}
	if err := fresh.Migrate(ctx, db); err != nil {
		t.Fatalf("migrate again: %v", err)
	}

	if err := db.Exec("CREATE TABLE `" + myisam.Table + "` (group_id VARCHAR(100) NOT NULL, topic VARCHAR(100) NOT NULL, " +
		"`partition` INT NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (group_id, topic, `partition`)) ENGINE=MyISAM").Error; err != nil {
		t.Fatal(err)
	}
	err = myisam.Migrate(ctx, db)
	if err == nil || !strings.Contains(err.Error(), "MyISAM") || !strings.Contains(err.Error(), "transaction") {
		t.Fatalf("migrate of a MyISAM offsets table = %v, want an error naming the engine", err)
	}
}
