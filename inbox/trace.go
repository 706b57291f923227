package inbox

import (
	"context"

	"github.com/inboxgo/inbox/storage"
)

// startMessage calls the MessageTracer hooks, if any.
func (ib *Inbox) startMessage(ctx context.Context, msg Message) (context.Context, func(Outcome, error)) {
	if !ib.hooks.HasMessageTracers() {
		return ctx, endMessage
	}
	hctx, end := ib.hooks.TraceMessage(ctx, msg.row())
	return hctx, func(o Outcome, err error) { end(o.kind(), err) }
}

// startClaim calls the ClaimTracer hooks, if any.
func (ib *Inbox) startClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
	return ib.hooks.TraceClaim(ctx, rows)
}

// startHandler calls the HandlerTracer hooks, if any.
func (ib *Inbox) startHandler(ctx context.Context, msgs []Message) (context.Context, func(error)) {
	if !ib.hooks.HasHandlerTracers() {
		return ctx, endHandler
	}
	rows := make([]storage.InboxRow, len(msgs))
	for i, m := range msgs {
		rows[i] = m.row()
	}
	return ib.hooks.TraceHandler(ctx, rows)
}

// endMessage and endHandler are the end functions used when no hook
// traces: shared values, so tracing that is off allocates nothing.
var (
	endMessage = func(Outcome, error) {}
	endHandler = func(error) {}
)

// orContext is ctx, or parent when a hook returned none.
func orContext(ctx, parent context.Context) context.Context {
	if ctx == nil {
		return parent
	}
	return ctx
}
