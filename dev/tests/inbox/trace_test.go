package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/faulttest"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/storage"
)

// span is what a recordingTrace hook saw: its name, its parent (the span
// found in the context it was given) and how it ended.
type span struct {
	name   string // "message a", "claim a,b", "handler a"
	parent *span
	ended  bool
	result string // the outcome, the inserted flags or "ok", then ": error" if any
}

type spanKey struct{}

// recordingTrace is a hook (hooks.Funcs) that keeps a tree of spans in the
// contexts it hands out, the way a tracing system does.
type recordingTrace struct {
	mu    sync.Mutex
	spans []*span
}

func (r *recordingTrace) start(ctx context.Context, name string) (context.Context, *span) {
	parent, _ := ctx.Value(spanKey{}).(*span)
	s := &span{name: name, parent: parent}
	r.mu.Lock()
	r.spans = append(r.spans, s)
	r.mu.Unlock()
	return context.WithValue(ctx, spanKey{}, s), s
}

func (r *recordingTrace) end(s *span, result string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.ended {
		panic("span " + s.name + " ended twice")
	}
	s.ended = true
	s.result = result
	if err != nil {
		s.result += ": error"
	}
}

func (r *recordingTrace) trace() *hooks.Funcs {
	return &hooks.Funcs{
		Message: func(ctx context.Context, m storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
			ctx, s := r.start(ctx, "message "+m.EventID)
			return ctx, func(o hooks.Kind, err error) { r.end(s, o.String(), err) }
		},
		Claim: func(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
			ids := make([]string, len(rows))
			for i, row := range rows {
				ids[i] = row.EventID
			}
			ctx, s := r.start(ctx, "claim "+strings.Join(ids, ","))
			return ctx, func(ins []bool, err error) { r.end(s, fmt.Sprint(ins), err) }
		},
		Handler: func(ctx context.Context, msgs []storage.InboxRow) (context.Context, func(error)) {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.EventID
			}
			ctx, s := r.start(ctx, "handler "+strings.Join(ids, ","))
			return ctx, func(err error) { r.end(s, "ok", err) }
		},
	}
}

// tree renders the spans, each as "parent > name = result", in start order.
func (r *recordingTrace) tree() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.spans {
		line := s.name + " = " + s.result
		if !s.ended {
			line = s.name + " NOT ENDED"
		}
		for p := s.parent; p != nil; p = p.parent {
			line = p.name + " > " + line
		}
		out = append(out, line)
	}
	return out
}

// inSpan checks that ctx, handed to a handler, carries the span named want.
func inSpan(ctx context.Context, want string) error {
	s, _ := ctx.Value(spanKey{}).(*span)
	if s == nil || s.name != want {
		return fmt.Errorf("handler context is in span %v, want %q", s, want)
	}
	return nil
}

func checkTree(t *testing.T, r *recordingTrace, want ...string) {
	t.Helper()
	if got := r.tree(); !slices.Equal(got, want) {
		t.Errorf("spans:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestTraceNestsClaimAndHandlerUnderTheMessage(t *testing.T) {
	rec := &recordingTrace{}
	ib, store := newTestInbox(t, inbox.Config{Hooks: []hooks.Hook{rec.trace()}})
	handler := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		if err := inSpan(ctx, "handler "+m.ID); err != nil {
			return err
		}
		if m.ID == "bad" {
			return errors.New("boom")
		}
		return nil
	}
	if _, err := ib.Process(t.Context(), msg("a"), handler); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Process(t.Context(), msg("a"), handler); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Process(t.Context(), msg("bad"), handler); err == nil {
		t.Fatal("no error from a failing handler")
	}
	store.failClaims.Store(1)
	if _, err := ib.Process(t.Context(), msg("b"), handler); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Process(t.Context(), msg(""), handler); err == nil {
		t.Fatal("an invalid message was accepted")
	}
	checkTree(t, rec,
		"message a = processed",
		"message a > claim a = [true]",
		"message a > handler a = ok",
		"message a = duplicate",
		"message a > claim a = [false]",
		"message bad = failed: error",
		"message bad > claim bad = [true]",
		"message bad > handler bad = ok: error",
		"message b = processed",
		"message b > claim b = []: error", // the transient failure, retried
		"message b > claim b = [true]",
		"message b > handler b = ok",
		"message  = failed: error",
	)
}

func TestTraceProcessTx(t *testing.T) {
	rec := &recordingTrace{}
	ib, _ := newTestInbox(t, inbox.Config{Hooks: []hooks.Hook{rec.trace()}})
	err := ib.DB().Transaction(func(tx *gorm.DB) error {
		_, err := ib.ProcessTx(t.Context(), tx, msg("a"), func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
			return inSpan(ctx, "handler a")
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, rec,
		"message a = processed",
		"message a > claim a = [true]",
		"message a > handler a = ok",
	)
}

// batchParents are the Contexts batch option the consumer hands the
// engine: a span in each message's context (the producer's, in a real
// trace), derived from ctx.
func batchParents(ctx context.Context, rec *recordingTrace, msgs []inbox.Message) batchopt.Options[inbox.Outcome] {
	ctxs := make([]context.Context, len(msgs))
	for i, m := range msgs {
		mctx, s := rec.start(ctx, "producer "+m.ID)
		s.ended, s.result = true, "sent"
		ctxs[i] = mctx
	}
	return batchopt.Options[inbox.Outcome]{Contexts: ctxs}
}

func TestTraceProcessBatch(t *testing.T) {
	rec := &recordingTrace{}
	ib, _ := newTestInbox(t, inbox.Config{Hooks: []hooks.Hook{rec.trace()}})
	if _, err := ib.Process(t.Context(), msg("seen"), noop); err != nil {
		t.Fatal(err)
	}
	rec.spans = nil
	msgs := []inbox.Message{msg("a"), msg("seen"), msg("bad"), msg("b")}
	handler := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		if err := inSpan(ctx, "handler "+m.ID); err != nil {
			return err
		}
		if m.ID == "bad" {
			return errors.New("boom")
		}
		return nil
	}
	res, err := runEngine(t.Context(), ib, msgs, handler, nil, batchParents(t.Context(), rec, msgs))
	if err != nil {
		t.Fatal(err)
	}
	if o := res[3].Outcome; o != inbox.Processed {
		t.Fatalf("b: %v", o)
	}
	// The first transaction fails at "bad" and is run again without it.
	checkTree(t, rec,
		"producer a = sent",
		"producer seen = sent",
		"producer bad = sent",
		"producer b = sent",
		"producer a > message a = processed",
		"producer seen > message seen = duplicate",
		"producer bad > message bad = failed: error",
		"producer b > message b = processed",
		"producer a > message a > claim a,seen,bad,b = [true false true true]",
		"producer a > message a > handler a = ok",
		"producer bad > message bad > handler bad = ok: error",
		"producer a > message a > claim a,seen,b = [true false true]",
		"producer a > message a > handler a = ok",
		"producer b > message b > handler b = ok",
	)
}

func TestTraceProcessBatchFunc(t *testing.T) {
	rec := &recordingTrace{}
	ib, db := newFaultInbox(t, inbox.Config{Hooks: []hooks.Hook{rec.trace()}}, faulttest.PostgresLike, nil)
	if _, err := ib.Process(t.Context(), msg("seen"), writeEffect); err != nil {
		t.Fatal(err)
	}
	rec.spans = nil
	msgs := []inbox.Message{msg("seen"), msg("a"), msg("b")}
	h := func(ctx context.Context, tx *gorm.DB, ms []inbox.Message) error {
		if err := inSpan(ctx, "handler a,b"); err != nil {
			return err
		}
		return setEffect(ctx, tx, ms)
	}
	if _, err := runEngine(t.Context(), ib, msgs, nil, h, batchParents(t.Context(), rec, msgs)); err != nil {
		t.Fatal(err)
	}
	if got := countRows(t, db, "effects"); got != 3 {
		t.Errorf("%d effects, want 3", got)
	}
	// The claim goes under the first message of the transaction, the batch
	// handler under its first new message.
	checkTree(t, rec,
		"producer seen = sent",
		"producer a = sent",
		"producer b = sent",
		"producer seen > message seen = duplicate",
		"producer a > message a = processed",
		"producer b > message b = processed",
		"producer seen > message seen > claim seen,a,b = [false true true]",
		"producer a > message a > handler a,b = ok",
	)
}

func TestTraceHooksMayBeLeftOut(t *testing.T) {
	var messages int
	ib, _ := newTestInbox(t, inbox.Config{Hooks: []hooks.Hook{&hooks.Funcs{
		Message: func(ctx context.Context, m storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
			messages++
			return nil, nil // keep the context, no end
		},
	}}})
	if _, err := ib.Process(t.Context(), msg("a"), noop); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.ProcessBatch(t.Context(), []inbox.Message{msg("b"), msg("c")}, noop); err != nil {
		t.Fatal(err)
	}
	if messages != 3 {
		t.Errorf("Message hook called %d times, want 3", messages)
	}
}

// runEngine is package inbox's batch engine with options, as the consumer
// calls it.
var runEngine = batchopt.Lookup[*inbox.Inbox, inbox.Message, inbox.Handler, inbox.BatchHandler, inbox.Result, inbox.Outcome]()
