// Package hooklist calls the hooks of a Config (see package hooks): they
// are sorted once by the interfaces they implement, so that reporting to
// none costs nothing.
package hooklist

import (
	"context"

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

// New sorts hooks by the interfaces they implement. Nil hooks are
// left out.
func New(lists ...[]hooks.Hook) *List {
	l := &List{}
	for _, hs := range lists {
		for _, h := range hs {
			if h == nil {
				continue
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
	}
	return l
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
