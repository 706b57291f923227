package outbox_test

import (
	"sync/atomic"
	"testing"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// On PostgreSQL a relay cycle that stamps sequence headers, with fewer
// unpublished rows than it takes, sends two statements: the claim, which
// leases the shards and reads their rows and the source and epoch, and the
// acknowledgement. With more rows than it takes, one more reads each
// shard's share.
func TestRelayCycleStatementsPostgres(t *testing.T) {
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	schema := "cycle_" + conformance.RandomSuffix()
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: cycleShards})
	if err != nil {
		t.Fatal(err)
	}
	steady, backlog := cycleStatements(t, db, store, "cycle-"+schema)
	if steady != 2 {
		t.Errorf("a cycle of %d rows sent %d statements, want 2 (claim with rows, source and epoch; acknowledgement)", cycleKeys, steady)
	}
	if backlog != 3 {
		t.Errorf("a cycle of %d rows of %d sent %d statements, want 3 (claim, its shares' rows, acknowledgement)", cycleTake, 2*cycleTake, backlog)
	}
}

// On MariaDB the same cycle sends the lease's three statements in one
// transaction (the pending shards, locking those free, the lease), the
// read of the leased rows with the source and epoch, and the
// acknowledgement's transaction: locking the shards, checking the marked
// rows' events, moving the marks. The source is not read apart.
func TestRelayCycleStatementsMariaDB(t *testing.T) {
	dialector, err := inboxmysql.Open(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	table := "cycle_" + conformance.RandomSuffix()
	t.Cleanup(func() {
		for _, sfx := range []string{"", "_shards", "_relay", "_source"} {
			db.Exec("DROP TABLE IF EXISTS `" + table + sfx + "`")
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Shards: cycleShards})
	if err != nil {
		t.Fatal(err)
	}
	steady, backlog := cycleStatements(t, db, store, "cycle-"+table)
	if steady != 7 || backlog != 7 {
		t.Errorf("a cycle of %d rows sent %d statements, of %d rows of %d %d; want 7 each (lease 3, rows with the source 1, acknowledgement 3)",
			cycleKeys, steady, cycleTake, 2*cycleTake, backlog)
	}
}

const cycleShards, cycleKeys, cycleTake = 3, 12, 20

// cycleStatements runs relay cycles of an aligned outbox over store on db
// and returns the statements (transactions' begin and commit not counted)
// a cycle sent once the relay knew its shards' marks: with fewer rows than
// it takes (the same in three cycles, or it fails t), and with twice that.
func cycleStatements(t *testing.T, db *gorm.DB, store storage.OutboxStore, topic string) (steady, backlog int64) {
	t.Helper()
	ctx := t.Context()
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: topic})
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := ob.NewRelay(&pinRecorder{count: cycleShards}, outbox.RelayConfig{ID: "cycle", MaxMessages: cycleTake})
	if err != nil {
		t.Fatal(err)
	}
	var statements atomic.Int64
	count := func(*gorm.DB) { statements.Add(1) }
	for _, err := range []error{
		db.Callback().Query().After("gorm:query").Register("test:count", count),
		db.Callback().Raw().After("gorm:raw").Register("test:count", count),
		db.Callback().Row().After("gorm:row").Register("test:count", count),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	cycle := func(from, n, want int) int64 {
		t.Helper()
		if err := enqueue(ctx, db, ob, alignedMessages(topic, from, n, cycleKeys)...); err != nil {
			t.Fatal(err)
		}
		before := statements.Load()
		got, err := relay.PublishOnce(ctx)
		if err != nil || got != want {
			t.Fatalf("published %d, %v; want %d", got, err, want)
		}
		return statements.Load() - before
	}
	cycle(0, cycleKeys, cycleKeys) // the first cycle reads the shards' marks
	steady = cycle(cycleKeys, cycleKeys, cycleKeys)
	for round := 2; round <= 3; round++ {
		if n := cycle(round*cycleKeys, cycleKeys, cycleKeys); n != steady {
			t.Fatalf("cycles of %d rows sent %d and %d statements", cycleKeys, steady, n)
		}
	}
	return steady, cycle(4*cycleKeys, 2*cycleTake, cycleTake)
}
