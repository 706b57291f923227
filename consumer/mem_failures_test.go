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
	"github.com/inboxgo/inbox/transport/memtransport"
)

func (e *memEnv) deadLetterConfig(h Handler) Config {
	e.createTopic("orders.dlq", 1)
	cfg := e.config(h)
	cfg.Failure.Policy = DeadLetter
	cfg.Failure.DeadLetterTopic = "orders.dlq"
	cfg.Failure.MaxAttempts = 2
	return cfg
}

// A handler that overruns Timeouts.Handler fails with ErrHandlerTimeout, and
// one that panics with an *inbox.PanicError: both are the message's
// failures, which end in its dead letter.
func TestMemHandlerTimeoutAndPanic(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("slow", "1"), event("panics", "2"), event("ok", "3"))
	cfg := e.deadLetterConfig(func(ctx context.Context, tx *gorm.DB, m Message) error {
		switch m.EventID {
		case "slow":
			<-ctx.Done()
			return ctx.Err()
		case "panics":
			panic("the handler's bug")
		}
		return apply(tx, m)
	})
	cfg.Timeouts.Handler = 30 * time.Millisecond
	e.start(cfg)
	e.committedTo(0, 3)
	dead := e.deadLetters()
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	if !strings.Contains(headerOf(dead[0], "dlq_error"), "timed out") {
		t.Errorf("the slow message's dead letter says %q", headerOf(dead[0], "dlq_error"))
	}
	if !strings.Contains(headerOf(dead[1], "dlq_error"), "the handler's bug") {
		t.Errorf("the panicking message's dead letter says %q", headerOf(dead[1], "dlq_error"))
	}
	if got := e.effects(); !slices.Equal(got, []string{"3"}) {
		t.Errorf("effects %q", got)
	}
}

// In a batch, a failing message does not take the others down: the batch
// is tried again without it, and it alone goes to the policy.
func TestMemBatchIsolatesAPoisonMessage(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("poison", "3"), event("d", "4"), event("e", "5"))
	var calls sync.Map
	cfg := e.deadLetterConfig(failing(&calls, errBoom, "poison"))
	cfg.BatchSize = 5
	cfg.BatchWait = 50 * time.Millisecond
	e.start(cfg)
	e.committedTo(0, 5)
	if got := e.effects(); len(got) != 4 || slices.Contains(got, "3") {
		t.Errorf("effects %q, want every message but the poison", got)
	}
	if dead := e.deadLetters(); len(dead) != 1 || string(dead[0].Value) != "3" {
		t.Errorf("dead letters %v", dead)
	}
}

// A dead letter the producer refuses for a while is retried; one it
// refuses for good stops the partition at the message.
func TestMemDeadLetterRefused(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("bad", "1"), event("b", "2"))
	var calls sync.Map
	cfg := e.deadLetterConfig(failing(&calls, errBoom, "bad", "worse"))
	e.cluster.Fail(memtransport.OpDeadLetter, kafka.LeaderNotAvailable, kafka.LeaderNotAvailable)
	r := e.start(cfg)
	e.committedTo(0, 2)
	if len(e.deadLetters()) != 1 || !strings.Contains(e.logs.String(), "publishing a dead letter failed; retrying") {
		t.Errorf("%d dead letters; the retry is not logged", len(e.deadLetters()))
	}
	r.close(t)

	e.spy.set(func(s *spy) { s.deadErr = kafka.MessageSizeTooLarge })
	e.produce(0, event("worse", "3"), event("c", "4"))
	r = e.start(cfg)
	e.eventually("the stop", func() bool { return len(r.c.Stopped()) == 1 })
	s := r.c.Stopped()[0]
	if s.Reason != ReasonDeadLetterFailed || s.Offset != 2 || !errors.Is(s, kafka.MessageSizeTooLarge) || !errors.Is(s, errBoom) {
		t.Errorf("stopped %+v", s)
	}
	e.committedTo(0, 2)
}

// Without an inbox (NaturallyIdempotent) the handler runs in a transaction
// of its own per message, or per batch, with the same retries and policy.
func TestMemNaturallyIdempotent(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "handler", true: "batch"}[batch], func(t *testing.T) {
			e := newMemEnv(t, 1)
			e.produce(0, event("a", "1"), event("poison", "2"), event("c", "3"), event("d", "4"))
			var calls sync.Map
			cfg := e.deadLetterConfig(nil)
			cfg.Inbox, cfg.Consumer = nil, ""
			cfg.NaturallyIdempotent = true
			cfg.DB = e.db
			cfg.Classifier = e.store
			cfg.Offsets.Store = true
			h := failing(&calls, errBoom, "poison")
			if batch {
				cfg.BatchSize = 4
				cfg.BatchWait = 50 * time.Millisecond
				cfg.BatchHandler = func(ctx context.Context, tx *gorm.DB, ms []Message) error {
					for _, m := range ms {
						if err := h(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				}
			} else {
				cfg.Handler = h
			}
			e.start(cfg)
			e.committedTo(0, 4)
			if got := e.effects(); !slices.Equal(got, []string{"1", "3", "4"}) {
				t.Errorf("effects %q", got)
			}
			if n := e.rows("inbox_messages", ""); n != 0 {
				t.Errorf("%d inbox rows", n)
			}
			if dead := e.deadLetters(); len(dead) != 1 || string(dead[0].Value) != "2" {
				t.Errorf("dead letters %v", dead)
			}
			if row := e.stored(0); row.Next != 4 {
				t.Errorf("stored %+v, want 4", row)
			}
			if p := e.eventsOf(hooks.Processed); len(p) != 3 || !p[0].NoDedup {
				t.Errorf("processed events %+v", p)
			}
		})
	}
}

// A ContextHook's context reaches the handler.
type traceHook struct{ seen atomic.Int32 }

type traceKey struct{}

func (h *traceHook) MessageContext(ctx context.Context, m *Message) context.Context {
	h.seen.Add(1)
	return context.WithValue(ctx, traceKey{}, m.EventID)
}

func TestMemContextHook(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"))
	hook := &traceHook{}
	cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error {
		if ctx.Value(traceKey{}) != m.EventID {
			return inbox.Permanent(errors.New("the hook's context is not the handler's"))
		}
		return apply(tx, m)
	})
	cfg.Hooks = append(cfg.Hooks, hook)
	e.start(cfg)
	e.committedTo(0, 2)
	if len(e.effects()) != 2 || hook.seen.Load() < 2 {
		t.Errorf("effects %q, hook called %d times", e.effects(), hook.seen.Load())
	}
}

// The client's errors are retried: failed fetches, failed joins, refused
// offset commits. A configuration the group rejects ends Run.
func TestMemClientErrorsAreRetried(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"))
	e.cluster.Fail(memtransport.OpFetch, errBoom)
	e.cluster.Fail(memtransport.OpJoin, kafka.RebalanceInProgress)
	e.cluster.Fail(memtransport.OpCommit, kafka.RequestTimedOut, kafka.RequestTimedOut)
	e.start(e.config(applyAll))
	e.committedTo(0, 1)
	logs := e.logs.String()
	for _, want := range []string{"fetch failed; retrying", "consumer group error; retrying", "offset commit failed"} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %q in the logs", want)
		}
	}

	// A broker refuses a session timeout below its group.min.session.timeout.ms.
	cfg := e.config(applyAll)
	cfg.Kafka.SessionTimeout = time.Second
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, inbox.ErrInvalidConfig) || !errors.Is(err, kafka.InvalidSessionTimeout) {
		t.Errorf("Run returned %v, want ErrInvalidConfig", err)
	}
}

// Run runs the inbox's maintenance, and reports it.
func TestMemMaintenance(t *testing.T) {
	e := newMemEnv(t, 1)
	old := time.Now().AddDate(0, 0, -40)
	if err := e.db.Exec(`INSERT INTO inbox_messages (consumer, event_id, day, event_time) VALUES ('reserve-stock', 'old', ?, ?)`,
		old.Format(time.DateOnly), old.Format(time.RFC3339)).Error; err != nil {
		t.Fatal(err)
	}
	cfg := e.config(applyAll)
	cfg.MaintenanceInterval = 20 * time.Millisecond
	e.start(cfg)
	e.eventually("a maintenance event", func() bool { return e.count(hooks.Maintenance) > 0 })
	ev := e.eventsOf(hooks.Maintenance)[0]
	if ev.Err != nil || ev.Maintenance.RowsRemoved != 1 {
		t.Errorf("maintenance event %+v, want the expired row removed", ev)
	}
	if n := e.rows("inbox_messages", ""); n != 0 {
		t.Errorf("%d rows left", n)
	}
}

// A partition whose work has not finished within Timeouts.ProcessingStall makes
// the member leave the group (its partitions go to others) and rejoin when
// the database answers; the message's work in flight is rolled back and
// done again.
func TestMemStallLeavesTheGroup(t *testing.T) {
	for _, cooperative := range []bool{false, true} {
		t.Run(map[bool]string{false: "eager", true: "cooperative"}[cooperative], func(t *testing.T) {
			e := newMemEnv(t, 1)
			if cooperative {
				e.mode = memtransport.Cooperative
			}
			e.produce(0, event("a", "1"))
			var calls atomic.Int32
			cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error {
				if calls.Add(1) == 1 {
					<-ctx.Done()
					return ctx.Err()
				}
				return apply(tx, m)
			})
			cfg.Timeouts.ProcessingStall = 150 * time.Millisecond
			cfg.Timeouts.Database = 100 * time.Millisecond
			e.start(cfg)
			e.committedTo(0, 1)
			if got := e.effects(); len(got) != 1 {
				t.Errorf("effects %q", got)
			}
			logs := e.logs.String()
			if !strings.Contains(logs, "PARTITION STALLED") || !strings.Contains(logs, "rejoining the group") {
				t.Errorf("the stall and the rejoin are not logged:\n%s", tail(logs, 30))
			}
			if e.generation() < 2 {
				t.Errorf("generation %d: the member did not rejoin", e.generation())
			}
		})
	}
}
