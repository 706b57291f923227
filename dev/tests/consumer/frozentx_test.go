package consumer_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// memberPool opens s's tables again through a connection pool and an inbox
// of its own, as another process would, with the inbox logging to log. With
// idleEnds, its sessions on the servers end a transaction left idle for 4 s
// (PostgreSQL idle_in_transaction_session_timeout, MariaDB
// idle_write_transaction_timeout): longer than the coordinator takes to
// drop a frozen member (its 2 s session timeout), so that the new owner
// meets the open transaction. SQLite has no such setting.
func memberPool(t *testing.T, name string, s *shop, log *slog.Logger, idleEnds bool) *shop {
	t.Helper()
	var d gorm.Dialector
	var store storage.InboxStore
	var err error
	switch name {
	case "sqlite":
		var file string
		if err := s.db.Raw(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file).Error; err != nil {
			t.Fatal(err)
		}
		d = inboxsqlite.Open(file)
		store, err = inboxsqlite.New(inboxsqlite.Options{})
	case "postgres":
		dsn := testservers.PostgresDSN(t)
		if idleEnds {
			dsn += " idle_in_transaction_session_timeout=4000"
		}
		d = postgres.Open(dsn)
		store, err = inboxpg.New(inboxpg.Options{Table: "inbox_e2e" + s.suffix})
	case "mysql":
		dsn := testservers.MySQLDSN(t)
		if idleEnds {
			dsn += "&idle_write_transaction_timeout=4"
		}
		if d, err = inboxmysql.Open(dsn); err != nil {
			t.Fatal(err)
		}
		store, err = inboxmysql.New(inboxmysql.Options{Table: "inbox_e2e" + s.suffix})
	}
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	ib, err := inbox.New(db, store, inbox.Config{Logger: log, RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	return &shop{db: db, ib: ib, suffix: s.suffix}
}

// A member frozen in the middle of a transaction (its handler ran, the
// transaction is open) loses its partition. The new owner waits on the
// frozen transaction's locks until the database ends it (PostgreSQL and
// MariaDB, with the idle-transaction timeouts set) or, on SQLite, whose
// one write lock the frozen transaction holds, until the member resumes.
// Either way the stored offset never goes back, the owner logs no error,
// every order is applied once, and the resumed member gives the partition
// up.
func TestMemberFrozenInsideItsTransaction(t *testing.T) {
	t.Parallel()
	for name, open := range shopsOnEachDatabase {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testMemberFrozenInsideItsTransaction(t, name, open(t))
		})
	}
}

func testMemberFrozenInsideItsTransaction(t *testing.T, name string, s *shop) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	gate := newHeartbeatGate(cluster, "zombie")
	brokers := cluster.ListenAddrs()
	sendOrders(t, brokers, "orders", 1, 10, nil)
	table := "inbox_offsets" + s.suffix
	st := groupOffsets{Table: table, Group: "inventory"}

	// The member to be frozen applies orders 0-4, and order 5 up to its
	// COMMIT, where it stops, its transaction open.
	zev, zrec := newEvents(), newRecorder(t)
	zs := memberPool(t, name, s, slog.New(zrec), true)
	zcfg := baseConfig(t, brokers, "orders", "inventory", zs, zev)
	zcfg.Offsets.Store, zcfg.Offsets.Table = true, table
	zcfg.Kafka.SessionTimeout, zcfg.Kafka.HeartbeatInterval = 2*time.Second, 200*time.Millisecond
	zcfg.Kafka.Dialer = &kafka.Dialer{ClientID: "zombie", Timeout: 10 * time.Second, DualStack: true}
	zcfg.Logger = slog.New(zrec)
	frozen, thaw := make(chan struct{}), make(chan struct{})
	var frozenOnce atomic.Bool
	var thawOnce sync.Once
	thawZombie := func() { thawOnce.Do(func() { close(thaw) }) }
	zcfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if err := zs.reserve(ctx, tx, msg); err != nil {
			return err
		}
		if string(msg.Key) == "order-5" && frozenOnce.CompareAndSwap(false, true) {
			gate.close()
			close(frozen)
			<-thaw
		}
		return nil
	}
	z := start(t, zcfg)
	t.Cleanup(thawZombie)
	select {
	case <-frozen:
	case <-time.After(30 * time.Second):
		t.Fatal("the member did not reach order 5")
	}
	watch := watchStoredOffset(t, s, st, "orders", 0)
	waitMemberDropped(t, cluster, "inventory", "zombie-", "the frozen member")

	oev, orec := newEvents(), newRecorder(t)
	ocfg := baseConfig(t, brokers, "orders", "inventory", memberPool(t, name, s, slog.New(orec), false), oev)
	ocfg.Offsets.Store, ocfg.Offsets.Table = true, table
	ocfg.Logger = slog.New(orec)
	o := start(t, ocfg)
	tookOver := time.Now()
	if name == "sqlite" {
		// The frozen transaction holds SQLite's write lock: the owner waits
		// until the member resumes.
		time.Sleep(2 * time.Second)
		thawZombie()
	}
	waitUntil(t, 30*time.Second, "the new owner to apply orders 5-9", func() bool {
		next, err := st.Load(context.Background(), s.db, "orders", 0)
		return err == nil && next == 10
	})
	t.Logf("the owner reached offset 10 %v after it started", time.Since(tookOver).Round(10*time.Millisecond))
	thawZombie()
	waitUntil(t, 20*time.Second, "the resumed member to give the partition up", func() bool {
		_, gaveUp := lostItsPartition(zrec)
		return gaveUp
	})
	time.Sleep(300 * time.Millisecond)
	gate.open()

	produce(t, brokers, "orders", orderMessage(10, 0), orderMessage(11, 0), orderMessage(12, 0))
	waitUntil(t, 30*time.Second, "orders 10-12", func() bool { return len(s.counts(t)) == 13 })
	waitUntil(t, 30*time.Second, "the stored offset 13", func() bool {
		next, err := st.Load(context.Background(), s.db, "orders", 0)
		return err == nil && next == 13
	})
	time.Sleep(300 * time.Millisecond)
	watch.end()
	if err := z.stop(t); err != nil {
		t.Errorf("the resumed member's Run: %v", err)
	}
	if err := o.stop(t); err != nil {
		t.Errorf("the owner's Run: %v", err)
	}
	if back := watch.wentBack(); back >= 0 {
		t.Errorf("the stored offset went back to %d", back)
	}
	if errs := orec.errorMessages(); len(errs) > 0 {
		t.Errorf("the owner logged errors: %q", errs)
	}
	if n := oev.count(hooks.Repositioned) + zev.count(hooks.Repositioned); n != 0 {
		t.Errorf("%d repositionings", n)
	}
	for _, m := range zrec.errorMessages() {
		// On the servers, the one transaction whose session the database
		// ended: the inbox's "message failed", as for any lost connection.
		t.Logf("the resumed member logged at Error: %s", m)
	}
	s.checkExactlyOnce(t, 13, nil)
}
