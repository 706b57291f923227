package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
)

var errUndecodable = errors.New("payload does not decode")

// A handler error marked inbox.Permanent sends its message to the failure
// policy at its first failure, also when the handler wrapped the marked
// error further, while an unmarked error is still retried MaxAttempts
// times; with a Handler and with a BatchHandler, through the inbox and
// without it (NaturallyIdempotent), on a real broker.
//
// Orders 0..5 on one partition: order-1 fails with inbox.Permanent(err),
// order-3 with fmt.Errorf("...: %w", inbox.Permanent(err)), order-2 with a
// plain error every time; the others apply.
func TestPermanentErrorGoesToThePolicyAtOnce(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	modes := []struct {
		name    string
		open    func(t *testing.T) *shop
		batch   bool // BatchHandler with BatchSize 10, not Handler
		noInbox bool // NaturallyIdempotent
	}{
		{"sqlite/handler", newSQLiteShop, false, false},
		{"sqlite/batch-handler", newSQLiteShop, true, false},
		{"sqlite/naturally-idempotent", newSQLiteShop, false, true},
		{"postgres/handler", newPostgresShop, false, false},
		{"postgres/batch-handler", newPostgresShop, true, false},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := m.open(t)
			topic := "orders-perm-" + conformance.RandomSuffix()
			createTopic(t, brokers, topic, 1)
			createTopic(t, brokers, topic+".dlq", 1)
			const n = 6
			var msgs []kafka.Message
			for i := range n {
				msgs = append(msgs, orderMessage(i, 0))
			}
			produce(t, brokers, topic, msgs...)

			// attempts counts the runs in which a failing order was the
			// only one it failed with: one per attempt, however a batch
			// was split to find it.
			var mu sync.Mutex
			attempts := map[string]int{}
			fail := func(key string) error {
				switch key {
				case "order-1":
					return inbox.Permanent(errUndecodable)
				case "order-2":
					return errors.New("stock service unavailable")
				case "order-3":
					return fmt.Errorf("order-3: %w", inbox.Permanent(errUndecodable))
				}
				return nil
			}
			ev := newEvents()
			cfg := baseConfig(t, brokers, topic, "inventory-"+conformance.RandomSuffix(), s, ev)
			cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, topic+".dlq", 3
			cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
				if err := fail(string(msg.Key)); err != nil {
					mu.Lock()
					attempts[string(msg.Key)]++
					mu.Unlock()
					return err
				}
				return s.reserve(ctx, tx, msg)
			}
			if m.batch {
				cfg.Handler, cfg.BatchSize = nil, 10
				cfg.BatchHandler = func(ctx context.Context, tx *gorm.DB, batch []consumer.Message) error {
					for _, msg := range batch {
						if err := fail(string(msg.Key)); err != nil {
							if len(batch) == 1 {
								mu.Lock()
								attempts[string(msg.Key)]++
								mu.Unlock()
							}
							return err
						}
					}
					for _, msg := range batch {
						if err := s.reserve(ctx, tx, msg); err != nil {
							return err
						}
					}
					return nil
				}
			}
			if m.noInbox {
				cfg.Inbox, cfg.NaturallyIdempotent = nil, true
				cfg.DB, cfg.Classifier = s.db, s.ib.Store()
			}
			r := start(t, cfg)
			waitUntil(t, 30*time.Second, "three dead letters and three orders applied", func() bool {
				return ev.count(hooks.DeadLettered) == 3 && ev.count(hooks.Processed) == 3
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			got := map[string]int{"order-1": attempts["order-1"], "order-2": attempts["order-2"], "order-3": attempts["order-3"]}
			mu.Unlock()
			if want := map[string]int{"order-1": 1, "order-2": 3, "order-3": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("attempts per failing order %v, want %v (permanent once, plain MaxAttempts times)", got, want)
			}
			reasons := map[string]string{}
			for _, dl := range readAll(t, brokers, topic+".dlq", 1, 3) {
				reasons[string(dl.Key)] = headerOf(dl, header.DLQReason) + "/" + headerOf(dl, header.DLQAttempts)
			}
			want := map[string]string{
				"order-1": consumer.ReasonPermanent + "/1",
				"order-2": consumer.ReasonHandlerError + "/3",
				"order-3": consumer.ReasonPermanent + "/1",
			}
			if fmt.Sprint(reasons) != fmt.Sprint(want) {
				t.Errorf("dead letters (reason/attempts) %v, want %v", reasons, want)
			}
			if got := committed(t, brokers, cfg.GroupID, topic, 1); got[0] != n {
				t.Errorf("committed %v, want %d", got, n)
			}
			s.checkExactlyOnce(t, n, map[int]bool{1: true, 2: true, 3: true})
		})
	}
}

func headerOf(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// An application calling the inbox itself: an error marked Permanent is
// not run again, even when also marked Retryable; Retryable alone is.
func TestPermanentIsNotRetriedByTheInbox(t *testing.T) {
	s := newSQLiteShop(t)
	ctx := context.Background()
	for i, tc := range []struct {
		mark func(error) error
		runs int
	}{
		{inbox.Retryable, inbox.DefaultMaxAttempts},
		{func(err error) error { return inbox.Permanent(inbox.Retryable(err)) }, 1},
		{func(err error) error { return fmt.Errorf("wrapped: %w", inbox.Retryable(inbox.Permanent(err))) }, 1},
	} {
		runs := 0
		_, err := s.ib.Process(ctx, inbox.Message{Consumer: "c", ID: "ev-" + strconv.Itoa(i), Time: time.Now()},
			func(context.Context, *gorm.DB, inbox.Message) error {
				runs++
				return tc.mark(errUndecodable)
			})
		if !errors.Is(err, errUndecodable) {
			t.Fatalf("case %d: error %v, want the handler's", i, err)
		}
		if runs != tc.runs {
			t.Errorf("case %d: handler ran %d times, want %d", i, runs, tc.runs)
		}
		if got, want := inbox.IsPermanent(err), tc.runs == 1; got != want {
			t.Errorf("case %d: IsPermanent = %v, want %v", i, got, want)
		}
	}
}
