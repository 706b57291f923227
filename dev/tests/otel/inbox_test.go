package inboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	inboxotel "github.com/inboxgo/inbox/otel"
	"github.com/inboxgo/inbox/storage"
)

// With the inbox alone, the message span starts from the caller's context
// (here a parent span), and every call's outcome is counted.
func TestInboxAloneTracesAndCountsEachCall(t *testing.T) {
	tel := newTelemetry(t)
	db, store := newDB(t)
	icfg := inbox.Config{}
	otelHook, err := inboxotel.New(tel.opts)
	if err != nil {
		t.Fatal(err)
	}
	icfg.Hooks = append(icfg.Hooks, otelHook)
	ib, err := inbox.New(db, store, icfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		if m.ID == "bad" {
			return errors.New("bad")
		}
		return tx.Exec(`INSERT INTO effects (id) VALUES (?)`, m.ID).Error
	}
	parent := sdktrace.NewTracerProvider().Tracer("caller")
	ctx, span := parent.Start(t.Context(), "request")
	span.End()
	msg := func(id string) inbox.Message {
		return inbox.Message{Consumer: "c", ID: id, Time: time.Now(), Topic: "orders", Partition: 2, Offset: 7}
	}
	for _, id := range []string{"a", "a", "bad"} {
		_, _ = ib.Process(ctx, msg(id), h)
	}
	res, err := ib.ProcessBatch(ctx, []inbox.Message{msg("b"), msg("a"), msg("bad")}, h)
	if err != nil || res[0].Outcome != inbox.Processed {
		t.Fatalf("batch: %v %v", res, err)
	}
	var got []string
	for _, s := range tel.spans.Ended() {
		if s.Name() != "process orders" {
			continue
		}
		if s.Parent().SpanID() != span.SpanContext().SpanID() || s.SpanContext().TraceID() != span.SpanContext().TraceID() {
			t.Errorf("message span not under the caller's span")
		}
		a := s.Attributes()
		got = append(got, attr(a, "messaging.message.id")+":"+attr(a, "inbox.outcome"))
		if attr(a, "messaging.kafka.partition") != "2" || attr(a, "messaging.kafka.offset") != "7" || attr(a, "inbox.consumer") != "c" {
			t.Errorf("attributes %v", a)
		}
		if failed := attr(a, "inbox.outcome") == "failed"; failed != (s.Status().Code == codes.Error) || failed != (len(s.Events()) == 1) {
			t.Errorf("%s: status %v, %d events", got[len(got)-1], s.Status(), len(s.Events()))
		}
	}
	if fmt.Sprint(got) != "[a:processed a:duplicate bad:failed b:processed a:duplicate bad:failed]" {
		t.Errorf("message spans %v", got)
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.messages", "inbox.outcome")); got != "map[duplicate:2 failed:2 processed:2]" {
		t.Errorf("inbox.messages %s", got)
	}
}

// A claim that fails with a transient error is retried: two claim spans,
// the first failed, and one transaction retry counted.
func TestInboxTransactionRetry(t *testing.T) {
	tel := newTelemetry(t)
	db, store := newDB(t)
	icfg := inbox.Config{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	otelHook, err := inboxotel.New(tel.opts)
	if err != nil {
		t.Fatal(err)
	}
	icfg.Hooks = append(icfg.Hooks, otelHook)
	flaky := &failOnce{InboxStore: store}
	ib, err := inbox.New(db, flaky, icfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Process(t.Context(), inbox.Message{Consumer: "c", ID: "x", Time: time.Now()}, func(context.Context, *gorm.DB, inbox.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var claims []string
	for _, s := range tel.spans.Ended() {
		if s.Name() == "inbox claim" {
			claims = append(claims, s.Status().Code.String()+"/"+attr(s.Attributes(), "inbox.claim.new"))
		}
		if s.Name() == "process" && s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("message span kind %v", s.SpanKind())
		}
	}
	if fmt.Sprint(claims) != "[Error/ Unset/1]" {
		t.Errorf("claim spans %v, want a failed one, then one claiming 1 row", claims)
	}
	if got := fmt.Sprint(tel.counts(t, "inbox.retries", "inbox.retry.kind")); got != "map[transaction:1]" {
		t.Errorf("inbox.retries %s", got)
	}
}

var errTransient = errors.New("transient")

// failOnce is a Store whose first claim fails with a transient error.
type failOnce struct {
	storage.InboxStore
	failed bool
}

func (s *failOnce) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	if !s.failed {
		s.failed = true
		return nil, errTransient
	}
	return s.InboxStore.Claim(ctx, tx, rows)
}

func (s *failOnce) IsRetryable(err error) bool {
	return errors.Is(err, errTransient) || s.InboxStore.IsRetryable(err)
}
