package mysql_test

import (
	"strings"
	"testing"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
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
	if err := conformance.CheckNoWatermarkTable(t.Context(), store); err != nil {
		t.Error(err)
	}
}

// A member that waits for a stream longer than innodb_lock_wait_timeout
// gives up (1205) with an error IsRetryable reports, never "moved" (a
// deadlock is the suite's watermark/crossed-writes).
func TestWatermarkLockTimeoutIsRetryable(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS `" + store.Table() + inboxmysql.WatermarkSuffix + "`").Error })
	ctx := t.Context()
	// The session's, so for the rest of this pooled connection's life: the
	// test's pool is closed when it ends.
	shortWait := func(tx *gorm.DB) error { return tx.Exec("SET SESSION innodb_lock_wait_timeout = 1").Error }
	if err := store.MigrateWatermarks(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := conformance.CheckWatermarkLockWait(ctx, store, db, db, shortWait); err != nil {
		t.Fatal(err)
	}
}
