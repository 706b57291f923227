package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/atonce"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// A deployment of a consumer group starts all its replicas at once, on a
// database that has none of the consumer's tables yet: each replica calls
// Inbox.Migrate and Consumer.Migrate (Offsets.Store) at the same instant,
// each on a connection pool and in a process of its own, then Run. Every
// Migrate must succeed, every round, and the group must apply every order
// once and store every partition's offset at its end.

const startupReplicas, startupPartitions, startupOrders = 4, 4, 8

// startupRounds is 20, or INBOX_STARTUP_ROUNDS.
func startupRounds(t *testing.T) int {
	if s := os.Getenv("INBOX_STARTUP_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("INBOX_STARTUP_ROUNDS=%q: want a positive number", s)
		}
		return n
	}
	return 20
}

// The replica's configuration, from the test that starts it.
const (
	startupDatabaseVar = "INBOX_TEST_STARTUP_DATABASE" // sqlite, postgres or mysql
	startupWhereVar    = "INBOX_TEST_STARTUP_WHERE"    // the SQLite file
	startupSuffixVar   = "INBOX_TEST_STARTUP_SUFFIX"   // of every table and of the group
	startupBrokersVar  = "INBOX_TEST_STARTUP_BROKERS"
)

// startupDialector opens each database as the adapters' users do.
func startupDialector(t testing.TB, name, where string) gorm.Dialector {
	t.Helper()
	switch name {
	case "sqlite":
		return inboxsqlite.Open(where)
	case "mysql":
		d, err := inboxmysql.Open(testservers.MySQLDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return postgres.Open(testservers.PostgresDSN(t))
}

func startupStore(t testing.TB, name, suffix string) storage.InboxStore {
	t.Helper()
	table := "inbox_startup_" + suffix
	var store storage.InboxStore
	var err error
	switch name {
	case "sqlite":
		store, err = inboxsqlite.New(inboxsqlite.Options{Table: table})
	case "postgres":
		store, err = inboxpg.New(inboxpg.Options{Table: table})
	case "mysql":
		store, err = inboxmysql.New(inboxmysql.Options{Table: table})
	}
	if err != nil {
		t.Fatal(err)
	}
	return store
}

func TestConsumersStartingAtTheSameInstant(t *testing.T) {
	rounds := startupRounds(t)
	brokers := newKfake(t, startupPartitions, "orders")
	msgs := make([]kafka.Message, startupOrders)
	for i := range msgs {
		msgs[i] = orderMessage(i, i%startupPartitions)
	}
	produce(t, brokers, "orders", msgs...)
	// The slowest first: go test runs as many parallel subtests at once as
	// the machine has cores, two on CI's.
	for _, name := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			// The databases in parallel: a round mostly waits, each
			// replica's Migrate for the one before it.
			t.Parallel()
			dir := t.TempDir()
			var took []time.Duration
			for round := range rounds {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				suffix := conformance.RandomSuffix()
				db, err := gorm.Open(startupDialector(t, name, where), &gorm.Config{Logger: logger.Discard})
				if err != nil {
					t.Fatal(err)
				}
				s := &shop{db: db, suffix: "_" + suffix}
				createShopTables(t, s)
				cleanupStartup(t, name, s, suffix)
				start := time.Now()
				err = atonce.Processes(t, startupReplicas, "TestStartupReplica",
					startupDatabaseVar+"="+name, startupWhereVar+"="+where, startupSuffixVar+"="+suffix,
					startupBrokersVar+"="+strings.Join(brokers, ","))
				took = append(took, time.Since(start))
				if err != nil {
					t.Fatalf("round %d: %d replicas started at once: %v", round+1, startupReplicas, err)
				}

				s.checkExactlyOnce(t, startupOrders, nil)
				st := groupOffsets{Table: "inbox_offsets_startup_" + suffix, Group: "startup-" + suffix}
				for p := range startupPartitions {
					next, err := st.Load(context.Background(), db, "orders", p)
					if err != nil || next != startupOrders/startupPartitions {
						t.Errorf("round %d: partition %d's stored offset %d (%v), want %d", round+1, p, next, err, startupOrders/startupPartitions)
					}
				}
				if t.Failed() {
					t.FailNow()
				}
			}
			t.Logf("%d rounds of %d replicas started at once, each round %v", rounds, startupReplicas, spreadOfRounds(took))
		})
	}
}

// createShopTables creates the shop's business tables (the application's
// own, made before the replicas start).
func createShopTables(t *testing.T, s *shop) {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE reservations` + s.suffix + ` (order_id VARCHAR(64) NOT NULL, sku VARCHAR(64) NOT NULL, qty INTEGER NOT NULL)`,
		`CREATE TABLE stock` + s.suffix + ` (sku VARCHAR(64) PRIMARY KEY, reserved INTEGER NOT NULL)`,
	} {
		if err := s.db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		if err := s.db.Exec(`INSERT INTO stock`+s.suffix+` (sku, reserved) VALUES (?, 0)`, "sku-"+strconv.Itoa(i)).Error; err != nil {
			t.Fatal(err)
		}
	}
}

// cleanupStartup drops a round's tables, those the replicas made too, and
// closes the pool, when the test ends.
func cleanupStartup(t *testing.T, name string, s *shop, suffix string) {
	t.Cleanup(func() {
		for _, table := range []string{"inbox_startup_" + suffix, "inbox_offsets_startup_" + suffix, "reservations" + s.suffix, "stock" + s.suffix} {
			q := `DROP TABLE IF EXISTS ` + table
			if name == "postgres" {
				q += ` CASCADE` // the inbox's partitions
			}
			if err := s.db.Exec(q).Error; err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
		closeDB(s.db)
	})
}

func spreadOfRounds(ds []time.Duration) string {
	lo, hi, sum := ds[0], ds[0], time.Duration(0)
	for _, d := range ds {
		lo, hi, sum = min(lo, d), max(hi, d), sum+d
	}
	return fmt.Sprintf("%v on average (%v..%v)", (sum / time.Duration(len(ds))).Round(time.Millisecond), lo.Round(time.Millisecond), hi.Round(time.Millisecond))
}

// TestStartupReplica is one replica of TestConsumersStartingAtTheSameInstant;
// it does nothing in a normal test run.
func TestStartupReplica(t *testing.T) {
	name := os.Getenv(startupDatabaseVar)
	if name == "" {
		t.Skip("only run as a process of TestConsumersStartingAtTheSameInstant")
	}
	suffix := os.Getenv(startupSuffixVar)
	db, err := gorm.Open(startupDialector(t, name, os.Getenv(startupWhereVar)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB(db)
	if err := db.Exec(`SELECT 1`).Error; err != nil {
		t.Fatal(err)
	}
	// One coming day to prepare, not a week: each round is a fresh table.
	ib, err := inbox.New(db, startupStore(t, name, suffix), inbox.Config{Logger: testLogger(t), RetentionDays: 30, PrepareDays: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := &shop{db: db, ib: ib, suffix: "_" + suffix}
	// Run maintains the inbox at once (the coming days' partitions), on
	// every replica at the same instant too; its first maintenance tells
	// that Run is under way.
	var maintMu sync.Mutex
	var maintErrs []error
	maintained := make(chan struct{})
	c, err := newConsumer(consumer.Config{
		Hooks: []hooks.Hook{hooks.EventFunc(func(e hooks.Event) {
			if e.Kind != hooks.Maintenance {
				return
			}
			maintMu.Lock()
			defer maintMu.Unlock()
			if e.Err != nil {
				maintErrs = append(maintErrs, e.Err)
			}
			select {
			case <-maintained:
			default:
				close(maintained)
			}
		})},
		Brokers: strings.Split(os.Getenv(startupBrokersVar), ","), GroupID: "startup-" + suffix, Topics: []string{"orders"},
		Inbox: ib, Consumer: "reserve-stock", Handler: s.reserve,
		Offsets: consumer.OffsetsConfig{
			Store: true,
			Table: "inbox_offsets_startup_" + suffix,
		},
		Failure: consumer.FailureConfig{
			MinBackoff: 10 * time.Millisecond,
			MaxBackoff: 100 * time.Millisecond,
		}, Kafka: consumer.KafkaConfig{
			MaxWait:           100 * time.Millisecond,
			SessionTimeout:    2 * time.Second,
			HeartbeatInterval: 200 * time.Millisecond,
			RebalanceTimeout:  2 * time.Second,
		},
		Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	atonce.Ready()
	if err := ib.Migrate(ctx); err != nil {
		t.Fatalf("Inbox.Migrate: %v", err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatalf("Consumer.Migrate: %v", err)
	}
	// Stopped by its context, not Close: the other replicas may apply every
	// order before this one's Run has begun, and a Close before Run makes
	// Run refuse to start (consumer.ErrRunning).
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	// The group's work is done once every order is applied, whichever
	// replica applied it; this replica's once its Run maintained the inbox
	// (the others may have applied every order before it got so far).
	deadline := time.Now().Add(60 * time.Second)
	select {
	case <-maintained:
	case err := <-done:
		t.Fatalf("Run returned at once: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not maintain the inbox within 60s")
	}
	for {
		var n int64
		if err := db.Raw(`SELECT COUNT(*) FROM reservations` + s.suffix).Scan(&n).Error; err == nil && n >= startupOrders {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the group applied fewer than %d orders within 60s", startupOrders)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned before the orders were applied: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of Close")
	}
	maintMu.Lock()
	defer maintMu.Unlock()
	for _, err := range maintErrs {
		t.Errorf("the inbox's maintenance at the start of Run failed: %v", err)
	}
}
