package batchopt

import (
	"context"
	"testing"
)

// Take finds the options With put into a context, once: the context it
// returns, which the call's handlers derive theirs from, carries none.
func TestTakeRemovesTheOptions(t *testing.T) {
	type outcome int
	type other int
	calls := 0
	opts := &Options[outcome]{MessageContext: func(ctx context.Context, _ int) context.Context { calls++; return ctx }}
	ctx := With(t.Context(), opts)

	if _, o := Take[other](ctx); o.MessageContext != nil {
		t.Error("options found under another outcome type")
	}
	rest, o := Take[outcome](ctx)
	if o.MessageContext == nil || o.BeforeCommit != nil {
		t.Fatalf("Take = %+v, want the options set", o)
	}
	o.MessageContext(rest, 0)
	if calls != 1 {
		t.Errorf("%d calls of the options' MessageContext, want 1", calls)
	}
	if _, again := Take[outcome](rest); again.MessageContext != nil {
		t.Error("the context Take returned still carries the options")
	}
	if _, none := Take[outcome](t.Context()); none.MessageContext != nil || none.BeforeCommit != nil {
		t.Error("options found in a context without any")
	}
}
