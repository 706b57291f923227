package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance/atonce"
)

// A deployment of several replicas starts at once, and each replica runs
// Migrate for everything it uses: the inbox tables of two consumers (and
// their watermark tables) and the outbox, all in a database file without
// tables yet. Every Migrate, each on
// a connection pool of its own and all started at the same instant, must
// succeed, round after round: with the DSN the package recommends, and with
// a plain path (no immediate transactions, the driver's default busy
// timeout). With Open, gorm.Open itself must not fail either, though the
// first connection of each pool races the others' switch of the fresh file
// to WAL.

const migrateReplicas, migrateRounds = 4, 20

var migrateOpeners = map[string]func(path string) gorm.Dialector{
	"Open":       inboxsqlite.Open,
	"plain-path": func(path string) gorm.Dialector { return gormsqlite.Open(path) },
}

// migrateCalls are one replica's Migrate calls, each with a pool of its
// own on the database file path.
func migrateCalls(t testing.TB, open func(string) gorm.Dialector, path string) []func() error {
	t.Helper()
	inboxA, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	inboxB, err := inboxsqlite.New(inboxsqlite.Options{Table: "billing_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	pools := make([]*gorm.DB, 5)
	for i := range pools {
		db, err := gorm.Open(open(path), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		})
		pools[i] = db
	}
	ctx := context.Background()
	return []func() error{
		func() error { return inboxA.Migrate(ctx, pools[0]) },
		func() error { return inboxB.Migrate(ctx, pools[1]) },
		func() error { return out.Migrate(ctx, pools[2]) },
		func() error { return inboxA.MigrateWatermarks(ctx, pools[3]) },
		func() error { return inboxB.MigrateWatermarks(ctx, pools[4]) },
	}
}

func TestMigrateAtTheSameInstant(t *testing.T) {
	for name, open := range migrateOpeners {
		t.Run(name, func(t *testing.T) {
			for round := range migrateRounds {
				path := filepath.Join(t.TempDir(), "race.db")
				var calls []func() error
				for range migrateReplicas {
					calls = append(calls, migrateCalls(t, open, path)...)
				}
				if err := atonce.Calls(calls...); err != nil {
					t.Fatalf("round %d: %d Migrate calls at once on a fresh database: %v", round+1, len(calls), err)
				}
			}
		})
	}
}

// The same with the replicas as processes of their own.
func TestMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	for name := range migrateOpeners {
		t.Run(name, func(t *testing.T) {
			for round := range migrateRounds {
				path := filepath.Join(t.TempDir(), "race.db")
				if err := atonce.Processes(t, migrateReplicas, "TestMigrateReplica", migratePathVar+"="+path, migrateOpenVar+"="+name); err != nil {
					t.Fatalf("round %d: %d processes migrating a fresh database at once: %v", round+1, migrateReplicas, err)
				}
			}
		})
	}
}

const migratePathVar, migrateOpenVar = "INBOX_TEST_MIGRATE_PATH", "INBOX_TEST_MIGRATE_OPEN"

// TestMigrateReplica is one replica of TestMigrateAtTheSameInstantFromProcesses;
// it does nothing in a normal test run.
func TestMigrateReplica(t *testing.T) {
	path := os.Getenv(migratePathVar)
	if path == "" {
		t.Skip("only run as a process of TestMigrateAtTheSameInstantFromProcesses")
	}
	calls := migrateCalls(t, migrateOpeners[os.Getenv(migrateOpenVar)], path)
	atonce.Ready()
	if err := atonce.Calls(calls...); err != nil {
		t.Fatal(err)
	}
}
