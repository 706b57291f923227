// Package batchopt is the entry by which package consumer runs package
// inbox's batch engine with options of its own: the offsets it stores with
// a batch, its messages' contexts, its sequenced dedup marks and watermark
// writes, its retries and its step bound. inbox.ProcessBatch and
// inbox.ProcessBatchFunc run the same engine with the zero Options. It is
// also how the consumer reads the logger and hooks an inbox was given
// ([Shared]), which it takes when its own Config leaves them unset.
//
// Package inbox registers the engine when it is initialised ([Register],
// and [RegisterShared]); package consumer, which imports package inbox and
// so is initialised after it, looks it up once ([Lookup], [LookupShared])
// and calls it with a plain Options value. The engine is generic in
// package inbox's types only because this package cannot import package
// inbox, which imports it: O is inbox.Outcome, and the types of [Engine]
// are inbox's Inbox, Message, Handler, BatchHandler and Result.
package batchopt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
)

// Options change how one ProcessBatch or ProcessBatchFunc call runs.
type Options[O any] struct {
	// BeforeCommit, if set, is called in each transaction the call is
	// about to commit, after the handlers ran, so that its writes commit
	// with the batch (the consumer stores its offset this way).
	// outcomes[i] is what msgs[i] will be once this transaction commits:
	// Processed or Duplicate for the messages of this transaction and of
	// transactions the same call committed before, Failed for messages that
	// failed (rejected before any transaction, or isolated after failing),
	// and zero for messages still to be run. An error from it fails the
	// whole transaction like a failed claim: a database failure, reported
	// for the batch.
	BeforeCommit func(ctx context.Context, tx *gorm.DB, outcomes []O) error
	// Contexts, if set, has one entry per message: the work on msgs[i]
	// (its MessageTracer hooks, its handler call, its logs) starts from
	// Contexts[i] instead of the call's ctx. Each must be derived from the
	// call's ctx (the consumer adds the trace context found in the
	// message's headers); a nil entry keeps ctx. A BatchHandler called
	// with several messages gets the context of the first of them.
	Contexts []context.Context
	// CallerReportsOutcomes says that the caller (the consumer) reports the
	// outcome of each message once it is decided, so the call reports none
	// to the hooks' EventHooks (see package hooks): each outcome is then
	// reported once. Tracers are still called.
	CallerReportsOutcomes bool
	// CallerRetries says that the caller (the consumer) owns every retry:
	// each transaction of the call runs once, and a transient failure is
	// returned (a database failure, as inbox.IsDatabaseFailure reports it)
	// instead of being run again under inbox.Config.MaxAttempts; a handler
	// error marked with inbox.Retryable is returned as any other.
	CallerRetries bool
	// Bound, if positive, bounds each of the call's own steps on the
	// database: BEGIN, the claim (with BEGIN when the store pipelines
	// them), BeforeCommit, COMMIT and ROLLBACK (consumer.Config.Timeouts.Database).
	// A step past it fails as a database failure wrapping a
	// txn.TimeoutError; the handlers are not bounded by it.
	Bound time.Duration
	// Seq, if set, has one entry per message: how the caller deduplicates
	// it. The zero SeqMark is the inbox row, as without Seq.
	Seq []SeqMark
	// Watermarks, if set, is called before each transaction with the
	// messages it runs (indexes into msgs, first copies only) and
	// committed: the outcomes of the messages earlier transactions of the
	// call committed (Processed or Duplicate), of those decided before any
	// transaction (SeqMark.Applied: Duplicate; Failed), and zero for the
	// others. The watermark writes it returns go into the transaction
	// first, with the claim (storage.WatermarkStore.SaveWatermarks; one
	// round trip with BEGIN where the store is a
	// storage.WatermarkBeginner and there is nothing to claim); their
	// failure fails the transaction as a database failure.
	Watermarks func(group []int, committed []O) []storage.WatermarkWrite
}

// SeqMark is the caller's dedup decision for one message of a call.
type SeqMark struct {
	// Chain, if positive, puts the message in the chain of that number:
	// the messages of one sequenced stream's shard, in order. When a
	// message of a chain fails (rejected before any transaction, or
	// isolated from its batch), every later message of the same chain is
	// held back: Failed with an error wrapping ErrHeldBack, none of it
	// run, so that a watermark never passes a message that did not
	// commit.
	Chain int
	// Applied says the caller's watermark covers the message: its outcome
	// is Duplicate, and it runs in no transaction.
	Applied bool
	// Claim says a message of a chain claims its inbox row too, its
	// outcome then Duplicate if the row exists (a stream switched from
	// inbox rows to a watermark: both are consulted while the rows are
	// kept). Without it a message of a chain has no inbox row and is new.
	Claim bool
}

// ErrHeldBack is wrapped by the error of a message held back behind an
// earlier message of its chain (see SeqMark): it did not fail itself, and
// is to be run once the earlier message is resolved.
var ErrHeldBack = errors.New("inbox: held back behind an earlier message of its sequenced stream that did not commit")

// Engine runs msgs through ib's batch engine with opts, with h (a
// per-message handler) or bh (a batch handler): exactly one of them is
// set. The results and error are those inbox.ProcessBatch documents.
type Engine[I, M, H, B, R, O any] func(ctx context.Context, ib I, msgs []M, h H, bh B, opts Options[O]) ([]R, error)

// registered is the Engine package inbox registered.
var registered any

// Register records package inbox's engine. Package inbox calls it once,
// from its init.
func Register[I, M, H, B, R, O any](e Engine[I, M, H, B, R, O]) { registered = e }

// Lookup returns the engine package inbox registered. It panics if the
// types asked for are not those registered: a mismatch of this module's
// own packages, which every test of package consumer runs into at once.
func Lookup[I, M, H, B, R, O any]() Engine[I, M, H, B, R, O] {
	e, ok := registered.(Engine[I, M, H, B, R, O])
	if !ok {
		panic(fmt.Sprintf("batchopt: the registered engine is %T, not %T", registered, e))
	}
	return e
}

// Shared is what an inbox was configured with that a consumer driving it
// takes for its own when its Config leaves it unset: the inbox.Config's
// Logger (nil if it was not set) and Hooks (without the nil ones).
type Shared struct {
	Logger *slog.Logger
	Hooks  []hooks.Hook
}

// sharedOf is the function package inbox registered with RegisterShared.
var sharedOf any

// RegisterShared records how package inbox tells an inbox's Shared
// settings; I is *inbox.Inbox. Package inbox calls it once, from its init.
func RegisterShared[I any](f func(I) Shared) { sharedOf = f }

// LookupShared returns the function RegisterShared recorded. It panics if
// the type asked for is not the one registered, as Lookup does.
func LookupShared[I any]() func(I) Shared {
	f, ok := sharedOf.(func(I) Shared)
	if !ok {
		panic(fmt.Sprintf("batchopt: the registered settings are %T, not %T", sharedOf, f))
	}
	return f
}
