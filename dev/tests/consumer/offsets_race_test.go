package consumer_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/atonce"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// A deployment of several replicas of a consumer with Offsets.Store starts
// at once, and each replica runs Consumer.Migrate, which creates the
// offsets table: every call, each on a connection pool of its own and all
// started at the same instant, must succeed on a database without the
// table, round after round, on every database.

const offsetsReplicas, offsetsRounds = 4, 20

// offsetsDatabases open a connection pool on each database; where is the
// SQLite file (unused by the servers).
var offsetsDatabases = map[string]func(t testing.TB, where string) gorm.Dialector{
	"sqlite":       func(_ testing.TB, where string) gorm.Dialector { return inboxsqlite.Open(where) },
	"sqlite-plain": func(_ testing.TB, where string) gorm.Dialector { return gormsqlite.Open(where) },
	"postgres":     func(t testing.TB, _ string) gorm.Dialector { return postgres.Open(testservers.PostgresDSN(t)) },
	"mysql":        func(t testing.TB, _ string) gorm.Dialector { return mysql.Open(testservers.MySQLDSN(t)) },
}

// openOffsetsPool opens a connection pool on the database name, with a
// connection made.
func openOffsetsPool(t testing.TB, name, where string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(offsetsDatabases[name](t, where), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	if err := db.Exec(`SELECT 1`).Error; err != nil {
		t.Fatal(err)
	}
	return db
}

// freshOffsetsTable returns a new offsets table name, and drops the table
// through db when the test ends.
func freshOffsetsTable(t *testing.T, db *gorm.DB) string {
	table := "inbox_offsets_" + conformance.RandomSuffix()
	t.Cleanup(func() { _ = db.Exec(`DROP TABLE IF EXISTS ` + table).Error })
	return table
}

func TestOffsetsMigrateAtTheSameInstant(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for round := range offsetsRounds {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				table := freshOffsetsTable(t, openOffsetsPool(t, name, where))
				calls := make([]func() error, offsetsReplicas)
				for i := range calls {
					db := openOffsetsPool(t, name, where)
					calls[i] = func() error { return groupOffsets{Table: table, Group: "g"}.Migrate(context.Background(), db) }
				}
				if err := atonce.Calls(calls...); err != nil {
					t.Fatalf("round %d: %d Migrate calls at once without the offsets table: %v", round+1, len(calls), err)
				}
			}
		})
	}
}

// The same on a table made by an older version: every replica of the new
// version adds the missing columns at the same instant.
func TestOffsetsMigrateAddsColumnsAtTheSameInstant(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for round := range offsetsRounds / 2 {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				first := openOffsetsPool(t, name, where)
				table := freshOffsetsTable(t, first)
				createOldOffsetsTable(t, first, table)
				calls := make([]func() error, offsetsReplicas)
				for i := range calls {
					db := openOffsetsPool(t, name, where)
					calls[i] = func() error { return groupOffsets{Table: table, Group: "g"}.Migrate(context.Background(), db) }
				}
				if err := atonce.Calls(calls...); err != nil {
					t.Fatalf("round %d: %d Migrate calls at once on an old offsets table: %v", round+1, len(calls), err)
				}
				row, found, err := groupOffsets{Table: table, Group: "g"}.Read(context.Background(), first, "orders", 0)
				if err != nil || !found || row.Next != 41 {
					t.Fatalf("round %d: the old row after Migrate: %+v (%v, %v)", round+1, row, found, err)
				}
			}
		})
	}
}

// The same with the replicas as processes of their own.
func TestOffsetsMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for round := range offsetsRounds {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				table := freshOffsetsTable(t, openOffsetsPool(t, name, where))
				err := atonce.Processes(t, offsetsReplicas, "TestOffsetsMigrateReplica",
					offsetsDatabaseVar+"="+name, offsetsWhereVar+"="+where, offsetsTableVar+"="+table)
				if err != nil {
					t.Fatalf("round %d: %d processes creating the offsets table at once: %v", round+1, offsetsReplicas, err)
				}
			}
		})
	}
}

const offsetsDatabaseVar, offsetsWhereVar, offsetsTableVar = "INBOX_TEST_OFFSETS_DATABASE", "INBOX_TEST_OFFSETS_WHERE", "INBOX_TEST_OFFSETS_TABLE"

// TestOffsetsMigrateReplica is one replica of
// TestOffsetsMigrateAtTheSameInstantFromProcesses; it does nothing in a
// normal test run.
func TestOffsetsMigrateReplica(t *testing.T) {
	name := os.Getenv(offsetsDatabaseVar)
	if name == "" {
		t.Skip("only run as a process of TestOffsetsMigrateAtTheSameInstantFromProcesses")
	}
	db := openOffsetsPool(t, name, os.Getenv(offsetsWhereVar))
	atonce.Ready()
	if err := (groupOffsets{Table: os.Getenv(offsetsTableVar), Group: "g"}).Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
}
