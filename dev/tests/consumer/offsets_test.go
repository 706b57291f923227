package consumer_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// The offsets table on every database: created idempotently, upserted (the
// column "partition" is a reserved word in MySQL), read back per group,
// topic and partition, and rolled back with its transaction; the checked
// write (Advance) refuses an offset that went back and a generation older
// than the row's, and tells the two apart; Claim and Adopt move the row's
// generation; the fingerprint of the last message is read back only with
// the offset it was stored with.
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
			s := groupOffsets{Table: "inbox_offsets_" + conformance.RandomSuffix(), Group: "g1"}
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
			in := func(fn func(tx *gorm.DB) error) error { return db.Transaction(fn) }
			other := groupOffsets{Table: s.Table, Group: "g2"}
			for _, step := range []struct {
				st   groupOffsets
				p    int
				next int64
			}{{s, 0, 5}, {s, 1, 7}, {s, 0, 9}, {other, 0, 100}} {
				err := in(func(tx *gorm.DB) error {
					return step.st.Save(ctx, tx, "orders", step.p, storage.OffsetWrite{Next: step.next, Generation: 1})
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			// A rolled-back transaction leaves no offset behind.
			_ = in(func(tx *gorm.DB) error {
				if err := s.Save(ctx, tx, "orders", 1, storage.OffsetWrite{Next: 1000, Generation: 1}); err != nil {
					t.Fatal(err)
				}
				return errRollback
			})

			// advance writes only over a stored offset at or past its floor
			// and a generation not newer than its own; the same value again
			// is no move back (MySQL reports 0 rows).
			if err := in(func(tx *gorm.DB) error {
				return s.Save(ctx, tx, "advance", 0, storage.OffsetWrite{Next: 7, Generation: 2})
			}); err != nil {
				t.Fatal(err)
			}
			const ok, moved, taken = "ok", "moved", "taken over"
			for _, c := range []struct {
				p           int
				floor, next int64
				gen         int32
				want        string
			}{
				{0, 7, 7, 2, ok}, {0, 5, 8, 2, ok}, {0, 9, 10, 2, moved},
				{0, 5, 9, 1, taken},  // an older generation, however good its offset
				{0, -1, 9, 1, taken}, // also without a floor
				{0, 8, 9, 3, ok},     // a newer generation takes the row
				{0, 9, 10, 2, taken}, // and the one before is refused
				{0, 12, 13, 3, moved},
				{0, 12, 13, 1, taken}, // both wrong: the newer generation says zombie
				{1, 0, 3, 1, moved}, {1, -1, 3, 1, ok}, {1, 3, 3, 1, ok},
			} {
				err := in(func(tx *gorm.DB) error {
					return s.Advance(ctx, tx, "advance", c.p, c.floor, storage.OffsetWrite{Next: c.next, Generation: c.gen})
				})
				got := ok
				var te *storage.OffsetTakenOverError
				switch {
				case errors.Is(err, storage.ErrOffsetMoved):
					got = moved
				case errors.As(err, &te) && errors.Is(err, storage.ErrOffsetTakenOver):
					got = taken
				case err != nil:
					got = err.Error()
				}
				if got != c.want {
					t.Errorf("advance(%d, floor %d, next %d, generation %d) = %s, want %s", c.p, c.floor, c.next, c.gen, got, c.want)
				}
			}
			if row, found, err := s.Read(ctx, db, "advance", 0); err != nil || !found || row.Next != 9 || row.Generation != 3 {
				t.Errorf("advance left %+v (%v, %v), want offset 9 of generation 3", row, found, err)
			}

			// Claim raises the generation only; Adopt moves it from a given one.
			for _, c := range []struct {
				claim, want int32
			}{{2, 3}, {3, 3}, {5, 5}} {
				row, found, err := s.Claim(ctx, db, "advance", 0, c.claim)
				if err != nil || !found || row.Generation != c.want || row.Next != 9 {
					t.Errorf("claim by generation %d = %+v (%v, %v), want offset 9 of generation %d", c.claim, row, found, err, c.want)
				}
			}
			if _, found, err := s.Claim(ctx, db, "advance", 7, 1); found || err != nil {
				t.Errorf("claim of a partition without a row: found %v (%v)", found, err)
			}
			for _, c := range []struct {
				from, to int32
				want     bool
			}{{4, 1, false}, {5, 1, true}, {1, 1, true}} {
				if got, err := s.Adopt(ctx, db, "advance", 0, c.from, c.to); got != c.want || err != nil {
					t.Errorf("adopt from %d to %d = %v (%v), want %v", c.from, c.to, got, err, c.want)
				}
			}
			if row, _, _ := s.Read(ctx, db, "advance", 0); row.Generation != 1 {
				t.Errorf("generation %d after adopting, want 1", row.Generation)
			}

			// The fingerprint of the message before the offset.
			if err := in(func(tx *gorm.DB) error {
				return s.Save(ctx, tx, "last", 0, storage.OffsetWrite{Next: 4, Generation: 1, Last: -42})
			}); err != nil {
				t.Fatal(err)
			}
			if row, _, err := s.Read(ctx, db, "last", 0); err != nil || row.Last != -42 {
				t.Errorf("fingerprint %d (%v), want -42", row.Last, err)
			}
			// A writer that moves only next_offset (a version without the
			// columns) leaves a fingerprint that no longer belongs to it.
			if err := db.Exec(`UPDATE ` + s.Table + ` SET next_offset = 6 WHERE topic = 'last'`).Error; err != nil {
				t.Fatal(err)
			}
			if row, _, err := s.Read(ctx, db, "last", 0); err != nil || row.Last != 0 || row.Next != 6 {
				t.Errorf("%+v (%v) after next_offset moved alone, want offset 6 without fingerprint", row, err)
			}
			if err := in(func(tx *gorm.DB) error {
				return s.Advance(ctx, tx, "last", 0, 6, storage.OffsetWrite{Next: 7, Generation: 1})
			}); err != nil {
				t.Fatal(err)
			}
			if row, _, err := s.Read(ctx, db, "last", 0); err != nil || row.Last != 0 || row.Next != 7 {
				t.Errorf("%+v (%v) after a write without fingerprint, want offset 7 without one", row, err)
			}

			for _, c := range []struct {
				st    groupOffsets
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

// oldOffsetRow is the offsets table as versions before the generation and
// fingerprint columns made it.
type oldOffsetRow struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
}

// createOldOffsetsTable creates table as an older version did, with one row.
func createOldOffsetsTable(t testing.TB, db *gorm.DB, table string) {
	t.Helper()
	m := db
	if db.Name() == "mysql" {
		m = db.Set("gorm:table_options", "ENGINE=InnoDB")
	}
	if err := m.Table(table).AutoMigrate(&oldOffsetRow{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Table(table).Create(&oldOffsetRow{GroupID: "g", Topic: "orders", Partition: 0, NextOffset: 41}).Error; err != nil {
		t.Fatal(err)
	}
}

// statementLog records the statements GORM runs.
type statementLog struct {
	logger.Interface
	mu    sync.Mutex
	stmts []string
}

func (l *statementLog) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	l.mu.Lock()
	l.stmts = append(l.stmts, sql)
	l.mu.Unlock()
}

// Migrate adds the generation and fingerprint columns to a table made by an
// older version, keeping its rows (generation 0, no fingerprint: the
// fencing and the check of a recreated topic take over from the next
// write); the writes of an older version (which name none of the new
// columns) still work on it; and a second Migrate changes nothing (GORM
// does not rebuild the table, as its SQLite migrator would for a column it
// thinks changed).
func TestOffsetsMigrateAddsColumnsToAnOldTable(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			db := openOffsetsPool(t, name, filepath.Join(t.TempDir(), "o.db"))
			table := freshOffsetsTable(t, db)
			createOldOffsetsTable(t, db, table)
			ctx := context.Background()
			st := groupOffsets{Table: table, Group: "g"}
			if err := st.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			row, found, err := st.Read(ctx, db, "orders", 0)
			if err != nil || !found || row.Next != 41 || row.Generation != 0 || row.Last != 0 {
				t.Fatalf("the old row after Migrate: %+v (%v, %v), want offset 41, generation 0, no fingerprint", row, found, err)
			}
			// An older version's insert and upsert.
			if err := db.Table(table).Create(&oldOffsetRow{GroupID: "g", Topic: "orders", Partition: 1, NextOffset: 3}).Error; err != nil {
				t.Fatalf("an older version's insert: %v", err)
			}
			if got, err := st.Load(ctx, db, "orders", 1); got != 3 || err != nil {
				t.Errorf("the older version's row: %d (%v), want 3", got, err)
			}
			if err := db.Transaction(func(tx *gorm.DB) error {
				return st.Advance(ctx, tx, "orders", 0, 41, storage.OffsetWrite{Next: 42, Generation: 7, Last: 99})
			}); err != nil {
				t.Fatal(err)
			}
			if row, _, err := st.Read(ctx, db, "orders", 0); err != nil || row.Next != 42 || row.Generation != 7 || row.Last != 99 {
				t.Errorf("after a write: %+v (%v)", row, err)
			}
			rec := &statementLog{Interface: logger.Discard}
			if err := st.Migrate(ctx, db.Session(&gorm.Session{Logger: rec})); err != nil {
				t.Fatal(err)
			}
			for _, q := range rec.stmts {
				if u := strings.ToUpper(strings.TrimSpace(q)); strings.HasPrefix(u, "ALTER") || strings.HasPrefix(u, "CREATE") ||
					strings.HasPrefix(u, "DROP") || strings.HasPrefix(u, "INSERT") {
					t.Errorf("a second Migrate ran %s", q)
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
	fresh := groupOffsets{Table: "inbox_offsets_" + conformance.RandomSuffix(), Group: "g1"}
	myisam := groupOffsets{Table: "inbox_offsets_" + conformance.RandomSuffix(), Group: "g1"}
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

// hiddenStore is an inbox store behind a wrapper that passes on the four
// methods of storage.InboxStore alone: it keeps no offsets.
type hiddenStore struct{ storage.InboxStore }

// Offsets.Store needs a store that keeps offsets (storage.OffsetStore): the
// inbox's, or without an inbox the Classifier. New refuses a store without
// one, naming its type, rather than failing at the first write; the
// adapter's store itself is taken.
func TestStoreOffsetsNeedsAnOffsetStore(t *testing.T) {
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "o.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	handler := func(context.Context, *gorm.DB, consumer.Message) error { return nil }
	config := func(s storage.InboxStore, naturally bool) consumer.Config {
		cfg := consumer.Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"}, Consumer: "c",
			Handler: handler, Offsets: consumer.OffsetsConfig{Store: true}}
		if naturally {
			cfg.NaturallyIdempotent, cfg.DB, cfg.Classifier = true, db, s
			return cfg
		}
		ib, err := inbox.New(db, s, inbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Inbox = ib
		return cfg
	}
	for _, naturally := range []bool{false, true} {
		_, err := consumer.New(config(hiddenStore{store}, naturally))
		if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "Offsets.Store needs an inbox store that implements storage.OffsetStore") ||
			!strings.Contains(err.Error(), "consumer_test.hiddenStore") {
			t.Errorf("naturally idempotent %v: New = %v, want ErrInvalidConfig naming storage.OffsetStore and the store's type", naturally, err)
		}
		if _, err := consumer.New(config(store, naturally)); err != nil {
			t.Errorf("naturally idempotent %v: New with the adapter's store = %v", naturally, err)
		}
	}
}
