package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
)

// Each event's effect commits once: a second copy of an event (same id) is
// a duplicate, and the group's offset moves past every message.
func TestMemProcessesOnceAndCommits(t *testing.T) {
	e := newMemEnv(t, 2)
	e.produce(0, event("a", "1"), event("b", "2"), event("a", "1 again"), event("c", "3"))
	e.produce(1, event("d", "4"))
	r := e.start(e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) }))
	e.committedTo(0, 4)
	e.committedTo(1, 1)
	if got := e.effects(); len(got) != 4 || slices.Contains(got, "1 again") {
		t.Errorf("effects %q, want one per event id", got)
	}
	if n := e.rows("inbox_messages", "consumer = ?", "reserve-stock"); n != 4 {
		t.Errorf("%d inbox rows, want 4", n)
	}
	if p, d := e.count(hooks.Processed), e.count(hooks.Duplicate); p != 4 || d != 1 {
		t.Errorf("%d processed and %d duplicate events, want 4 and 1", p, d)
	}
	if e.count(hooks.Assigned) != 2 || e.count(hooks.Committed) == 0 {
		t.Errorf("assigned %d, committed %d events", e.count(hooks.Assigned), e.count(hooks.Committed))
	}
	if err := r.end(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	if e.count(hooks.Revoked) != 2 {
		t.Errorf("%d revoked events after Run, want 2", e.count(hooks.Revoked))
	}
	if readers, closed := e.spy.openReaders(), e.spy.closes(); readers != 0 || closed != 1 {
		t.Errorf("%d readers still open, transport closed %d times", readers, closed)
	}
}

// A Consumer closed without ever running releases its Transport too (a
// franz-go client dials and runs goroutines from the start), once, and a
// Run after that closes nothing again.
func TestMemCloseBeforeRunClosesTheTransport(t *testing.T) {
	e := newMemEnv(t, 1)
	c, err := New(e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) }))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Fatalf("Run after Close = %v, want ErrRunning", err)
	}
	closed := e.spy.closes()
	if closed != 1 {
		t.Errorf("transport closed %d times, want once", closed)
	}
}

// Messages delivered again after the group's offset went back (a reset, a
// lost commit) are duplicates: the effects stay as they were.
func TestMemRedeliveryIsDuplicate(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("c", "3"))
	h := func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) }
	r := e.start(e.config(h))
	e.committedTo(0, 3)
	if err := r.end(t); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	e.setCommitted(0, 0)
	r = e.start(e.config(h))
	e.committedTo(0, 3)
	r.close(t)
	if got := e.effects(); len(got) != 3 {
		t.Errorf("effects %q after redelivery, want 3", got)
	}
	if d := e.count(hooks.Duplicate); d != 3 {
		t.Errorf("%d duplicates, want 3", d)
	}
}

// A BatchHandler receives several messages at once and commits them in one
// transaction; duplicates are left out of its batch.
func TestMemBatchHandler(t *testing.T) {
	e := newMemEnv(t, 1)
	var msgs []kafka.Message
	for i := range 20 {
		msgs = append(msgs, event("e"+string(rune('a'+i)), "v"))
	}
	msgs = append(msgs, event("ea", "dup"))
	e.produce(0, msgs...)
	var mu sync.Mutex
	var sizes []int
	cfg := e.config(nil)
	cfg.BatchSize = 10
	cfg.BatchWait = 50 * time.Millisecond
	cfg.BatchHandler = func(ctx context.Context, tx *gorm.DB, ms []Message) error {
		mu.Lock()
		sizes = append(sizes, len(ms))
		mu.Unlock()
		for _, m := range ms {
			if err := apply(tx, m); err != nil {
				return err
			}
		}
		return nil
	}
	e.start(cfg)
	e.committedTo(0, 21)
	if got := e.effects(); len(got) != 20 || slices.Contains(got, "dup") {
		t.Errorf("%d effects (%q), want 20 without the duplicate", len(got), got)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Max(sizes) < 2 {
		t.Errorf("batch sizes %v, want batches of more than one message", sizes)
	}
}

// A failing message is retried until it succeeds; its effect commits once.
func TestMemRetriesUntilSuccess(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"))
	var fails atomic.Int32
	cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error {
		if m.EventID == "a" && fails.Add(1) <= 2 {
			return errBoom
		}
		return apply(tx, m)
	})
	cfg.Failure.MaxAttempts = 5
	e.start(cfg)
	e.committedTo(0, 2)
	if got := e.effects(); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("effects %q, want [1 2]", got)
	}
	retries := e.eventsOf(hooks.Retry)
	if len(retries) != 2 || retries[0].EventID != "a" || retries[1].Attempt != 2 || !errors.Is(retries[0].Err, errBoom) {
		t.Errorf("retry events %+v, want two for a", retries)
	}
	if !strings.Contains(e.logs.String(), "message failed; retrying") {
		t.Error("the retries are not logged")
	}
}

// Under DeadLetter a message whose attempts are used up goes to the
// dead-letter topic with its reason and its original content, and the
// partition goes on past it.
func TestMemDeadLetter(t *testing.T) {
	e := newMemEnv(t, 1)
	e.createTopic("orders.dlq", 1)
	e.produce(0, event("a", "1"), event("bad", "2"), event("c", "3"))
	var calls sync.Map
	cfg := e.config(failing(&calls, errBoom, "bad"))
	cfg.Failure.MaxAttempts = 3
	cfg.Failure.Policy = DeadLetter
	cfg.Failure.DeadLetterTopic = "orders.dlq"
	e.start(cfg)
	e.committedTo(0, 3)
	dead := e.deadLetters()
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	d := dead[0]
	if d.Topic != "orders.dlq" || string(d.Value) != "2" || headerOf(d, "dlq_reason") != ReasonHandlerError || !strings.Contains(headerOf(d, "dlq_error"), "boom") {
		t.Errorf("dead letter %s %q headers %v", d.Topic, d.Value, d.Headers)
	}
	if n, _ := calls.Load("bad"); *n.(*int) != 3 {
		t.Errorf("the handler ran %d times for the bad message, want MaxAttempts (3)", *n.(*int))
	}
	if got := e.effects(); !slices.Equal(got, []string{"1", "3"}) {
		t.Errorf("effects %q, want [1 3]", got)
	}
	if ev := e.eventsOf(hooks.DeadLettered); len(ev) != 1 || ev[0].Offset != 1 {
		t.Errorf("dead-lettered events %+v", ev)
	}
}

// An error marked inbox.Permanent goes to the policy at its first failure.
func TestMemPermanentErrorIsNotRetried(t *testing.T) {
	e := newMemEnv(t, 1)
	e.createTopic("orders.dlq", 1)
	e.produce(0, event("bad", "1"), event("b", "2"))
	var calls sync.Map
	cfg := e.config(failing(&calls, inbox.Permanent(errBoom), "bad"))
	cfg.Failure.MaxAttempts = 5
	cfg.Failure.Policy = DeadLetter
	cfg.Failure.DeadLetterTopic = "orders.dlq"
	e.start(cfg)
	e.committedTo(0, 2)
	if n, _ := calls.Load("bad"); *n.(*int) != 1 {
		t.Errorf("the handler ran %d times, want 1", *n.(*int))
	}
	dead := e.deadLetters()
	if len(dead) != 1 || headerOf(dead[0], "dlq_reason") != ReasonPermanent {
		t.Errorf("dead letters %v, want one with reason %q", dead, ReasonPermanent)
	}
}

// A message without an event id cannot go through the inbox: it is dead
// lettered as such at once.
func TestMemNoEventIDIsDeadLettered(t *testing.T) {
	e := newMemEnv(t, 1)
	e.createTopic("orders.dlq", 1)
	e.produce(0, kafka.Message{Value: []byte("no headers")}, event("b", "2"))
	cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) })
	cfg.Failure.Policy = DeadLetter
	cfg.Failure.DeadLetterTopic = "orders.dlq"
	e.start(cfg)
	e.committedTo(0, 2)
	dead := e.deadLetters()
	if len(dead) != 1 || headerOf(dead[0], "dlq_reason") != ReasonNoEventID || string(dead[0].Value) != "no headers" {
		t.Errorf("dead letters %v", dead)
	}
	if got := e.effects(); !slices.Equal(got, []string{"2"}) {
		t.Errorf("effects %q", got)
	}
}

// Under StopPartition the partition halts at the failed message: nothing
// at or after it is committed, even what a batch processed after it, and
// Run reports the stop.
func TestMemStopPartition(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("bad", "3"), event("d", "4"), event("e", "5"))
	var calls sync.Map
	cfg := e.config(failing(&calls, errBoom, "bad"))
	cfg.Failure.MaxAttempts = 2
	cfg.BatchSize = 5
	cfg.BatchWait = 50 * time.Millisecond
	r := e.start(cfg)
	e.eventually("the partition to stop", func() bool { return len(r.c.Stopped()) == 1 })
	s := r.c.Stopped()[0]
	if s.Offset != 2 || s.EventID != "bad" || s.Reason != ReasonHandlerError || s.Attempts != 2 || !errors.Is(s, ErrPartitionStopped) || !errors.Is(s, errBoom) {
		t.Errorf("stopped %+v", s)
	}
	e.committedTo(0, 2)
	time.Sleep(100 * time.Millisecond)
	if got := e.committed(0); got != 2 {
		t.Errorf("committed %d, want 2: nothing past the stopped message", got)
	}
	for _, c := range e.spy.commitLog() {
		if c.next > 2 {
			t.Errorf("a commit of %d, past the stopped message", c.next)
		}
	}
	if e.count(hooks.PartitionStopped) != 1 {
		t.Errorf("%d partition-stopped events", e.count(hooks.PartitionStopped))
	}
	err := r.end(t)
	var ps *PartitionStoppedError
	if !errors.As(err, &ps) || ps.Offset != 2 {
		t.Errorf("Run returned %v, want the stop", err)
	}
	if !strings.Contains(e.logs.String(), "PARTITION STOPPED") {
		t.Error("the stop is not logged")
	}
}

// A rebalance ends the generation: the workers commit and stop, and the
// next generation's assignment decides who consumes what.
func TestMemRebalance(t *testing.T) {
	e := newMemEnv(t, 2)
	e.produce(0, event("a", "1"))
	e.produce(1, event("b", "2"))
	e.start(e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) }))
	e.committedTo(0, 1)
	e.committedTo(1, 1)
	gen := e.generation()
	e.rebalance(map[string][]int{"orders": {1}})
	e.eventually("the next generation", func() bool { return e.generation() == gen+1 })
	e.produce(0, event("c", "3"))
	e.produce(1, event("d", "4"))
	e.committedTo(1, 2)
	time.Sleep(50 * time.Millisecond)
	if got := e.committed(0); got != 1 {
		t.Errorf("partition 0, not assigned, committed to %d", got)
	}
	if got := e.effects(); slices.Contains(got, "3") {
		t.Errorf("effects %q: partition 0 was consumed while not assigned", got)
	}
	e.rebalance(nil)
	e.committedTo(0, 2)
	if got := e.effects(); len(got) != 4 {
		t.Errorf("effects %q, want 4", got)
	}
	if e.count(hooks.Revoked) < 3 {
		t.Errorf("%d revoked events, want every partition of the ended generations", e.count(hooks.Revoked))
	}
	for _, c := range e.spy.commitLog() {
		if c.gen == gen+1 && c.partition == 0 {
			t.Errorf("generation %d committed partition 0, which it was not assigned", c.gen)
		}
	}
}

// Run refuses to start on a topic the cluster does not have, and on a
// table the configuration needs that is not migrated.
func TestMemStartChecks(t *testing.T) {
	e := newMemEnv(t, 1)
	cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return nil })
	cfg.Topics = []string{"orders", "payments"}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrUnknownTopic) || !strings.Contains(err.Error(), "payments") {
		t.Errorf("Run returned %v, want ErrUnknownTopic naming payments", err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("a second Run returned %v, want ErrRunning", err)
	}

	cfg = e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return nil })
	cfg.Offsets.Store = true
	c, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrNotMigrated) {
		t.Errorf("Run without the offsets table returned %v, want ErrNotMigrated", err)
	}
}

// Close stops Run, which then returns nil.
func TestMemClose(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"))
	r := e.start(e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) }))
	e.committedTo(0, 1)
	if err := r.c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Errorf("Run returned %v after Close, want nil", err)
	}
	r.done <- nil
	if err := r.c.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
