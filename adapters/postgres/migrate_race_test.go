package postgres_test

import (
	"context"
	"os"
	"testing"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/atonce"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// A deployment of several replicas starts at once, and each replica runs
// Migrate for everything it uses: the inbox tables of two consumers and the
// outbox, all in a schema that does not exist yet. Every Migrate, each on a
// connection pool of its own and all started at the same instant, must
// succeed, round after round.

const migrateReplicas, migrateRounds = 4, 20

// migrateCalls are one replica's Migrate calls on a fresh schema, each with
// a pool of its own from pools.
func migrateCalls(t testing.TB, schema string, pools []*gorm.DB) []func() error {
	t.Helper()
	inboxA, err := inboxpg.New(inboxpg.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	inboxB, err := inboxpg.New(inboxpg.Options{Schema: schema, Table: "billing_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	return []func() error{
		func() error { return inboxA.Migrate(ctx, pools[0]) },
		func() error { return inboxB.Migrate(ctx, pools[1]) },
		func() error { return out.Migrate(ctx, pools[2]) },
	}
}

// openPools opens n connection pools, each with a connection made.
func openPools(t testing.TB, n int) []*gorm.DB {
	t.Helper()
	pools := make([]*gorm.DB, n)
	for i := range pools {
		db, err := openDB(testservers.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = closeDB(db) })
		if err := db.Exec(`SELECT 1`).Error; err != nil {
			t.Fatal(err)
		}
		pools[i] = db
	}
	return pools
}

func TestMigrateAtTheSameInstant(t *testing.T) {
	pools := openPools(t, 3*migrateReplicas)
	for round := range migrateRounds {
		schema := "inbox_race_" + conformance.RandomSuffix()
		t.Cleanup(func() { _ = pools[0].Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error })
		var calls []func() error
		for r := range migrateReplicas {
			calls = append(calls, migrateCalls(t, schema, pools[3*r:3*r+3])...)
		}
		if err := atonce.Calls(calls...); err != nil {
			t.Fatalf("round %d: %d Migrate calls at once on a fresh schema: %v", round+1, len(calls), err)
		}
	}
}

// The same with the replicas as processes of their own.
func TestMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	pools := openPools(t, 1)
	for round := range migrateRounds {
		schema := "inbox_race_" + conformance.RandomSuffix()
		t.Cleanup(func() { _ = pools[0].Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error })
		if err := atonce.Processes(t, migrateReplicas, "TestMigrateReplica", migrateSchemaVar+"="+schema); err != nil {
			t.Fatalf("round %d: %d processes migrating a fresh schema at once: %v", round+1, migrateReplicas, err)
		}
	}
}

const migrateSchemaVar = "INBOX_TEST_MIGRATE_SCHEMA"

// TestMigrateReplica is one replica of TestMigrateAtTheSameInstantFromProcesses;
// it does nothing in a normal test run.
func TestMigrateReplica(t *testing.T) {
	schema := os.Getenv(migrateSchemaVar)
	if schema == "" {
		t.Skip("only run as a process of TestMigrateAtTheSameInstantFromProcesses")
	}
	calls := migrateCalls(t, schema, openPools(t, 3))
	atonce.Ready()
	if err := atonce.Calls(calls...); err != nil {
		t.Fatal(err)
	}
}
