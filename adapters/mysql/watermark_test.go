package mysql_test

import (
	"errors"
	"strings"
	"testing"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/storage"
)

// MigrateWatermarks refuses a table of another layout, naming what it
// found, and leaves it as it is.
func TestMigrateWatermarksRefusesOtherLayouts(t *testing.T) {
	const columns = `source VARBINARY(64) NOT NULL, epoch BIGINT NOT NULL, topic VARBINARY(255) NOT NULL, partition_no INT NOT NULL, updated_at DATETIME(6) NOT NULL`
	const key = `PRIMARY KEY (scope, topic, partition_no, source, epoch)`
	for name, ddl := range map[string]string{
		"a scope with a utf8mb4 collation": `(scope VARCHAR(128) NOT NULL, applied BLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		"values in a TINYBLOB":             `(scope VARBINARY(128) NOT NULL, applied TINYBLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=InnoDB`,
		"MyISAM":                           `(scope VARBINARY(128) NOT NULL, applied BLOB NOT NULL, ` + columns + `, ` + key + `) ENGINE=MyISAM`,
		"a key without the epoch":          `(scope VARBINARY(128) NOT NULL, applied BLOB NOT NULL, ` + columns + `, PRIMARY KEY (scope, topic, partition_no, source)) ENGINE=InnoDB`,
	} {
		t.Run(name, func(t *testing.T) {
			db := testDB(t, nil)
			store := newStore(t, db, inboxmysql.Options{})
			table := store.Table() + inboxmysql.WatermarkSuffix
			t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`").Error })
			if err := db.Exec("CREATE TABLE `" + table + "` " + ddl).Error; err != nil {
				t.Fatal(err)
			}
			err := store.MigrateWatermarks(t.Context(), db)
			if err == nil || !strings.Contains(err.Error(), table) {
				t.Fatalf("MigrateWatermarks on a table with %s: %v, want an error naming the table", name, err)
			}
			t.Log(err)
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
