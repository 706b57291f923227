package outbox_test

import (
	"slices"
	"strconv"
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
	db, store, topic := cyclePostgres(t)
	steady, backlog := cycleStatements(t, db, store, topic)
	if steady != 2 {
		t.Errorf("a cycle of %d rows sent %d statements, want 2 (claim with rows, source and epoch; acknowledgement)", cycleKeys, steady)
	}
	if backlog != 3 {
		t.Errorf("a cycle of %d rows of %d sent %d statements, want 3 (claim, its shares' rows, acknowledgement)", cycleTake, 2*cycleTake, backlog)
	}
}

// On MariaDB the same cycle sends the lease's three statements in one
// transaction (the pending shards with the source and epoch, locking those
// free, the lease), the read of the leased rows, and the acknowledgement's
// transaction: locking the shards, checking the marked rows' events,
// moving the marks. The source is not read apart.
func TestRelayCycleStatementsMariaDB(t *testing.T) {
	db, store, topic := cycleMariaDB(t)
	steady, backlog := cycleStatements(t, db, store, topic)
	if steady != 7 || backlog != 7 {
		t.Errorf("a cycle of %d rows sent %d statements, of %d rows of %d %d; want 7 each (lease with the source 3, rows 1, acknowledgement 3)",
			cycleKeys, steady, cycleTake, 2*cycleTake, backlog)
	}
}

// cyclePostgres returns a PostgreSQL outbox store of cycleShards shards in
// a schema of its own, dropped when tb ends, and a topic name for it.
func cyclePostgres(tb testing.TB) (*gorm.DB, storage.OutboxStore, string) {
	tb.Helper()
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(tb)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatal(err)
	}
	schema := "cycle_" + conformance.RandomSuffix()
	tb.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Shards: cycleShards})
	if err != nil {
		tb.Fatal(err)
	}
	return db, store, "cycle-" + schema
}

// cycleMariaDB is cyclePostgres on MariaDB, the tables dropped when tb
// ends.
func cycleMariaDB(tb testing.TB) (*gorm.DB, storage.OutboxStore, string) {
	tb.Helper()
	dialector, err := inboxmysql.Open(testservers.MySQLDSN(tb))
	if err != nil {
		tb.Fatal(err)
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatal(err)
	}
	table := "cycle_" + conformance.RandomSuffix()
	tb.Cleanup(func() {
		for _, sfx := range []string{"", "_shards", "_relay", "_source"} {
			db.Exec("DROP TABLE IF EXISTS `" + table + sfx + "`")
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Shards: cycleShards})
	if err != nil {
		tb.Fatal(err)
	}
	return db, store, "cycle-" + table
}

const cycleShards, cycleKeys, cycleTake = 3, 12, 20

// cycleStatements runs relay cycles of an aligned outbox over store on db
// and returns the statements (transactions' begin and commit not counted)
// a cycle sent once the relay knew its shards' marks: with fewer rows than
// it takes (the same in three cycles, or it fails t), and with twice that.
func cycleStatements(t *testing.T, db *gorm.DB, store storage.OutboxStore, topic string) (steady, backlog int64) {
	t.Helper()
	ctx := t.Context()
	ob, relay := cycleRelay(t, db, store, topic)
	statements := countStatements(t, db)
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

// countStatements counts the statements sent on db from now on,
// transactions' begin and commit not counted.
func countStatements(t *testing.T, db *gorm.DB) *atomic.Int64 {
	t.Helper()
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
	return &statements
}

// On PostgreSQL an Enqueue whose messages all go to one shard sends one
// statement: numbering them on the shard's counter, inserting them and,
// for a shard with nothing unpublished, notifying the relays are one
// statement's parts. The messages keep their order, and the relay is
// notified (TestRelayWakesOnNotification).
func TestEnqueueStatementsPostgres(t *testing.T) {
	db, store, _ := cyclePostgres(t)
	ob := newOutbox(t, db, store, outbox.Config{})
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	statements := countStatements(t, db)
	for i, n := range []int{1, 1, 5} {
		msgs := make([]outbox.Message, n)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "t", Key: []byte("one key"), Value: []byte(strconv.Itoa(j))}
		}
		before := statements.Load()
		if err := enqueue(t.Context(), db, ob, msgs...); err != nil {
			t.Fatal(err)
		}
		if got := statements.Load() - before; got != 1 {
			t.Errorf("enqueue %d of %d messages of one key sent %d statements, want 1", i, n, got)
		}
	}
	var seqs []int64
	pg := store.(*inboxpg.OutboxStore)
	if err := db.Raw(`SELECT seq FROM ` + pg.Schema() + `.` + pg.Table() + ` ORDER BY seq`).Scan(&seqs).Error; err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, 2, 3, 4, 5, 6, 7}; !slices.Equal(seqs, want) {
		t.Errorf("the shard's rows are numbered %v, want %v", seqs, want)
	}
}

// cycleRelay returns an aligned outbox over store on db, migrated, and its
// relay, publishing to a pinRecorder.
func cycleRelay(tb testing.TB, db *gorm.DB, store storage.OutboxStore, topic string) (*outbox.Outbox, *outbox.Relay) {
	tb.Helper()
	ctx := tb.Context()
	ob := newOutbox(tb, db, store, outbox.Config{AlignedTopic: topic})
	if err := ob.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		tb.Fatal(err)
	}
	relay, err := ob.NewRelay(&pinRecorder{count: cycleShards}, outbox.RelayConfig{ID: "cycle", MaxMessages: cycleTake})
	if err != nil {
		tb.Fatal(err)
	}
	return ob, relay
}

// BenchmarkRelayCycle times one relay cycle of an aligned outbox with
// sequence headers, 12 rows over 3 shards, on PostgreSQL and MariaDB, the
// broker an in-memory recorder: the claim with the source, the stamping,
// the check of the write's offsets and the acknowledgement. The enqueuing
// transaction before each cycle is not timed.
func BenchmarkRelayCycle(b *testing.B) {
	run := func(b *testing.B, db *gorm.DB, store storage.OutboxStore, topic string) {
		ctx := b.Context()
		ob, relay := cycleRelay(b, db, store, topic)
		from := 0
		step := func() {
			b.StopTimer()
			if err := enqueue(ctx, db, ob, alignedMessages(topic, from, cycleKeys, cycleKeys)...); err != nil {
				b.Fatal(err)
			}
			from += cycleKeys
			b.StartTimer()
			if n, err := relay.PublishOnce(ctx); err != nil || n != cycleKeys {
				b.Fatalf("published %d, %v; want %d", n, err, cycleKeys)
			}
		}
		step() // the first cycle reads the shards' marks
		b.ResetTimer()
		for b.Loop() {
			step()
		}
	}
	for _, database := range cycleDatabases {
		b.Run(database.name, func(b *testing.B) {
			db, store, topic := database.open(b)
			run(b, db, store, topic)
		})
	}
}

// cycleDatabases are the servers the benchmarks here run on, each opened
// by its cyclePostgres-like helper.
var cycleDatabases = []struct {
	name string
	open func(testing.TB) (*gorm.DB, storage.OutboxStore, string)
}{{"postgres", cyclePostgres}, {"mariadb", cycleMariaDB}}

// BenchmarkEnqueueOne times one writer's transaction that enqueues one
// message (a key of 1,000, a 200-byte value) and commits, no relay running,
// on PostgreSQL and MariaDB: what the outbox adds to a producer's
// transaction, its round trips and the commit.
func BenchmarkEnqueueOne(b *testing.B) {
	for _, database := range cycleDatabases {
		b.Run(database.name, func(b *testing.B) {
			db, store, _ := database.open(b)
			ob := newOutbox(b, db, store, outbox.Config{})
			if err := ob.Migrate(b.Context()); err != nil {
				b.Fatal(err)
			}
			value := make([]byte, 200)
			i := 0
			for b.Loop() {
				i++
				if err := enqueue(b.Context(), db, ob, outbox.Message{Topic: "t", Key: []byte(strconv.Itoa(i % 1000)), Value: value}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
