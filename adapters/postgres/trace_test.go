package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// The pipelined BEGIN and claim is traced as one claim, once per
// transaction, under the message; the handler after it.
func TestPipelinedClaimIsTraced(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	var got []string
	type key struct{}
	tr := &hooks.Funcs{
		Message: func(ctx context.Context, m storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
			return context.WithValue(ctx, key{}, m.EventID), func(o hooks.Kind, err error) { got = append(got, "message "+o.String()) }
		},
		Claim: func(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
			parent, _ := ctx.Value(key{}).(string)
			return ctx, func(ins []bool, err error) { got = append(got, fmt.Sprintf("claim under %s: %v %v", parent, ins, err)) }
		},
		Handler: func(ctx context.Context, msgs []storage.InboxRow) (context.Context, func(error)) {
			return ctx, func(err error) { got = append(got, fmt.Sprintf("handler %v", err)) }
		},
	}
	ib, err := inbox.New(db, store, inbox.Config{Hooks: []hooks.Hook{tr}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	m := inbox.Message{Consumer: "c", ID: "a", Time: time.Now()}
	for range 2 {
		if _, err := ib.Process(t.Context(), m, func(context.Context, *gorm.DB, inbox.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	want := "[claim under a: [true] <nil> handler <nil> message processed claim under a: [false] <nil> message duplicate]"
	if fmt.Sprint(got) != want {
		t.Errorf("trace %v\nwant  %s", got, want)
	}
}

// The pipelined transaction's statements go by the message's context, not
// by the context of the Claim hook, whose span ends before the handler runs.
func TestPipelinedTxGoesByTheMessageContext(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	type msgKey struct{}
	type claimKey struct{}
	tr := &hooks.Funcs{
		Message: func(ctx context.Context, m storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
			return context.WithValue(ctx, msgKey{}, m.EventID), nil
		},
		Claim: func(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
			return context.WithValue(ctx, claimKey{}, true), nil
		},
	}
	ib, err := inbox.New(db, store, inbox.Config{Hooks: []hooks.Hook{tr}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	m := inbox.Message{Consumer: "c", ID: "a", Time: time.Now()}
	_, err = ib.Process(t.Context(), m, func(_ context.Context, tx *gorm.DB, _ inbox.Message) error {
		if c := tx.Statement.Context; c.Value(msgKey{}) != "a" || c.Value(claimKey{}) != nil {
			t.Errorf("transaction context: message %v, claim %v; want the message's only", c.Value(msgKey{}), c.Value(claimKey{}))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
