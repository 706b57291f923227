package main

import (
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/storage"
)

// TestMigratePrintSQL applies what `migrate --print-sql` prints to a
// database without the inbox table, as a migration tool would, and checks
// that the Store finds the tables it makes: Migrate, MigrateWatermarks and
// Verify accept them, watermarks are written,
// today's and the prepared days' rows are claimed (and deduplicated), and
// Maintain takes over from there.
func TestMigratePrintSQL(t *testing.T) {
	cases := []struct {
		dialect string
		dsn     func(t testing.TB) string
		args    func(table string) []string
		store   func(t *testing.T, table string) (storage.InboxStore, string)
	}{
		{dialectSQLite, func(t testing.TB) string { return inboxsqlite.DSN(emptySQLite(t.(*testing.T))) }, func(table string) []string { return []string{"--table", table} },
			func(t *testing.T, table string) (storage.InboxStore, string) {
				s, err := inboxsqlite.New(inboxsqlite.Options{Table: table})
				if err != nil {
					t.Fatal(err)
				}
				return s, ""
			}},
		{dialectPostgres, testservers.PostgresDSN, func(table string) []string { return []string{"--schema", table, "--table", table} },
			func(t *testing.T, table string) (storage.InboxStore, string) {
				s, err := inboxpg.New(inboxpg.Options{Schema: table, Table: table})
				if err != nil {
					t.Fatal(err)
				}
				return s, table
			}},
		{dialectMySQL, testservers.MySQLDSN, func(table string) []string { return []string{"--table", table} },
			func(t *testing.T, table string) (storage.InboxStore, string) {
				s, err := inboxmysql.New(inboxmysql.Options{Table: table})
				if err != nil {
					t.Fatal(err)
				}
				return s, ""
			}},
	}
	for _, c := range cases {
		t.Run(c.dialect, func(t *testing.T) {
			dsn := c.dsn(t)
			table := "inbox_ddl_" + conformance.RandomSuffix()
			r := runArgs(t, append([]string{"migrate", "--print-sql", "--dialect", c.dialect, "--prepare-days", "3"}, c.args(table)...)...)
			expectCode(t, r, exitOK)
			db := openGorm(t, c.dialect, dsn)
			store, schema := c.store(t, table)
			t.Cleanup(func() {
				if schema != "" {
					_ = db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error
				} else {
					_ = db.Exec("DROP TABLE IF EXISTS " + table + ", " + table + inboxmysql.WatermarkSuffix).Error
				}
			})
			n := 0
			for _, stmt := range strings.Split(r.stdout, ";\n") {
				var lines []string
				for _, l := range strings.Split(stmt, "\n") {
					if !strings.HasPrefix(strings.TrimSpace(l), "--") {
						lines = append(lines, l)
					}
				}
				if q := strings.TrimSpace(strings.Join(lines, "\n")); q != "" {
					if err := db.Exec(q).Error; err != nil {
						t.Fatalf("statement %d of the printed DDL: %v\n%s", n+1, err, q)
					}
					n++
				}
			}
			if n == 0 {
				t.Fatalf("no statements printed:\n%s", r.stdout)
			}
			ctx := t.Context()
			if err := store.Migrate(ctx, db); err != nil {
				t.Fatalf("Migrate on the printed table: %v", err)
			}
			if err := store.(storage.Verifier).Verify(ctx, db); err != nil {
				t.Fatalf("Verify on the printed tables: %v", err)
			}
			wm := store.(storage.WatermarkStore)
			k := storage.WatermarkKey{Scope: "c", Source: "src", Epoch: 1, Topic: "orders"}
			for _, w := range []storage.WatermarkWrite{{WatermarkKey: k, New: []byte("v1")}, {WatermarkKey: k, Old: []byte("v1"), New: []byte("v2")}} {
				if err := db.Transaction(func(tx *gorm.DB) error { return wm.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{w}) }); err != nil {
					t.Fatalf("a watermark write on the printed watermark table: %v", err)
				}
			}
			if err := wm.MigrateWatermarks(ctx, db); err != nil {
				t.Fatalf("MigrateWatermarks on the printed watermark table: %v", err)
			}
			today := storage.DayOf(time.Now())
			for d := range 4 {
				at := today.AddDate(0, 0, d).Add(time.Hour)
				row := storage.InboxRow{Consumer: "c", EventID: "e", Day: storage.DayOf(at), EventTime: at}
				for _, want := range []bool{true, false} {
					var got []bool
					err := db.Transaction(func(tx *gorm.DB) error {
						var err error
						got, err = store.Claim(ctx, tx, []storage.InboxRow{row})
						return err
					})
					if err != nil || len(got) != 1 || got[0] != want {
						t.Fatalf("claim of day +%d: %v %v, want new=%v", d, got, err, want)
					}
				}
			}
			if _, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 7), ExpireBefore: today.AddDate(0, 0, -30)}); err != nil {
				t.Fatalf("Maintain after the printed DDL: %v", err)
			}
		})
	}
}
