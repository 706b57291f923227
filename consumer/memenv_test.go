package consumer

// The harness of the package's own consumer tests: an in-memory cluster
// (package memtransport, its client wrapped in a spy, memspy_test.go), a
// SQLite database in a temporary file with the
// inbox and an effects table, and the hooks' events and the log lines
// recorded for the assertions.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/sqlitetest"
	"github.com/inboxgo/inbox/transport/memtransport"
)

type memEnv struct {
	t       *testing.T
	cluster *memtransport.Cluster
	spy     *spy
	// mode is the rebalancing of the clients config makes.
	mode  memtransport.Rebalancing
	db    *gorm.DB
	store *sqlitetest.Store
	ib    *inbox.Inbox

	mu     sync.Mutex
	events []hooks.Event
	logs   lockedBuffer
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newMemEnv makes a broker with topic "orders" of partitions partitions,
// and the database with a migrated inbox and the effects table.
func newMemEnv(t *testing.T, partitions int) *memEnv {
	t.Helper()
	cluster := memtransport.NewCluster()
	e := &memEnv{t: t, cluster: cluster, spy: &spy{cluster: cluster}, db: sqlitetest.Open(t), store: &sqlitetest.Store{}}
	e.createTopic("orders", partitions)
	ib, err := inbox.New(e.db, e.store, inbox.Config{Logger: e.logger(), RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.ib = ib
	if err := e.db.Exec(`CREATE TABLE effects (event_id TEXT NOT NULL, value TEXT NOT NULL, part INTEGER NOT NULL, off INTEGER NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *memEnv) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// apply is the effect of a message: one row in effects, in tx.
func apply(tx *gorm.DB, m Message) error {
	return tx.Exec(`INSERT INTO effects (event_id, value, part, off) VALUES (?, ?, ?, ?)`,
		m.EventID, string(m.Value), m.Partition, m.Offset).Error
}

// config is a consumer of "orders" through the inbox with handler h, and
// the test's short backoffs and commit interval.
func (e *memEnv) config(h Handler) Config {
	return Config{
		Brokers: []string{"membroker:9092"},
		Kafka: KafkaConfig{
			Transport:      e.spy.wrap(e.cluster.Client(e.mode)),
			CommitInterval: 20 * time.Millisecond,
		},
		GroupID:  "inventory",
		Topics:   []string{"orders"},
		Inbox:    e.ib,
		Consumer: "reserve-stock",
		Handler:  h,
		Failure: FailureConfig{
			MinBackoff: time.Millisecond,
			MaxBackoff: 5 * time.Millisecond,
		},
		Logger: e.logger(),
		Hooks:  []hooks.Hook{hooks.EventFunc(e.record)},
	}
}

func (e *memEnv) record(ev hooks.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
}

// count returns the events of kind k recorded so far.
func (e *memEnv) count(k hooks.Kind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.events {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

func (e *memEnv) eventsOf(k hooks.Kind) []hooks.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []hooks.Event
	for _, ev := range e.events {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// running is a Run of a consumer in the background.
type running struct {
	c    *Consumer
	stop context.CancelFunc
	done chan error
}

// start builds a consumer of cfg on the broker, migrates its tables and
// runs it until the test ends or wait is called.
func (e *memEnv) start(cfg Config) *running {
	e.t.Helper()
	r := e.startCtx(context.Background(), cfg)
	e.t.Cleanup(func() {
		r.stop()
		if err := <-r.done; err != nil {
			e.t.Logf("Run returned %v", err)
		}
	})
	return r
}

func (e *memEnv) startCtx(ctx context.Context, cfg Config) *running {
	e.t.Helper()
	c, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &running{c: c, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	return r
}

// end stops the run and returns Run's error.
func (r *running) end(t *testing.T) error {
	t.Helper()
	r.stop()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
		return nil
	}
}

// close stops the run and fails the test unless Run returned the end of
// its context (with the partitions still stopped, if any).
func (r *running) close(t *testing.T) {
	t.Helper()
	if err := r.end(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
}

// eventually fails the test if cond does not hold within 10 s.
func (e *memEnv) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s\nlogs:\n%s", what, tail(e.logs.String(), 40))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// committedTo waits until the group's committed offset of partition p is next.
func (e *memEnv) committedTo(p int, next int64) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("the committed offset of partition %d to reach %d", p, next), func() bool {
		return e.committed(p) == next
	})
}

// The cluster's operations the tests run, on topic "orders" and group
// "inventory" unless named.

func (e *memEnv) createTopic(topic string, partitions int) {
	e.t.Helper()
	if err := e.cluster.CreateTopic(topic, partitions); err != nil {
		e.t.Fatal(err)
	}
}

// recreate deletes topic and creates it again with n empty partitions.
func (e *memEnv) recreate(topic string, partitions int) {
	e.t.Helper()
	if err := e.cluster.DeleteTopic(topic); err != nil {
		e.t.Fatal(err)
	}
	e.createTopic(topic, partitions)
}

func (e *memEnv) produce(partition int, msgs ...kafka.Message) {
	e.t.Helper()
	if err := e.cluster.ProduceTo("orders", partition, msgs...); err != nil {
		e.t.Fatal(err)
	}
}

// committed returns the group's committed offset (-1: none).
func (e *memEnv) committed(partition int) int64 {
	if n, ok := e.cluster.Committed("inventory", "orders", partition); ok {
		return n
	}
	return -1
}

func (e *memEnv) setCommitted(partition int, next int64) {
	e.cluster.SetCommitted("inventory", "orders", partition, next)
}

func (e *memEnv) generation() int32 { return e.cluster.Generation("inventory") }

func (e *memEnv) rebalance(keep map[string][]int) { e.cluster.Rebalance("inventory", keep) }

// deadLetters returns the messages of the dead-letter topic "orders.dlq".
func (e *memEnv) deadLetters() []kafka.Message { return e.cluster.Messages("orders.dlq") }

// rows returns the rows of table matching where.
func (e *memEnv) rows(table, where string, args ...any) int64 {
	e.t.Helper()
	return sqlitetest.Count(e.t, e.db, table, where, args...)
}

// effectsOf returns the values of the effects, in insertion order.
func (e *memEnv) effects() []string {
	e.t.Helper()
	var vs []string
	if err := e.db.Raw(`SELECT value FROM effects ORDER BY rowid`).Scan(&vs).Error; err != nil {
		e.t.Fatal(err)
	}
	return vs
}

// event is a message with the event headers the default extractor reads.
func event(id, value string, extra ...kafka.Header) kafka.Message {
	hs := []kafka.Header{
		{Key: header.EventID, Value: []byte(id)},
		{Key: header.EventTime, Value: []byte(time.Now().UTC().Format(time.RFC3339))},
	}
	return kafka.Message{Key: []byte(id), Value: []byte(value), Headers: append(hs, extra...)}
}

// sequenced is an event of source src's stream (epoch 1, shard shard),
// numbered seq; aligned adds the partition count of an aligned outbox.
func sequenced(id, src string, shard, seq int64, aligned int) kafka.Message {
	hs := []kafka.Header{
		{Key: header.SeqSource, Value: []byte(src)},
		{Key: header.SeqEpoch, Value: []byte("1")},
		{Key: header.SeqShard, Value: []byte(strconv.FormatInt(shard, 10))},
		{Key: header.Seq, Value: []byte(strconv.FormatInt(seq, 10))},
	}
	if aligned > 0 {
		hs = append(hs, kafka.Header{Key: header.SeqPartitions, Value: []byte(strconv.Itoa(aligned))})
	}
	return event(id, id, hs...)
}

func headerOf(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// failing returns a handler that fails for the ids in bad with err (and
// applies the others), counting the calls per id.
func failing(calls *sync.Map, err error, bad ...string) Handler {
	return func(ctx context.Context, tx *gorm.DB, m Message) error {
		n, _ := calls.LoadOrStore(m.EventID, new(int))
		*n.(*int)++
		for _, id := range bad {
			if m.EventID == id {
				return err
			}
		}
		return apply(tx, m)
	}
}

var errBoom = errors.New("boom")
