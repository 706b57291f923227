package outbox_test

import (
	"sync/atomic"
	"testing"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/outbox"
)

// On PostgreSQL a relay cycle that stamps sequence headers, with fewer
// unpublished rows than it takes, sends two statements: the claim, which
// leases the shards and reads their rows and the source and epoch, and the
// acknowledgement. With more rows than it takes, one more reads each
// shard's share.
func TestRelayCycleStatementsPostgres(t *testing.T) {
	ctx := t.Context()
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
	const shards, keys, take = 3, 12, 20
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	topic := "cycle-" + schema
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: topic})
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := ob.NewRelay(&pinRecorder{count: shards}, outbox.RelayConfig{ID: "cycle", MaxMessages: take})
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
		if err := enqueue(ctx, db, ob, alignedMessages(topic, from, n, keys)...); err != nil {
			t.Fatal(err)
		}
		before := statements.Load()
		got, err := relay.PublishOnce(ctx)
		if err != nil || got != want {
			t.Fatalf("published %d, %v; want %d", got, err, want)
		}
		return statements.Load() - before
	}
	cycle(0, keys, keys) // the first cycle reads the shards' marks
	for round := 1; round <= 3; round++ {
		if n := cycle(round*keys, keys, keys); n != 2 {
			t.Fatalf("a cycle of %d rows sent %d statements, want 2 (claim with rows, source and epoch; acknowledgement)", keys, n)
		}
	}
	if n := cycle(4*keys, 2*take, take); n != 3 {
		t.Fatalf("a cycle of %d rows of %d sent %d statements, want 3 (claim, its shares' rows, acknowledgement)", take, 2*take, n)
	}
}
