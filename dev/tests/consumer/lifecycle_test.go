package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/inboxgo/inbox/inbox"
)

// An unreachable broker is transient: Run keeps trying until its context
// ends, and then returns the context's error.
func TestRunKeepsRetryingAnUnreachableBroker(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	s := newSQLiteShop(t)
	ev := newEvents()
	cfg := baseConfig(t, []string{addr}, "orders", "inventory", s, ev)
	cfg.Logger = testLogger(t)
	c, err := newConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Run gave up on an unreachable broker: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	if err := c.Run(ctx); !errors.Is(err, consumer.ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCloseBeforeRun(t *testing.T) {
	s := newSQLiteShop(t)
	c, err := newConsumer(baseConfig(t, []string{"127.0.0.1:1"}, "orders", "g", s, newEvents()))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, consumer.ErrRunning) {
		t.Fatalf("Run after Close = %v, want ErrRunning", err)
	}
}

// orderStatus is the read model of a naturally idempotent consumer: the
// latest known state of each order, set (not incremented) by every delivery.
type orderStatus struct {
	OrderID string `gorm:"primaryKey;size:64"`
	SKU     string `gorm:"size:64"`
	Qty     int
}

// A naturally idempotent handler (an upsert) needs no inbox row: every
// delivery runs it, and running it twice changes nothing.
func TestNaturallyIdempotentHandler(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders")
	s := newSQLiteShop(t)
	if err := s.db.AutoMigrate(&orderStatus{}); err != nil {
		t.Fatal(err)
	}
	sendOrders(t, brokers, "orders", 2, 10, []int{1, 2, 3})
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Inbox, cfg.Consumer, cfg.DB, cfg.Classifier = nil, "", s.db, s.ib.Store()
	cfg.NaturallyIdempotent, cfg.Offsets.Store = true, true
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		var o order
		if err := json.Unmarshal(msg.Value, &o); err != nil {
			return err
		}
		return tx.Clauses(clause.OnConflict{UpdateAll: true}).
			Create(&orderStatus{OrderID: o.OrderID, SKU: o.SKU, Qty: o.Qty}).Error
	}
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "13 deliveries", func() bool { return ev.count(hooks.Processed) == 13 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := s.db.Model(&orderStatus{}).Count(&n).Error; err != nil || n != 10 {
		t.Fatalf("%d order states (%v), want 10", n, err)
	}
	if ev.count(hooks.Duplicate) != 0 {
		t.Fatal("a consumer without inbox reported duplicates")
	}
	for p, want := range map[int]int64{0: 6, 1: 7} {
		got, err := r.offsets().Load(context.Background(), s.db, "orders", p)
		if err != nil || got != want {
			t.Errorf("stored offset of partition %d = %d (%v), want %d", p, got, err, want)
		}
	}
}

// The broker goes away and comes back (here: a new cluster on the same
// port): Run rides it out and consumes what is produced afterwards.
func TestRunSurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	newCluster := func() *kfake.Cluster {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(1, "orders"),
			kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cluster := newCluster()
	brokers := cluster.ListenAddrs()
	s := newSQLiteShop(t)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	r := start(t, cfg)
	produce(t, brokers, "orders", orderMessage(0, 0), orderMessage(1, 0))
	waitUntil(t, 20*time.Second, "the first two orders", func() bool { return len(s.counts(t)) == 2 })

	cluster.Close()
	time.Sleep(time.Second)
	cluster = newCluster()
	defer cluster.Close()
	// The new cluster has lost the log: the orders start at offset 0 again.
	produce(t, brokers, "orders", orderMessage(0, 0), orderMessage(1, 0), orderMessage(2, 0), orderMessage(3, 0))
	waitUntil(t, 40*time.Second, "the orders sent after the restart", func() bool { return len(s.counts(t)) == 4 })
	select {
	case err := <-r.done:
		t.Fatalf("Run returned during the outage: %v", err)
	default:
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 4, nil)
}

// A session timeout below the broker's minimum is a configuration error:
// Run stops and says so instead of retrying forever.
func TestRunStopsOnARejectedConfiguration(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	cfg := baseConfig(t, brokers, "orders", "inventory", s, newEvents())
	cfg.Kafka.SessionTimeout = 100 * time.Millisecond // kfake's minimum here is 1s
	// Below the session timeout, so that the broker refuses it (franz-go
	// would refuse its default 3 s interval before asking).
	cfg.Kafka.HeartbeatInterval = 30 * time.Millisecond
	c, err := newConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err := <-done:
		// The broker's error code, as the client in use spells it.
		if !errors.Is(err, inbox.ErrInvalidConfig) || !errors.Is(err, kafka.InvalidSessionTimeout) && !errors.Is(err, kerr.InvalidSessionTimeout) {
			t.Fatalf("Run = %v, want an invalid configuration (session timeout)", err)
		}
	case <-time.After(20 * time.Second):
		c.Close()
		t.Fatal("Run kept retrying a configuration the broker rejects")
	}
}
