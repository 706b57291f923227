package inbox

import (
	"context"

	"github.com/inboxgo/inbox/storage"
)

// Trace holds hooks the inbox calls around its work on each message, so
// that a tracing system (the separate module github.com/inboxgo/inbox/otel
// for OpenTelemetry) can open nested spans without the inbox depending on
// it. Like net/http/httptrace's ClientTrace it is a struct of optional
// functions rather than an interface, so hooks can be added later without
// breaking implementations; a nil field is skipped.
//
// Every hook returns the context to use for what it surrounds and an end
// function, which the inbox calls exactly once, from the same goroutine,
// when that work is over. The returned context must derive from the one
// passed in (the inbox's cancellation must reach it); a nil context keeps
// the one passed in. A nil end function is allowed. Hooks must be fast and
// safe for concurrent use, and must not panic.
type Trace struct {
	// Message surrounds one message of a Process, ProcessTx, ProcessBatch or
	// ProcessBatchFunc call, from the call's start to its result: end
	// receives the message's Outcome and, when Failed, its error. A message
	// rejected before any transaction (invalid, expired) is reported too.
	// The context it returns is the parent of the message's Claim and
	// Handler and is what the handler's context derives from. In a batch
	// every message gets its own; see [MessageContext] for where it
	// starts from.
	Message func(ctx context.Context, msg Message) (context.Context, func(Outcome, error))
	// Claim surrounds each claim of inbox rows: once per transaction
	// attempt (a retried transaction claims again), for all the rows of the
	// transaction, with BEGIN where the storage.InboxStore pipelines the two
	// ([storage.ClaimBeginner]). end receives, on success, which rows were new
	// (inserted[i] for rows[i]); on failure, the error and nil. Its parent
	// is the Message context of the transaction's first message: in a
	// batch one claim covers several messages.
	Claim func(ctx context.Context, rows []storage.InboxRow) (context.Context, func(inserted []bool, err error))
	// Handler surrounds each call of a handler: a Handler with one
	// message, a BatchHandler with the new messages of a transaction. Its
	// parent is the Message context of the (first) message, and the
	// handler receives the context it returns. end receives what the
	// handler returned (a *PanicError if it panicked).
	Handler func(ctx context.Context, msgs []Message) (context.Context, func(error))
}

// endMessage, endClaim and endHandler are the end functions used when a
// hook is unset: shared values, so tracing that is off allocates nothing.
var (
	endMessage = func(Outcome, error) {}
	endClaim   = func([]bool, error) {}
	endHandler = func(error) {}
)

// startMessage calls the Message hook, if any.
func (ib *Inbox) startMessage(ctx context.Context, msg Message) (context.Context, func(Outcome, error)) {
	t := ib.cfg.Trace
	if t == nil || t.Message == nil {
		return ctx, endMessage
	}
	hctx, end := t.Message(ctx, msg)
	if end == nil {
		end = endMessage
	}
	return orContext(hctx, ctx), end
}

// startClaim calls the Claim hook, if any.
func (ib *Inbox) startClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
	t := ib.cfg.Trace
	if t == nil || t.Claim == nil {
		return ctx, endClaim
	}
	hctx, end := t.Claim(ctx, rows)
	if end == nil {
		end = endClaim
	}
	return orContext(hctx, ctx), end
}

// startHandler calls the Handler hook, if any.
func (ib *Inbox) startHandler(ctx context.Context, msgs []Message) (context.Context, func(error)) {
	t := ib.cfg.Trace
	if t == nil || t.Handler == nil {
		return ctx, endHandler
	}
	hctx, end := t.Handler(ctx, msgs)
	if end == nil {
		end = endHandler
	}
	return orContext(hctx, ctx), end
}

// orContext is ctx, or parent when a hook returned none.
func orContext(ctx, parent context.Context) context.Context {
	if ctx == nil {
		return parent
	}
	return ctx
}
