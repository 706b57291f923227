package hooklist_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/hooklist"
	"github.com/inboxgo/inbox/storage"
)

// A value that implements no hook interface would do nothing: New refuses
// it, naming its type, the interfaces, and what the likely fix is.
func TestNewRefusesNonHooks(t *testing.T) {
	for _, tc := range []struct {
		hook hooks.Hook
		want []string
	}{
		{"not a hook", []string{"Hooks[1] is a string"}},
		{42, []string{"Hooks[1] is a int"}},
		{func(hooks.Event) {}, []string{"is a func(hooks.Event)", "hooks.EventFunc"}},
		{hooks.Funcs{}, []string{"is a hooks.Funcs", "pass a *hooks.Funcs"}},
	} {
		l, err := hooklist.New("x.Config.Hooks", []hooks.Hook{hooks.EventFunc(func(hooks.Event) {}), tc.hook})
		if !errors.Is(err, storage.ErrInvalidConfig) || l != nil {
			t.Errorf("%#v: New = %v, %v; want ErrInvalidConfig", tc.hook, l, err)
			continue
		}
		want := append(tc.want, "x.Config.Hooks[1]", "hooks.EventHook", "hooks.MessageTracer", "hooks.ClaimTracer", "hooks.HandlerTracer", "consumer.ContextHook")
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%#v: error %q does not say %q", tc.hook, err, w)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%#v: error %q is more than a line", tc.hook, err)
		}
	}
}

// Every hook interface is enough, consumer.ContextHook too (the same hooks
// go to an inbox and its consumer); a nil hook is left out.
func TestNewTakesEveryHookInterface(t *testing.T) {
	ctxHook := consumer.ContextFunc(func(ctx context.Context, _ *consumer.Message) context.Context { return ctx })
	hs := []hooks.Hook{hooks.EventFunc(func(hooks.Event) {}), &hooks.Funcs{}, ctxHook, nil}
	l, err := hooklist.New("x.Config.Hooks", hs)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.All()) != 3 || !l.HasEvents() || !l.HasMessageTracers() || !l.HasClaimTracers() || !l.HasHandlerTracers() {
		t.Errorf("list %+v", l)
	}
}
