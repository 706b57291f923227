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
// Migrate for everything it uses: the inbox tables of two consumers (and
// their watermark tables) and the outbox, all in a schema that does not
// exist yet or, every other round, holds the inbox tables of an earlier
// deployment. Every Migrate, each on a connection pool of its own and all
// started at the same instant, must succeed, round after round.

const migrateReplicas, migrateRounds = 4, 20

// migratePools is how many Migrate calls, each with a pool of its own, one
// replica makes.
const migratePools = 5

// upgradeRound makes, in every other round, the inbox tables of an earlier
// deployment, so that of the inbox's tables only the watermark tables are
// new. On a fresh schema every call waits for the schema's creation under
// one lock, which would hide a CREATE TABLE that is not serialised (two at
// once fail with 23505 on the catalog's unique index).
func upgradeRound(t *testing.T, db *gorm.DB, schema string, round int) {
	t.Helper()
	if round%2 == 0 {
		return
	}
	for _, table := range []string{inboxpg.DefaultTable, "billing_inbox"} {
		store, err := inboxpg.New(inboxpg.Options{Schema: schema, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(t.Context(), db); err != nil {
			t.Fatal(err)
		}
	}
}

// migrateCalls are one replica's Migrate calls on schema, each with
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
		func() error { return inboxA.MigrateWatermarks(ctx, pools[3]) },
		func() error { return inboxB.MigrateWatermarks(ctx, pools[4]) },
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
	pools := openPools(t, migratePools*migrateReplicas)
	for round := range migrateRounds {
		schema := "inbox_race_" + conformance.RandomSuffix()
		t.Cleanup(func() { _ = pools[0].Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error })
		upgradeRound(t, pools[0], schema, round)
		var calls []func() error
		for r := range migrateReplicas {
			calls = append(calls, migrateCalls(t, schema, pools[migratePools*r:migratePools*(r+1)])...)
		}
		if err := atonce.Calls(calls...); err != nil {
			t.Fatalf("round %d: %d Migrate calls at once: %v", round+1, len(calls), err)
		}
	}
}

// The same with the replicas as processes of their own.
func TestMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	pools := openPools(t, 1)
	for round := range migrateRounds {
		schema := "inbox_race_" + conformance.RandomSuffix()
		t.Cleanup(func() { _ = pools[0].Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`).Error })
		upgradeRound(t, pools[0], schema, round)
		if err := atonce.Processes(t, migrateReplicas, "TestMigrateReplica", migrateSchemaVar+"="+schema); err != nil {
			t.Fatalf("round %d: %d processes migrating at once: %v", round+1, migrateReplicas, err)
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
	calls := migrateCalls(t, schema, openPools(t, migratePools))
	atonce.Ready()
	if err := atonce.Calls(calls...); err != nil {
		t.Fatal(err)
	}
}
