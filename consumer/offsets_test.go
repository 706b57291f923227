package consumer

import (
	"context"
	"path/filepath"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/internal/testenv"
)

// The offsets table on every database: created idempotently, upserted (the
// column "partition" is a reserved word in MySQL), read back per group,
// topic and partition, and rolled back with its transaction.
func TestOffsetStoreOnEachDatabase(t *testing.T) {
	opens := map[string]func(t *testing.T) gorm.Dialector{
		"sqlite":   func(t *testing.T) gorm.Dialector { return inboxsqlite.Open(filepath.Join(t.TempDir(), "o.db")) },
		"postgres": func(t *testing.T) gorm.Dialector { return postgres.Open(testenv.PostgresDSN(t)) },
		"mysql":    func(t *testing.T) gorm.Dialector { return mysql.Open(testenv.MySQLDSN(t)) },
	}
	for name, open := range opens {
		t.Run(name, func(t *testing.T) {
			db, err := gorm.Open(open(t), &gorm.Config{Logger: logger.Discard})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			s := offsetStore{table: "inbox_offsets_" + conformance.RandomSuffix(), group: "g1"}
			t.Cleanup(func() {
				_ = db.Exec(`DROP TABLE ` + s.table).Error
				if sqlDB, err := db.DB(); err == nil {
					sqlDB.Close()
				}
			})
			for range 2 {
				if err := s.migrate(ctx, db); err != nil {
					t.Fatal(err)
				}
			}
			other := offsetStore{table: s.table, group: "g2"}
			for _, step := range []struct {
				st   offsetStore
				p    int
				next int64
			}{{s, 0, 5}, {s, 1, 7}, {s, 0, 9}, {other, 0, 100}} {
				err := db.Transaction(func(tx *gorm.DB) error { return step.st.save(ctx, tx, "orders", step.p, step.next) })
				if err != nil {
					t.Fatal(err)
				}
			}
			// A rolled-back transaction leaves no offset behind.
			_ = db.Transaction(func(tx *gorm.DB) error {
				if err := s.save(ctx, tx, "orders", 1, 1000); err != nil {
					t.Fatal(err)
				}
				return errRollback
			})
			for _, c := range []struct {
				st    offsetStore
				topic string
				p     int
				want  int64
			}{{s, "orders", 0, 9}, {s, "orders", 1, 7}, {s, "orders", 2, -1}, {s, "payments", 0, -1}, {other, "orders", 0, 100}} {
				got, err := c.st.load(ctx, db, c.topic, c.p)
				if err != nil || got != c.want {
					t.Errorf("%s %s/%d: got %d (%v), want %d", c.st.group, c.topic, c.p, got, err, c.want)
				}
			}
		})
	}
}

var errRollback = errorString("roll back")

type errorString string

func (e errorString) Error() string { return string(e) }
