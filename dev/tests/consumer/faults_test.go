package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/dev/faulttest"
	"github.com/inboxgo/inbox/inbox"
)

// classifyingOffsetStore is a faulttest.ClassifyingStore that keeps the
// stored offsets of the store it wraps.
type classifyingOffsetStore struct {
	faulttest.ClassifyingStore
	storage.OffsetStore
}

// newFaultShop is a SQLite shop whose inbox classifies errors with
// transient and retries quickly, with a table that has a deferred foreign
// key (checked only at COMMIT).
func newFaultShop(t *testing.T, transient func(error) bool, cfg inbox.Config) *shop {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "shop.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	base, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The adapter's stored offsets passed on, as a wrapper must for
	// Offsets.Store.
	s := setupShop(t, db, classifyingOffsetStore{faulttest.ClassifyingStore{InboxStore: base, Transient: transient}, base}, "")
	cfg.Logger = testLogger(t)
	cfg.RetentionDays = max(cfg.RetentionDays, 30)
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 5*time.Millisecond
	if s.ib, err = inbox.New(db, s.ib.Store(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, ddl := range []string{
		`CREATE TABLE parents (id TEXT PRIMARY KEY)`,
		`CREATE TABLE children (id TEXT PRIMARY KEY, parent_id TEXT REFERENCES parents(id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if err := db.Exec(ddl).Error; err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr + "/stock"
}

// TestHandlerFaultsReachTheFailurePolicy: errors a handler produces by
// itself (an HTTP call's network error, plain or marked retryable, the EOF
// of an empty JSON payload, a panic, a deferred constraint refused at
// COMMIT) are the message's failures: each poison message is dead-lettered
// after exactly MaxAttempts, in batches, and the healthy ones commit once.
func TestHandlerFaultsReachTheFailurePolicy(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newFaultShop(t, faulttest.PostgresLike, inbox.Config{MaxAttempts: 3})
	url := closedPortURL(t)
	poisons := map[string]func(ctx context.Context, tx *gorm.DB) error{
		"order-1": func(ctx context.Context, _ *gorm.DB) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			_, err := http.DefaultClient.Do(req)
			return err
		},
		"order-3": func(ctx context.Context, _ *gorm.DB) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			_, err := http.DefaultClient.Do(req)
			return inbox.Retryable(err)
		},
		"order-4": func(context.Context, *gorm.DB) error {
			var o order
			return json.NewDecoder(strings.NewReader("")).Decode(&o)
		},
		"order-6": func(context.Context, *gorm.DB) error { panic("stock service returned garbage") },
		"order-8": func(_ context.Context, tx *gorm.DB) error {
			return tx.Exec(`INSERT INTO children (id, parent_id) VALUES ('c8', 'no-such-parent')`).Error
		},
	}
	sendOrders(t, brokers, "orders", 1, 10, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 3
	cfg.BatchSize, cfg.BatchWait = 4, 200*time.Millisecond
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if err := s.reserve(ctx, tx, msg); err != nil {
			return err
		}
		if p := poisons[string(msg.Key)]; p != nil {
			if err := p(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	}
	r := start(t, cfg)
	waitUntil(t, 60*time.Second, "5 processed and 5 dead letters", func() bool {
		return ev.count(hooks.Processed) == 5 && ev.count(hooks.DeadLettered) == 5
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 10, map[int]bool{1: true, 3: true, 4: true, 6: true, 8: true})
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 10 {
		t.Errorf("committed %v, want 10", got)
	}
	for _, dl := range readAll(t, brokers, "orders.dlq", 1, 5) {
		h := map[string]string{}
		for _, x := range dl.Headers {
			h[x.Key] = string(x.Value)
		}
		key := string(dl.Key)
		if poisons[key] == nil {
			t.Errorf("healthy %s dead-lettered: %v", key, h[header.DLQError])
		}
		if h[header.DLQAttempts] != "3" || h[header.DLQReason] != consumer.ReasonHandlerError {
			t.Errorf("%s: dead-lettered after %s attempts (%s), want 3 (%s): %s", key, h[header.DLQAttempts], h[header.DLQReason], consumer.ReasonHandlerError, h[header.DLQError])
		}
		if stack := h[header.DLQPanicStack]; (key == "order-6") != strings.Contains(stack, "faults_test.go") {
			t.Errorf("%s: panic stack header %.200q", key, stack)
		}
	}
}

// TestNaturallyIdempotentRetriesAFailingDatabase: without an inbox, a
// statement failing with an error the Classifier calls transient (here a
// stand-in for a deadlock or SQLITE_BUSY) is the database's failure: it is
// retried without using up the message's attempts.
func TestNaturallyIdempotentRetriesAFailingDatabase(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newFaultShop(t, faulttest.NoSuchTable, inbox.Config{})
	if err := s.db.AutoMigrate(&orderStatus{}); err != nil {
		t.Fatal(err)
	}
	sendOrders(t, brokers, "orders", 1, 1, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "order-view", s, ev)
	cfg.Inbox, cfg.Consumer, cfg.DB, cfg.Classifier = nil, "", s.db, s.ib.Store()
	cfg.NaturallyIdempotent, cfg.Failure.MaxAttempts = true, 2
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic = consumer.DeadLetter, "orders.dlq"
	var mu sync.Mutex
	calls := 0
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n <= 5 {
			return tx.Exec(`UPDATE stock_moved_away SET reserved = 0`).Error
		}
		return tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(&orderStatus{OrderID: string(msg.Key)}).Error
	}
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "the message processed or dead-lettered", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if ev.count(hooks.Processed) != 1 || calls != 6 {
		t.Fatalf("processed %d, dead-lettered %d after %d calls; want processed after 6", ev.count(hooks.Processed), ev.count(hooks.DeadLettered), calls)
	}
}

// TestStoredOffsetNeverPassesAMessageExpiredMidBatch: a message dated on the
// oldest retained day, in a batch, while midnight UTC passes. Its fate is
// decided once per attempt, from one clock reading, and the offset stored in
// the database never passes it unless it was processed.
func TestStoredOffsetNeverPassesAMessageExpiredMidBatch(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	readings := 0
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		readings++
		if readings <= 3 {
			return day.Add(24*time.Hour - time.Second)
		}
		return day.Add(24 * time.Hour)
	}
	brokers := newKfake(t, 1, "orders")
	s := newFaultShop(t, faulttest.PostgresLike, inbox.Config{Now: clock})
	s.ib, _ = inbox.New(s.db, s.ib.Store(), inbox.Config{Now: clock, RetentionDays: 1, Logger: testLogger(t)})
	var msgs []kafka.Message
	for i, at := range []time.Time{day.Add(time.Hour), day.AddDate(0, 0, -1).Add(time.Hour), day.Add(2 * time.Hour)} {
		m := orderMessage(i, 0)
		m.Headers[1].Value = []byte(at.Format(time.RFC3339Nano))
		msgs = append(msgs, m)
	}
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.BatchSize, cfg.BatchWait, cfg.Failure.MaxAttempts, cfg.Offsets.Store = 3, time.Second, 2, true
	cfg.MaintenanceInterval = -1 // maintenance reads the clock too
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "the batch decided", func() bool {
		return ev.count(hooks.Processed) == 3 || ev.count(hooks.PartitionStopped) == 1
	})
	_ = r.stop(t)
	stored, err := r.offsets().Load(context.Background(), s.db, "orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.counts(t)["order-1"] == 0 && stored > 1 {
		t.Fatalf("stored offset %d passes offset 1, which was neither processed nor dead-lettered", stored)
	}
	if ev.count(hooks.Processed) != 3 || stored != 3 {
		t.Fatalf("%d processed, stored offset %d; want all 3 admitted from the one clock reading, offset 3", ev.count(hooks.Processed), stored)
	}
}

// reserveBatch is the inventory handler, set-based: one INSERT for all
// reservations, one UPDATE per SKU with the batch's total.
func (s *shop) reserveBatch(ctx context.Context, tx *gorm.DB, msgs []consumer.Message) error {
	var rows []string
	var args []any
	total := map[string]int{}
	var skus []string
	for _, m := range msgs {
		var o order
		if err := json.Unmarshal(m.Value, &o); err != nil {
			return fmt.Errorf("bad OrderCreated payload at offset %d: %w", m.Offset, err)
		}
		rows = append(rows, "(?, ?, ?)")
		args = append(args, o.OrderID, o.SKU, o.Qty)
		if _, ok := total[o.SKU]; !ok {
			skus = append(skus, o.SKU)
		}
		total[o.SKU] += o.Qty
	}
	if err := tx.Exec(`INSERT INTO reservations`+s.suffix+` (order_id, sku, qty) VALUES `+strings.Join(rows, ", "), args...).Error; err != nil {
		return err
	}
	slices.Sort(skus) // a fixed lock order
	for _, sku := range skus {
		if err := tx.Exec(`UPDATE stock`+s.suffix+` SET reserved = reserved + ? WHERE sku = ?`, total[sku], sku).Error; err != nil {
			return err
		}
	}
	return nil
}

// TestBatchHandler: a set-based batch handler gets each new message once,
// duplicates left out; a poison message in a batch is found by splitting
// and dead-lettered after MaxAttempts; the rest commit exactly once.
func TestBatchHandler(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders", "orders.dlq")
	s := newFaultShop(t, faulttest.PostgresLike, inbox.Config{MaxAttempts: 1})
	var msgs []kafka.Message
	for i := range 40 {
		msgs = append(msgs, orderMessage(i, i%2))
	}
	msgs[13].Value = []byte(`{"order_id":`)                                          // truncated: the decoder's io.ErrUnexpectedEOF
	msgs = append(msgs, orderMessage(4, 0), orderMessage(7, 1), orderMessage(20, 0)) // a producer's retries
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Handler, cfg.BatchHandler = nil, s.reserveBatch
	cfg.BatchSize, cfg.BatchWait, cfg.Failure.MaxAttempts = 10, 100*time.Millisecond, 2
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic = consumer.DeadLetter, "orders.dlq"
	r := start(t, cfg)
	waitUntil(t, 60*time.Second, "39 processed, 3 duplicates, 1 dead letter", func() bool {
		return ev.count(hooks.Processed) == 39 && ev.count(hooks.Duplicate) == 3 && ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 40, map[int]bool{13: true})
	dl := readAll(t, brokers, "orders.dlq", 1, 1)[0] // the Hash balancer puts order-13 on partition 0
	attempts := ""
	for _, h := range dl.Headers {
		if h.Key == header.DLQAttempts {
			attempts = string(h.Value)
		}
	}
	if string(dl.Key) != "order-13" || attempts != "2" {
		t.Errorf("dead letter %s after %q attempts, want order-13 after 2", dl.Key, attempts)
	}
	if got := committed(t, brokers, "inventory", "orders", 2); got[0]+got[1] != int64(len(msgs)) {
		t.Errorf("committed %v, want %d in all", got, len(msgs))
	}
}

// TestNaturallyIdempotentBatchHandler: without an inbox a BatchHandler runs
// a batch in one transaction; a batch with a poison message falls back to
// one message per transaction, so only the poison is dead-lettered.
func TestNaturallyIdempotentBatchHandler(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newFaultShop(t, faulttest.PostgresLike, inbox.Config{})
	if err := s.db.AutoMigrate(&orderStatus{}); err != nil {
		t.Fatal(err)
	}
	sendOrders(t, brokers, "orders", 1, 20, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "order-view", s, ev)
	cfg.Inbox, cfg.Consumer, cfg.DB, cfg.Classifier = nil, "", s.db, s.ib.Store()
	cfg.NaturallyIdempotent, cfg.Failure.MaxAttempts, cfg.Offsets.Store = true, 2, true
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic = consumer.DeadLetter, "orders.dlq"
	cfg.BatchSize, cfg.BatchWait = 10, 200*time.Millisecond
	var mu sync.Mutex
	sizes := map[int]int{}
	cfg.Handler, cfg.BatchHandler = nil, func(ctx context.Context, tx *gorm.DB, msgs []consumer.Message) error {
		mu.Lock()
		sizes[len(msgs)]++
		mu.Unlock()
		rows := make([]orderStatus, len(msgs))
		for i, m := range msgs {
			if string(m.Key) == "order-7" {
				return errors.New("order-7 cannot be shown")
			}
			rows[i] = orderStatus{OrderID: string(m.Key)}
		}
		return tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(&rows).Error
	}
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "19 processed and 1 dead letter", func() bool {
		return ev.count(hooks.Processed) == 19 && ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := s.db.Model(&orderStatus{}).Count(&n).Error; err != nil || n != 19 {
		t.Errorf("%d order states (%v), want 19", n, err)
	}
	if sizes[10] == 0 {
		t.Errorf("no batch of 10 was handled in one call: %v", sizes)
	}
	if stored, err := r.offsets().Load(context.Background(), s.db, "orders", 0); err != nil || stored != 20 {
		t.Errorf("stored offset %d (%v), want 20", stored, err)
	}
}

// failingMaintainStore fails every Maintain.
type failingMaintainStore struct{ storage.InboxStore }

var errMaintain = errors.New("maintenance refused")

func (failingMaintainStore) Maintain(context.Context, *gorm.DB, storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	return storage.MaintenanceReport{}, errMaintain
}

// TestRunMaintainsTheInbox: Run maintains the inbox at start and every
// MaintenanceInterval, and reports a failure through the event hook; a
// negative interval turns it off.
func TestRunMaintainsTheInbox(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	for _, c := range []struct {
		name     string
		interval time.Duration
		failing  bool
	}{{"default", 0, false}, {"every-50ms", 50 * time.Millisecond, false}, {"failing", 50 * time.Millisecond, true}, {"off", -1, false}} {
		t.Run(c.name, func(t *testing.T) {
			s := newSQLiteShop(t)
			if c.failing {
				ib, err := inbox.New(s.db, failingMaintainStore{s.ib.Store()}, inbox.Config{Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				s.ib = ib
			}
			ev := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory-"+c.name, s, ev)
			cfg.MaintenanceInterval = c.interval
			r := start(t, cfg)
			if c.interval > 0 {
				waitUntil(t, 10*time.Second, "three maintenance runs", func() bool { return ev.count(hooks.Maintenance) >= 3 })
			} else {
				time.Sleep(300 * time.Millisecond) // long enough for a run at start, far shorter than the default interval
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			runs := ev.filter(hooks.Maintenance)
			switch {
			case c.name == "off" && len(runs) != 0:
				t.Errorf("%d maintenance runs with maintenance off", len(runs))
			case c.name == "default" && len(runs) != 1:
				t.Errorf("%d maintenance runs, want 1 (at start; the next after an hour)", len(runs))
			}
			for _, e := range runs {
				if c.failing != errors.Is(e.Err, errMaintain) {
					t.Errorf("maintenance event error %v (failing store: %v)", e.Err, c.failing)
				}
			}
		})
	}
}
