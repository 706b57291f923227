package mysql_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/storage"
)

// MigrateWatermarks and Verify refuse a watermark table of another
// layout, naming the table and what they found.
func TestMigrateWatermarksRefusesOtherLayouts(t *testing.T) {
	const columns = `source VARBINARY(64) NOT NULL, epoch BIGINT NOT NULL, topic VARBINARY(255) NOT NULL, partition_no INT NOT NULL, updated_at DATETIME(6) NOT NULL`
	const key = `PRIMARY KEY (scope, topic, partition_no, source, epoch)`
	for name, c := range map[string]struct{ ddl, says string }{
		"a scope with a utf8mb4 collation": {`(scope VARCHAR(128) NOT NULL, applied BLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`, "column scope is varchar, want varbinary"},
		"values in a TINYBLOB":             {`(scope VARBINARY(128) NOT NULL, applied TINYBLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=InnoDB`, "column applied is tinyblob"},
		"MyISAM":                           {`(scope VARBINARY(128) NOT NULL, applied BLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=MyISAM`, `engine "MyISAM"`},
		"a key without the epoch":          {`(scope VARBINARY(128) NOT NULL, applied BLOB NOT NULL, ` + columns + `, PRIMARY KEY (scope, topic, partition_no, source)) ENGINE=InnoDB`, "primary key is (scope,topic,partition_no,source)"},
		"a short scope":                    {`(scope VARBINARY(64) NOT NULL, applied BLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=InnoDB`, "column scope holds 64 bytes, want 128"},
		"a 32-bit epoch":                   {`(scope VARBINARY(128) NOT NULL, applied BLOB NOT NULL, ` + strings.Replace(columns, "epoch BIGINT", "epoch INT", 1) + `, ` + key + `) ENGINE=InnoDB`, "column epoch is int, want bigint"},
		"a nullable value":                 {`(scope VARBINARY(128) NOT NULL, applied BLOB, ` + columns + `, ` + key + `) ENGINE=InnoDB`, "column applied is nullable"},
		"no updated_at column":             {`(scope VARBINARY(128) NOT NULL, applied BLOB NOT NULL, ` + strings.Replace(columns, ", updated_at DATETIME(6) NOT NULL", "", 1) + `, ` + key + `) ENGINE=InnoDB`, "no column updated_at"},
	} {
		t.Run(name, func(t *testing.T) {
			db := testDB(t, nil)
			store := newStore(t, db, inboxmysql.Options{})
			table := store.Table() + inboxmysql.WatermarkSuffix
			t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`").Error })
			if err := db.Exec("CREATE TABLE `" + table + "` " + c.ddl).Error; err != nil {
				t.Fatal(err)
			}
			for what, err := range map[string]error{
				"MigrateWatermarks": store.MigrateWatermarks(t.Context(), db),
				"Verify":            store.Verify(t.Context(), db),
			} {
				if err == nil || !strings.Contains(err.Error(), table) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("%s on a table with %s: %v, want an error naming the table that says %q", what, name, err, c.says)
				}
			}
		})
	}
}

// An inbox table name that leaves no room for the watermark table's suffix
// in a 63-byte identifier: the watermark methods refuse it, New does not.
func TestWatermarkTableNameTooLong(t *testing.T) {
	store, err := inboxmysql.New(inboxmysql.Options{Table: strings.Repeat("t", 63-len(inboxmysql.WatermarkSuffix)+1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	w := storage.WatermarkWrite{WatermarkKey: storage.WatermarkKey{Scope: "s", Source: "r", Epoch: 1, Topic: "t"}, New: []byte("v")}
	_, readErr := store.Watermarks(ctx, nil, "s", "", -1)
	for name, err := range map[string]error{
		"MigrateWatermarks": store.MigrateWatermarks(ctx, nil),
		"SaveWatermarks":    store.SaveWatermarks(ctx, nil, []storage.WatermarkWrite{w}),
		"Watermarks":        readErr,
	} {
		if !errors.Is(err, storage.ErrInvalidConfig) {
			t.Errorf("%s: %v, want an error wrapping storage.ErrInvalidConfig", name, err)
		}
	}
}

// Two members that each hold one stream and write the other's deadlock
// (1213), and a member that waits for a stream longer than
// innodb_lock_wait_timeout gives up (1205): both failures are ones
// IsRetryable reports, never "moved".
func TestWatermarkLockFailuresAreRetryable(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS `" + store.Table() + inboxmysql.WatermarkSuffix + "`").Error })
	ctx := t.Context()
	if err := store.MigrateWatermarks(ctx, db); err != nil {
		t.Fatal(err)
	}
	a := storage.WatermarkKey{Scope: "c", Source: "src", Epoch: 1, Topic: "orders", Partition: 0}
	b := a
	b.Partition = 1
	v := []byte("v")
	write := func(k storage.WatermarkKey, to string) []storage.WatermarkWrite {
		return []storage.WatermarkWrite{{WatermarkKey: k, Old: v, New: []byte(to)}}
	}
	if err := db.Transaction(func(tx *gorm.DB) error {
		return store.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{{WatermarkKey: a, New: v}, {WatermarkKey: b, New: v}})
	}); err != nil {
		t.Fatal(err)
	}
	t.Run("deadlock", func(t *testing.T) {
		failed := crossWrites(t, db, func(tx *gorm.DB, i int, first bool) error {
			k := [2]storage.WatermarkKey{a, b}[i]
			if !first {
				k = [2]storage.WatermarkKey{b, a}[i]
			}
			return store.SaveWatermarks(ctx, tx, write(k, fmt.Sprint(i)))
		})
		if len(failed) != 1 || !store.IsRetryable(failed[0]) || errors.Is(failed[0], storage.ErrWatermarkMoved) {
			t.Fatalf("crossed writes: failures %v, want one the store calls retryable", failed)
		}
		t.Log(failed[0])
	})
	t.Run("lock wait timeout", func(t *testing.T) {
		holder := db.Begin()
		defer holder.Rollback()
		if err := store.SaveWatermarks(ctx, holder, write(a, "held")); err != nil {
			t.Fatal(err)
		}
		err := db.Transaction(func(tx *gorm.DB) error {
			// The session's, so for the rest of this pooled connection's
			// life: the test's pool is closed when it ends.
			if err := tx.Exec("SET SESSION innodb_lock_wait_timeout = 1").Error; err != nil {
				return err
			}
			return store.SaveWatermarks(ctx, tx, write(a, "waiter"))
		})
		if !store.IsRetryable(err) || errors.Is(err, storage.ErrWatermarkMoved) {
			t.Fatalf("a write that waited past innodb_lock_wait_timeout: %v, want an error the store calls retryable", err)
		}
		t.Log(err)
	})
}

// crossWrites runs two transactions on db: each makes its first write
// (first true), then both make their second at once. A transaction whose
// second write fails is rolled back at once, so that the other can go on;
// the other is rolled back at the end. It returns the second writes'
// failures.
func crossWrites(t *testing.T, db *gorm.DB, write func(tx *gorm.DB, i int, first bool) error) []error {
	t.Helper()
	var txs [2]*gorm.DB
	for i := range txs {
		txs[i] = db.Begin()
		defer txs[i].Rollback()
		if err := write(txs[i], i, true); err != nil {
			t.Fatalf("transaction %d's first write: %v", i, err)
		}
	}
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(txs))
	for i := range txs {
		go func() { results <- result{i, write(txs[i], i, false)} }()
	}
	var failed []error
	for range txs {
		r := <-results
		if r.err != nil {
			failed = append(failed, r.err)
			txs[r.i].Rollback()
		}
	}
	return failed
}
