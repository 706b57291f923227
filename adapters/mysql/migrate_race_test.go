package mysql_test

import (
	"context"
	"os"
	"testing"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/atonce"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// A deployment of several replicas starts at once, and each replica runs
// Migrate for everything it uses: the inbox tables of two consumers (and
// their watermark tables) and the outbox, none of which exists yet. Every
// Migrate, each on a connection pool of its own and all started at the
// same instant, must succeed, round after round.

const migrateReplicas, migrateRounds = 4, 20

// migratePools is how many Migrate calls, each with a pool of its own, one
// replica makes.
const migratePools = 5

// migrateCalls are one replica's Migrate calls on the tables named after
// prefix, each with a pool of its own from pools.
func migrateCalls(t testing.TB, prefix string, pools []*gorm.DB) []func() error {
	t.Helper()
	inboxA, err := inboxmysql.New(inboxmysql.Options{Table: prefix + "_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	inboxB, err := inboxmysql.New(inboxmysql.Options{Table: prefix + "_billing"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: prefix + "_outbox", Shards: 8})
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
		db, err := openDB(testservers.MySQLDSN(t), recommended)
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
		pools[i] = db
	}
	return pools
}

// dropMigrated drops the tables migrateCalls made.
func dropMigrated(t *testing.T, db *gorm.DB, prefix string) {
	t.Cleanup(func() {
		for _, suffix := range []string{"_inbox", "_billing", "_outbox", "_outbox_shards", "_outbox_relay", "_outbox_source",
			"_inbox" + inboxmysql.WatermarkSuffix, "_billing" + inboxmysql.WatermarkSuffix} {
			_ = db.Exec("DROP TABLE IF EXISTS `" + prefix + suffix + "`").Error
		}
	})
}

func TestMigrateAtTheSameInstant(t *testing.T) {
	pools := openPools(t, migratePools*migrateReplicas)
	for round := range migrateRounds {
		prefix := "race_" + conformance.RandomSuffix()
		dropMigrated(t, pools[0], prefix)
		var calls []func() error
		for r := range migrateReplicas {
			calls = append(calls, migrateCalls(t, prefix, pools[migratePools*r:migratePools*(r+1)])...)
		}
		if err := atonce.Calls(calls...); err != nil {
			t.Fatalf("round %d: %d Migrate calls at once on fresh tables: %v", round+1, len(calls), err)
		}
	}
}

// The same with the replicas as processes of their own.
func TestMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	pools := openPools(t, 1)
	for round := range migrateRounds {
		prefix := "race_" + conformance.RandomSuffix()
		dropMigrated(t, pools[0], prefix)
		if err := atonce.Processes(t, migrateReplicas, "TestMigrateReplica", migratePrefixVar+"="+prefix); err != nil {
			t.Fatalf("round %d: %d processes migrating fresh tables at once: %v", round+1, migrateReplicas, err)
		}
	}
}

const migratePrefixVar = "INBOX_TEST_MIGRATE_PREFIX"

// TestMigrateReplica is one replica of TestMigrateAtTheSameInstantFromProcesses;
// it does nothing in a normal test run.
func TestMigrateReplica(t *testing.T) {
	prefix := os.Getenv(migratePrefixVar)
	if prefix == "" {
		t.Skip("only run as a process of TestMigrateAtTheSameInstantFromProcesses")
	}
	calls := migrateCalls(t, prefix, openPools(t, migratePools))
	atonce.Ready()
	if err := atonce.Calls(calls...); err != nil {
		t.Fatal(err)
	}
}
