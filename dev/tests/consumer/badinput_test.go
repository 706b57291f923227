package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/header"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"
)

// The bad-input table: one bad message between two good ones on a single
// partition, under the DeadLetter policy. Each bad message gets its clear
// error in the dead letter (or, for hostile but valid input, is processed
// exactly once like any other), the good ones are applied exactly once, and
// the group's offset passes all three: nothing is lost, nothing silently
// skipped.
func TestBadInput(t *testing.T) {
	t.Parallel()
	withHeader := func(m kafka.Message, key, value string) kafka.Message {
		var hs []kafka.Header
		for _, h := range m.Headers {
			if h.Key != key {
				hs = append(hs, h)
			}
		}
		if value != "\x00drop" {
			hs = append(hs, kafka.Header{Key: key, Value: []byte(value)})
		}
		m.Headers = hs
		return m
	}
	cases := []struct {
		name     string
		bad      func(m kafka.Message) kafka.Message
		handler  func(s *shop) consumer.Handler // nil: the shop's handler
		consumer string                         // inbox consumer name; "" for the default
		timeout  time.Duration
		// reason and error text of the dead letter; "" when the message must
		// be processed like any other.
		reason, errText string
	}{
		{name: "missing id", bad: func(m kafka.Message) kafka.Message { return withHeader(m, header.EventID, "\x00drop") },
			reason: consumer.ReasonNoEventID, errText: "no event id"},
		{name: "empty id", bad: func(m kafka.Message) kafka.Message { return withHeader(m, header.EventID, "") },
			reason: consumer.ReasonNoEventID, errText: "no event id"},
		{name: "ambiguous id", bad: func(m kafka.Message) kafka.Message {
			m.Headers = append(m.Headers, kafka.Header{Key: header.EventID, Value: []byte("another")})
			return m
		}, reason: consumer.ReasonNoEventID, errText: "repeated with different values"},
		{name: "over-long id", bad: func(m kafka.Message) kafka.Message {
			return withHeader(m, header.EventID, strings.Repeat("x", 256))
		},
			reason: consumer.ReasonInvalid, errText: "longer than the 255 allowed"},
		{name: "invalid UTF-8 id", bad: func(m kafka.Message) kafka.Message { return withHeader(m, header.EventID, "evt-\xff\xfe") },
			reason: consumer.ReasonInvalid, errText: "not valid UTF-8"},
		{name: "missing event time", bad: func(m kafka.Message) kafka.Message { return withHeader(m, header.EventTime, "\x00drop") },
			reason: consumer.ReasonNoEventID, errText: "no event time"},
		{name: "malformed event time", bad: func(m kafka.Message) kafka.Message { return withHeader(m, header.EventTime, "yesterday") },
			reason: consumer.ReasonNoEventID, errText: "not an RFC 3339 time"},
		{name: "event older than retention", bad: func(m kafka.Message) kafka.Message {
			return withHeader(m, header.EventTime, time.Now().AddDate(0, 0, -90).UTC().Format(time.RFC3339))
		}, reason: consumer.ReasonExpired, errText: "older than the retention window"},
		{name: "SQL metacharacters in id", bad: func(m kafka.Message) kafka.Message {
			return withHeader(m, header.EventID, `evt'; DROP TABLE stock; -- "@x" ? $1`)
		}},
		{name: "SQL metacharacters in consumer name", bad: func(m kafka.Message) kafka.Message { return m },
			consumer: `reserve'; DROP TABLE reservations; --`},
		{name: "payload that is not JSON", bad: func(m kafka.Message) kafka.Message { m.Value = []byte("{not json"); return m },
			reason: consumer.ReasonHandlerError, errText: "bad OrderCreated payload"},
		{name: "handler always fails", bad: func(m kafka.Message) kafka.Message { return m },
			handler: func(s *shop) consumer.Handler {
				return func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
					if string(msg.Key) == "order-1" {
						return errors.New("warehouse closed")
					}
					return s.reserve(ctx, tx, msg)
				}
			}, reason: consumer.ReasonHandlerError, errText: "warehouse closed"},
		{name: "handler panics", bad: func(m kafka.Message) kafka.Message { return m },
			handler: func(s *shop) consumer.Handler {
				return func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
					if string(msg.Key) == "order-1" {
						panic("nil map in pricing")
					}
					return s.reserve(ctx, tx, msg)
				}
			}, reason: consumer.ReasonHandlerError, errText: "nil map in pricing"},
		{name: "handler hangs past its deadline", bad: func(m kafka.Message) kafka.Message { return m }, timeout: 200 * time.Millisecond,
			handler: func(s *shop) consumer.Handler {
				return func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
					if string(msg.Key) == "order-1" {
						if err := s.reserve(ctx, tx, msg); err != nil {
							return err
						}
						time.Sleep(500 * time.Millisecond) // ignores ctx
					}
					return s.reserve(ctx, tx, msg)
				}
			}, reason: consumer.ReasonHandlerError, errText: "handler did not finish within 200ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders", "orders.dlq")
			s := newSQLiteShop(t)
			msgs := []kafka.Message{orderMessage(0, 0), tc.bad(orderMessage(1, 0)), orderMessage(2, 0)}
			produce(t, brokers, "orders", msgs...)
			ev := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
			cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts, cfg.Timeouts.Handler = consumer.DeadLetter, "orders.dlq", 2, tc.timeout
			if tc.handler != nil {
				cfg.Handler = tc.handler(s)
			}
			if tc.consumer != "" {
				cfg.Consumer = tc.consumer
			}
			r := start(t, cfg)
			wantDead := 0
			if tc.reason != "" {
				wantDead = 1
			}
			waitUntil(t, 30*time.Second, "all three messages to be resolved", func() bool {
				return ev.count(hooks.Processed) == 3-wantDead && ev.count(hooks.DeadLettered) == wantDead
			})
			if err := r.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 3 {
				t.Fatalf("committed offset %d, want 3: every message resolved", got[0])
			}
			if tc.reason == "" {
				if n := ev.count(hooks.DeadLettered); n != 0 {
					t.Fatalf("%d dead letters for valid input", n)
				}
				s.checkExactlyOnce(t, 3, nil)
				return
			}
			s.checkExactlyOnce(t, 3, map[int]bool{1: true})
			dl := readAll(t, brokers, "orders.dlq", 1, 1)[0]
			h := map[string]string{}
			for _, x := range dl.Headers {
				h[x.Key] = string(x.Value)
			}
			if h[header.DLQReason] != tc.reason || !strings.Contains(h[header.DLQError], tc.errText) || h[header.DLQOffset] != "1" {
				t.Fatalf("dead letter reason %q error %q offset %q; want %q, an error containing %q, offset 1",
					h[header.DLQReason], h[header.DLQError], h[header.DLQOffset], tc.reason, tc.errText)
			}
			if string(dl.Value) != string(msgs[1].Value) {
				t.Fatalf("dead letter lost the payload: %q", dl.Value)
			}
		})
	}
}
