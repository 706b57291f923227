// Package hooklist calls the hooks of a Config (see package hooks): they
// are sorted once by the interfaces they implement, so that reporting to
// none costs nothing.
package hooklist

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
)

// List is a Config's hooks, sorted by what they implement once, when the
// Config is taken: calling the hooks of one kind then costs a loop over
// those alone (nothing when there are none).
type List struct {
	events   []hooks.EventHook
	messages []hooks.MessageTracer
	claims   []hooks.ClaimTracer
	handlers []hooks.HandlerTracer
	all      []hooks.Hook
}

// New sorts hooks, the hooks of the Config field named field (as
// "consumer.Config.Hooks", for errors), by the interfaces they implement.
// Nil hooks are left out. A hook that implements none of the hook
// interfaces (those of package hooks and the ones Register added) is an
// error wrapping storage.ErrInvalidConfig: a mistyped hook would otherwise
// do nothing, silently.
func New(field string, hs []hooks.Hook) (*List, error) {
	l := &List{}
	for i, h := range hs {
		if h == nil {
			continue
		}
		if err := check(h); err != nil {
			return nil, fmt.Errorf("%w: %s[%d] %w", storage.ErrInvalidConfig, field, i, err)
		}
		l.all = append(l.all, h)
		if e, ok := h.(hooks.EventHook); ok {
			l.events = append(l.events, e)
		}
		if m, ok := h.(hooks.MessageTracer); ok {
			l.messages = append(l.messages, m)
		}
		if c, ok := h.(hooks.ClaimTracer); ok {
			l.claims = append(l.claims, c)
		}
		if t, ok := h.(hooks.HandlerTracer); ok {
			l.handlers = append(l.handlers, t)
		}
	}
	return l, nil
}

// kind is a hook interface: its name, for errors, and its test.
type kind struct {
	name       string
	implements func(hooks.Hook) bool
}

var (
	kindsMu sync.RWMutex
	kinds   = []kind{
		{"hooks.EventHook", func(h hooks.Hook) bool { _, ok := h.(hooks.EventHook); return ok }},
		{"hooks.MessageTracer", func(h hooks.Hook) bool { _, ok := h.(hooks.MessageTracer); return ok }},
		{"hooks.ClaimTracer", func(h hooks.Hook) bool { _, ok := h.(hooks.ClaimTracer); return ok }},
		{"hooks.HandlerTracer", func(h hooks.Hook) bool { _, ok := h.(hooks.HandlerTracer); return ok }},
	}
)

// Register adds a hook interface defined outside package hooks (package
// consumer's ContextHook, which package hooks cannot name), so that New
// accepts a hook implementing only it, whichever Config the hook is given
// to: the same list goes to an inbox and its consumer. A package calls it
// from init; a hook implementing such an interface names a type of that
// package, so the package is linked, and registered, before any New runs.
func Register(name string, implements func(hooks.Hook) bool) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	kinds = append(kinds, kind{name, implements})
}

// check returns nil if h implements a hook interface, and else an error
// that names h's type and the interfaces.
func check(h hooks.Hook) error {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	if implementsAny(h) {
		return nil
	}
	names := make([]string, 0, len(kinds))
	for _, k := range kinds {
		names = append(names, k.name)
	}
	hint := ""
	t := reflect.TypeOf(h)
	switch {
	case t.Kind() == reflect.Func:
		hint = " (a function is a hook once converted: hooks.EventFunc, consumer.ContextFunc, or a field of *hooks.Funcs)"
	case t.Kind() != reflect.Pointer && implementsAny(reflect.New(t).Interface()):
		hint = fmt.Sprintf(" (its methods take a pointer: pass a *%v)", t)
	}
	return fmt.Errorf("is a %T, which implements none of the hook interfaces (%s)%s",
		h, strings.Join(names, ", "), hint)
}

func implementsAny(h hooks.Hook) bool {
	for _, k := range kinds {
		if k.implements(h) {
			return true
		}
	}
	return false
}

// All returns every hook of the list, in order.
func (l *List) All() []hooks.Hook {
	if l == nil {
		return nil
	}
	return l.all
}

// HasEvents reports whether any hook receives events, so that a reporter
// can skip building an Event nobody reads.
func (l *List) HasEvents() bool { return l != nil && len(l.events) > 0 }

// Emit calls every EventHook with ev.
func (l *List) Emit(ev hooks.Event) {
	if l == nil {
		return
	}
	for _, h := range l.events {
		h.OnEvent(ev)
	}
}

// HasClaimTracers reports whether any hook traces claims.
func (l *List) HasClaimTracers() bool { return l != nil && len(l.claims) > 0 }

// HasHandlerTracers reports whether any hook traces handler calls.
func (l *List) HasHandlerTracers() bool { return l != nil && len(l.handlers) > 0 }

// TraceMessage calls every MessageTracer, each under the context the one
// before it returned, and returns the last context and an end function
// that ends them in reverse order.
func (l *List) TraceMessage(ctx context.Context, row storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
	if l == nil || len(l.messages) == 0 {
		return ctx, endMessage
	}
	ends := make([]func(hooks.Kind, error), 0, len(l.messages))
	for _, t := range l.messages {
		c, end := t.TraceMessage(ctx, row)
		ctx = orContext(c, ctx)
		if end != nil {
			ends = append(ends, end)
		}
	}
	return ctx, func(k hooks.Kind, err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](k, err)
		}
	}
}

// TraceClaim calls every ClaimTracer, as TraceMessage does.
func (l *List) TraceClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
	if l == nil || len(l.claims) == 0 {
		return ctx, endClaim
	}
	ends := make([]func([]bool, error), 0, len(l.claims))
	for _, t := range l.claims {
		c, end := t.TraceClaim(ctx, rows)
		ctx = orContext(c, ctx)
		if end != nil {
			ends = append(ends, end)
		}
	}
	return ctx, func(ins []bool, err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](ins, err)
		}
	}
}

// TraceHandler calls every HandlerTracer, as TraceMessage does.
func (l *List) TraceHandler(ctx context.Context, rows []storage.InboxRow) (context.Context, func(error)) {
	if l == nil || len(l.handlers) == 0 {
		return ctx, endHandler
	}
	ends := make([]func(error), 0, len(l.handlers))
	for _, t := range l.handlers {
		c, end := t.TraceHandler(ctx, rows)
		ctx = orContext(c, ctx)
		if end != nil {
			ends = append(ends, end)
		}
	}
	return ctx, func(err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](err)
		}
	}
}

// Shared end functions for lists without tracers: tracing that is off
// allocates nothing.
var (
	endMessage = func(hooks.Kind, error) {}
	endClaim   = func([]bool, error) {}
	endHandler = func(error) {}
)

func orContext(ctx, parent context.Context) context.Context {
	if ctx == nil {
		return parent
	}
	return ctx
}

// HasMessageTracers reports whether any hook traces messages.
func (l *List) HasMessageTracers() bool { return l != nil && len(l.messages) > 0 }
