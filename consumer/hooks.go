package consumer

import (
	"context"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/hooklist"
)

// The inbox's and the relay's New accept a hook that is only a ContextHook:
// hooks given to the inbox serve its consumer too.
func init() {
	hooklist.Register("consumer.ContextHook", func(h hooks.Hook) bool { _, ok := h.(ContextHook); return ok })
}

// ContextHook is a hook (see package hooks, and Config.Hooks) that gives
// each message the context it is processed under. MessageContext is called
// before each attempt at processing msg, with the context that attempt runs
// under; the context it returns is the one the Handler receives for msg,
// and the one the inbox's work on msg runs under (its tracers, its logs); a
// BatchHandler receives that of the first new message of the call. Use it
// to continue the producer's trace from the message's headers (the module
// github.com/inboxgo/inbox/otel does). It must return a context derived
// from ctx (nil keeps ctx), must not modify msg, and must be fast and safe
// for concurrent use. Several ContextHooks run in list order, each on the
// context the one before returned. A message without event id (see
// Config.Extract) is never processed, so it is not called for it.
type ContextHook interface {
	MessageContext(ctx context.Context, msg *Message) context.Context
}

// ContextFunc is a [ContextHook] made of a function.
type ContextFunc func(ctx context.Context, msg *Message) context.Context

// MessageContext calls f(ctx, msg).
func (f ContextFunc) MessageContext(ctx context.Context, msg *Message) context.Context {
	return f(ctx, msg)
}
