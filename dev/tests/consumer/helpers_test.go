package consumer_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/testtransport"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/storage"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
)

// newKfake starts an in-process Kafka cluster with the topics created.
func newKfake(t *testing.T, partitions int32, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topics...),
		kfake.GroupMinSessionTimeout(time.Second),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("INBOX_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// order is the test payload: an OrderCreated event.
type order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

// orderMessage is the OrderCreated event of order n, with its event id and
// time in headers; partition is honoured by partitionBalancer.
func orderMessage(n, partition int) kafka.Message {
	// The SKU follows the partition: concurrent batches of different
	// partitions then never update the same stock rows in different orders
	// (which deadlocks, and costs the 1 s deadlock_timeout of PostgreSQL).
	o := order{OrderID: "order-" + strconv.Itoa(n), SKU: "sku-" + strconv.Itoa(partition%7), Qty: 1 + n%3}
	v, _ := json.Marshal(o)
	at := eventBase.Add(time.Duration(n) * time.Second)
	return kafka.Message{
		Partition: partition,
		Key:       []byte(o.OrderID),
		Value:     v,
		Headers: []kafka.Header{
			{Key: header.EventID, Value: []byte("evt-" + o.OrderID)},
			{Key: header.EventTime, Value: []byte(at.Format(time.RFC3339Nano))},
		},
	}
}

// eventBase is the time of order 0: recent, so that the events are inside the
// inbox's retention window, and fixed for the test binary, so that a
// producer's duplicate carries the same time.
var eventBase = time.Now().UTC().Add(-time.Hour).Truncate(time.Hour)

type partitionBalancer struct{}

func (partitionBalancer) Balance(m kafka.Message, partitions ...int) int { return m.Partition }

// produce writes msgs to topic, retrying while the topic is not known yet.
func produce(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     partitionBalancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := w.WriteMessages(ctx, msgs...)
		if err == nil {
			return
		}
		if ctx.Err() != nil || !errors.Is(err, kafka.UnknownTopicOrPartition) && !errors.Is(err, kafka.LeaderNotAvailable) {
			t.Fatalf("produce to %s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readAll reads n messages of every partition of topic from the start.
func readAll(t *testing.T, brokers []string, topic string, partitions, n int) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []kafka.Message
	for p := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		for {
			fctx, fcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			m, err := r.FetchMessage(fctx)
			fcancel()
			if err != nil {
				break
			}
			out = append(out, m)
		}
		r.Close()
	}
	if len(out) != n {
		t.Fatalf("read %d messages from %s, want %d", len(out), topic, n)
	}
	return out
}

// shop is the inventory service's database: the reservations the handler
// makes, one row per application of an OrderCreated, so that a double
// application shows as two rows.
type shop struct {
	db     *gorm.DB
	ib     *inbox.Inbox
	suffix string
	// inboxTable is the inbox table's name, if not the SQLite adapter's
	// default.
	inboxTable string
}

func newSQLiteShop(t *testing.T) *shop {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shop.db")
	db, err := gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return setupShop(t, db, store, "")
}

// setupShop migrates the inbox and creates the shop's tables (suffixed, so
// that backends shared between tests do not collide).
func setupShop(t *testing.T, db *gorm.DB, store storage.InboxStore, suffix string) *shop {
	t.Helper()
	ctx := context.Background()
	ib, err := inbox.New(db, store, inbox.Config{Logger: testLogger(t), RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE reservations` + suffix + ` (order_id VARCHAR(64) NOT NULL, sku VARCHAR(64) NOT NULL, qty INTEGER NOT NULL)`,
		`CREATE TABLE stock` + suffix + ` (sku VARCHAR(64) PRIMARY KEY, reserved INTEGER NOT NULL)`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		if err := db.Exec(`INSERT INTO stock`+suffix+` (sku, reserved) VALUES (?, 0)`, "sku-"+strconv.Itoa(i)).Error; err != nil {
			t.Fatal(err)
		}
	}
	return &shop{db: db, ib: ib, suffix: suffix}
}

// reserve is the inventory handler: an increment, idempotent only through
// the inbox.
func (s *shop) reserve(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
	var o order
	if err := json.Unmarshal(msg.Value, &o); err != nil {
		return fmt.Errorf("bad OrderCreated payload: %w", err)
	}
	if err := tx.Exec(`INSERT INTO reservations`+s.suffix+` (order_id, sku, qty) VALUES (?, ?, ?)`, o.OrderID, o.SKU, o.Qty).Error; err != nil {
		return err
	}
	return tx.Exec(`UPDATE stock`+s.suffix+` SET reserved = reserved + ? WHERE sku = ?`, o.Qty, o.SKU).Error
}

// failingOnce is the reserve handler, but for the first attempt at the
// order with key, which fails as a brief outage of a service would.
func (s *shop) failingOnce(key string) consumer.Handler {
	var failed atomic.Bool
	return func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == key && !failed.Swap(true) {
			return errors.New("stock service briefly unavailable")
		}
		return s.reserve(ctx, tx, msg)
	}
}

// checkStoredAtGroup asserts that partition 0 of orders is committed by
// the inventory group and stored in s at next.
func (s *shop) checkStoredAtGroup(t *testing.T, brokers []string, next int64) {
	t.Helper()
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != next {
		t.Errorf("the group committed %v, want %d", got, next)
	}
	if got := storedOffset(t, s, "inventory", "orders", 0); got != next {
		t.Errorf("stored offset %d, want %d, the group's", got, next)
	}
}

// counts returns the reservations per order.
func (s *shop) counts(t *testing.T) map[string]int {
	t.Helper()
	var rows []struct {
		OrderID string
		N       int
	}
	if err := s.db.Raw(`SELECT order_id, COUNT(*) AS n FROM reservations` + s.suffix + ` GROUP BY order_id`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int, len(rows))
	for _, r := range rows {
		out[r.OrderID] = r.N
	}
	return out
}

// checkExactlyOnce asserts that orders 0..n-1 are each reserved once, and
// that the stock totals agree.
func (s *shop) checkExactlyOnce(t *testing.T, n int, skip map[int]bool) {
	t.Helper()
	counts := s.counts(t)
	want, wantQty := 0, 0
	for i := range n {
		if skip[i] {
			continue
		}
		want++
		wantQty += 1 + i%3
		if c := counts["order-"+strconv.Itoa(i)]; c != 1 {
			t.Errorf("order-%d reserved %d times, want 1", i, c)
		}
	}
	if len(counts) != want {
		t.Errorf("%d orders reserved, want %d", len(counts), want)
	}
	var total int
	if err := s.db.Raw(`SELECT COALESCE(SUM(reserved), 0) FROM stock` + s.suffix).Scan(&total).Error; err != nil {
		t.Fatal(err)
	}
	if total != wantQty {
		t.Errorf("stock reserved %d in all, want %d", total, wantQty)
	}
}

// events counts a consumer's events by kind.
type events struct {
	mu   sync.Mutex
	byK  map[hooks.Kind]int
	all  []hooks.Event
	hook atomic.Pointer[func(hooks.Event)]
}

func newEvents() *events { return &events{byK: make(map[hooks.Kind]int)} }

func (e *events) on(ev hooks.Event) {
	e.mu.Lock()
	e.byK[ev.Kind]++
	e.all = append(e.all, ev)
	e.mu.Unlock()
	if h := e.hook.Load(); h != nil {
		(*h)(ev)
	}
}

func (e *events) count(k hooks.Kind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byK[k]
}

func (e *events) filter(k hooks.Kind) []hooks.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []hooks.Event
	for _, ev := range e.all {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// running is a consumer whose Run is in a goroutine.
type running struct {
	c    *consumer.Consumer
	cfg  consumer.Config
	done chan error
}

// offsets is the table of stored offsets r uses.
func (r *running) offsets() groupOffsets {
	return groupOffsets{Table: cmp.Or(r.cfg.Offsets.Table, consumer.DefaultOffsetsTable), Group: r.cfg.GroupID}
}

// newConsumer is consumer.New on the Kafka client testtransport.Var names
// (kafka-go unless cfg has a Transport or the variable says franz-go).
func newConsumer(cfg consumer.Config) (*consumer.Consumer, error) {
	if err := testtransport.Apply(&cfg); err != nil {
		return nil, err
	}
	return consumer.New(cfg)
}

func start(t *testing.T, cfg consumer.Config) *running {
	t.Helper()
	return startWith(t, cfg, nil)
}

// startWith is start with the tests' knobs (nil for none) in Run's context.
func startWith(t *testing.T, cfg consumer.Config, knobs *testhooks.Knobs) *running {
	t.Helper()
	c, err := newConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := &running{c: c, cfg: cfg, done: make(chan error, 1)}
	ctx := context.Background()
	if knobs != nil {
		ctx = testhooks.With(ctx, knobs)
	}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Close() })
	return r
}

// stop closes the consumer and returns Run's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	go r.c.Close()
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of Close")
		return nil
	}
}

// waitUntil polls cond every 50ms until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// committed returns the group's committed offsets of topic's partitions.
func committed(t *testing.T, brokers []string, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	resp, err := cl.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	out := make(map[int]int64)
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatal(p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}
