package consumer

// The batch runner: a fetched batch through the inbox (or, for a naturally
// idempotent consumer, without it), the user's handlers and their timeout;
// its failure policy is in failure.go, its sequenced dedup in sequenced.go.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// runSettings are the Config's settings the batch runner uses.
type runSettings struct {
	extract        Extractor    // Config.Extract
	idempotent     bool         // Config.NaturallyIdempotent
	handler        Handler      // Config.Handler
	batchHandler   BatchHandler // Config.BatchHandler
	inboxOf        *inbox.Inbox // Config.Inbox
	consumer       string       // Config.Consumer
	maxAttempts    int          // Config.Failure.MaxAttempts
	handlerTimeout time.Duration
	// The failure policy: Config.Failure.Policy, Failure.DeadLetterTopic and GroupID
	// (named in a dead letter's headers).
	onFailure       Policy
	deadLetterTopic string
	group           string
	// Sequenced dedup: Config.Sequenced.RowsUntil and Sequenced.AcceptGaps.
	seqRowsUntil time.Time
	acceptGaps   bool
}

// batchRunner runs a partition's fetched batches: through the inbox or,
// naturally idempotent, without it, with the user's handler under its
// timeout, and applies the failure policy (retries, dead letters, stops) to
// the messages that fail. What finishes is marked done in the committer.
type batchRunner struct {
	*part
	runSettings
	com      *committer // the partition's offsets, and with Offsets.Store the stored offset's writes
	contexts []ContextHook
	dlq      MessageWriter
	afterDB  func(topic string, partition int, next int64, processed int) error // the tests' knob (internal/testhooks)
	trusted  map[string]bool                                                    // Config.Sequenced.Sources

	// batch is the batch in process, for the fingerprint of the message
	// before a stored offset (lastOf).
	batch []*item
	// seq holds the partition's sequenced streams (nil without
	// Config.Sequenced.Sources); seqMoved says the last processInbox gave
	// up because a watermark moved, gapStopped that runAlone stopped the
	// partition at its message.
	seq        *watermarks
	seqMoved   bool
	gapStopped bool
}

// process handles a batch in order and reports whether the partition must
// stop. Messages left unfinished (the worker is stopping) are not marked
// done, so their offsets are not committed.
func (b *batchRunner) process(ctx, dbCtx context.Context, batch []kafka.Message) (halt bool) {
	items := b.items(batch)
	b.batch = items
	defer func() { b.batch = nil }()
	defer b.com.noteTail(b.lastOf)
	defer func() {
		last := batch[len(batch)-1]
		if last.HighWaterMark > 0 {
			next, _ := b.com.committable()
			b.emit(hooks.Event{Kind: hooks.Lag, Offset: next, Lag: max(last.HighWaterMark-next, 0)})
		}
	}()
	if b.idempotent {
		if b.batchHandler != nil && len(items) > 1 {
			switch b.processIdempotentBatch(ctx, dbCtx, items) {
			case resolved:
				return false
			case abandoned:
				return false
			}
			// A message of the batch failed: each is tried alone below.
		}
		for _, it := range items {
			switch b.processIdempotent(ctx, dbCtx, it) {
			case stopped:
				return true
			case abandoned:
				return false
			}
		}
		return false
	}

	// A number taken again in the batch is run after the messages before
	// it committed: the watermark then decides it (see repeatsAt).
	for len(items) > 0 {
		n := repeatsAt(items)
		if halt, goOn := b.processSegment(ctx, dbCtx, items[:n]); !goOn {
			return halt
		}
		items = items[n:]
	}
	return false
}

// items are the batch's messages on their way through the runner, each
// recorded as fetched in the tracker, with its event id and time and, for a
// trusted sequenced source, its place in its stream.
func (b *batchRunner) items(batch []kafka.Message) []*item {
	// The batch's items, and their places in sequenced streams, are
	// allocated together, not one by one.
	slab := make([]item, len(batch))
	items := make([]*item, len(batch))
	var positions []seqPos
	if b.seq != nil {
		positions = make([]seqPos, len(batch))
	}
	var source string // the last stream's source id, which its next messages share
	for i := range batch {
		m := &batch[i]
		if err := b.com.tracker.fetched(m.Offset); err != nil {
			b.log.Error("offset bookkeeping broken", "error", err)
		}
		id, at, err := extract(b.extract, m)
		it := &slab[i]
		*it = item{msg: Message{Message: *m, EventID: id, EventTime: at}, extractErr: err}
		items[i] = it
		if err == nil && b.seq != nil {
			it.seq, it.seqErr = b.sequenceOf(m, &positions[i], source)
			if p := it.seq; p != nil {
				p.eventID = id
				source = p.stream.source
			}
		}
	}
	return items
}

// processSegment processes items, a batch or the part of one before a
// number its stream took again, through the inbox. halt says the partition
// must stop; goOn that the rest of the batch may follow (false also when
// the worker is stopping, with items left unfinished).
func (b *batchRunner) processSegment(ctx, dbCtx context.Context, items []*item) (halt, goOn bool) {
	var gap *gapError
	var results []inbox.Result
	for {
		var stop bool
		if items, gap, stop = b.cutAtGap(ctx, dbCtx, items); stop {
			return true, false
		}
		if b.com.lost != nil {
			return false, false // the database went back: run resumes from its position
		}
		var ok bool
		if results, ok = b.processInbox(ctx, dbCtx, items); ok {
			break
		}
		if !b.seqMoved {
			return false, false
		}
		// A watermark moved under the batch (another member, or a
		// failover that lost commits): the gaps are checked again against
		// what the database holds now.
		b.seqMoved = false
	}
	// Every message whose effect committed is finished, also those after a
	// failure: the tracker still holds the commit back at the failure.
	for i, it := range items {
		if o := results[i].Outcome; o == inbox.Processed || o == inbox.Duplicate {
			b.finish(it, o)
		}
	}
	for i, it := range items {
		r := results[i]
		if r.Outcome == inbox.Processed || r.Outcome == inbox.Duplicate {
			continue
		}
		var res resolution
		switch {
		case it.extractErr != nil:
			res = b.applyPolicy(ctx, dbCtx, it, ReasonNoEventID, it.extractErr)
		case it.seqErr != nil:
			res = b.applyPolicy(ctx, dbCtx, it, ReasonInvalid, it.seqErr)
		default:
			res = b.retryInbox(ctx, dbCtx, it, r.Err)
		}
		switch res {
		case stopped:
			return true, false
		case abandoned:
			return false, false
		}
	}
	return gap != nil, gap == nil
}

// runBatch is package inbox's batch engine, which ProcessBatch and
// ProcessBatchFunc run with no options, called with the consumer's.
var runBatch = batchopt.Lookup[*inbox.Inbox, inbox.Message, inbox.Handler, inbox.BatchHandler, inbox.Result, inbox.Outcome]()

// processInbox runs the messages with an id through inbox.ProcessBatch, in
// one transaction, retrying without limit while the batch as a whole cannot
// commit because the database failed. results[i] belongs to items[i]; items
// without id are Failed. ok is false when the worker is stopping and the
// batch did not commit.
//
// With Offsets.Store the partition's next offset is written in the batch's
// transaction, after the longest run of items from the start of the batch
// that this transaction finishes, as ProcessBatch decided them (one
// admission per message and attempt): the stored offset never passes a
// message that failed, was rejected or is still to be retried. Everything
// before the batch is finished: a worker resolves each batch before the next.
// What finishes without such a write (a call that runs no transaction, all
// of its messages duplicates a watermark covers; messages that committed
// before a failed one this call retries alone) is stored before its Kafka
// commit (committer.storeCommittable).
func (b *batchRunner) processInbox(ctx, dbCtx context.Context, items []*item) (results []inbox.Result, ok bool) {
	call := b.newInboxCall(items)
	if len(call.msgs) == 0 {
		return call.results, true
	}
	callCtx := dbCtx
	if b.com.store {
		// The call runs under a context of its own, which a write of the
		// stored offset refused because a newer generation took the
		// partition over cancels: the batch then rolls back as on a
		// rebalance (the inbox logs that at Info), not as a failure of its
		// messages.
		var cancelCall context.CancelCauseFunc
		callCtx, cancelCall = context.WithCancelCause(dbCtx)
		defer cancelCall(nil)
		call.storeOffset(b.com, cancelCall)
	}
	if len(b.contexts) > 0 {
		call.opts.Contexts = make([]context.Context, len(call.msgs))
		for j, i := range call.idx {
			call.opts.Contexts[j] = b.messageContext(callCtx, items[i])
		}
	}
	// The consumer reports each message's outcome once it is decided.
	call.opts.CallerReportsOutcomes = true
	// The consumer owns the retries of what it runs through the inbox (see
	// the fault model in docs/RELIABILITY.md).
	call.opts.CallerRetries = true
	// BEGIN, the claim, the stored offset's write, COMMIT and ROLLBACK each
	// within Timeouts.Database.
	call.opts.Bound = b.bound
	// The stall clock runs until the batch commits or fails for a reason of
	// a message's own; database failures retried below do not stop it.
	b.beginDB()
	defer b.endDB()
	for attempt := 1; ; attempt++ {
		if !b.markCall(ctx, dbCtx, call) {
			return nil, false
		}
		rs, err := b.runInbox(callCtx, call)
		if err == nil {
			return b.inboxCommitted(ctx, call, rs)
		}
		if !b.inboxFailed(ctx, dbCtx, callCtx, call, attempt, err) {
			return nil, false
		}
	}
}

// inboxCall is one call of processInbox: its items, the inbox's messages
// made of those with an id, and the options of the inbox's batch engine.
type inboxCall struct {
	items    []*item
	results  []inbox.Result // results[i] belongs to items[i]
	msgs     []inbox.Message
	msgIndex []int     // items[i] is msgs[msgIndex[i]], or -1
	idx      []int     // msgs[j] is items[idx[j]]
	seqOf    []*seqPos // seqOf[j]: msgs[j]'s place in its sequenced stream, or nil
	opts     batchopt.Options[inbox.Outcome]
	// written is the highest stored offset the call wrote (nil without
	// Offsets.Store; -1: none).
	written *int64
}

// newInboxCall makes the call of items: an item without id, or with bad
// sequence headers, is Failed at once; the others take an attempt.
func (b *batchRunner) newInboxCall(items []*item) *inboxCall {
	call := &inboxCall{
		items:    items,
		results:  make([]inbox.Result, len(items)),
		msgs:     make([]inbox.Message, 0, len(items)),
		msgIndex: make([]int, len(items)),
		idx:      make([]int, 0, len(items)),
	}
	if b.seq != nil {
		call.seqOf = make([]*seqPos, 0, len(items))
	}
	for i, it := range items {
		call.msgIndex[i] = -1
		if it.extractErr != nil || it.seqErr != nil {
			call.results[i] = inbox.Result{Outcome: inbox.Failed, Err: cmp.Or(it.extractErr, it.seqErr)}
			continue
		}
		it.attempts++
		call.msgIndex[i] = len(call.msgs)
		call.msgs = append(call.msgs, b.inboxMessage(it))
		call.idx = append(call.idx, i)
		if b.seq != nil {
			call.seqOf = append(call.seqOf, it.seq)
		}
	}
	return call
}

// storeOffset makes each transaction of the call write the stored offset
// after the longest run of items from the start of the call that it
// finishes (see processInbox), through com. A write refused because a newer
// generation took the partition over cancels the call (cancelCall).
func (call *inboxCall) storeOffset(com *committer, cancelCall context.CancelCauseFunc) {
	call.written = new(int64)
	*call.written = -1
	call.opts.BeforeCommit = func(ctx context.Context, tx *gorm.DB, outcomes []inbox.Outcome) error {
		last := -1
		for i := range call.items {
			j := call.msgIndex[i]
			if j < 0 || (outcomes[j] != inbox.Processed && outcomes[j] != inbox.Duplicate) {
				break
			}
			last = i
		}
		if last < 0 {
			return nil
		}
		m := &call.items[last].msg.Message
		next := m.Offset + 1
		if err := com.advanceIn(ctx, tx, next, fingerprint(m)); err != nil {
			if errors.Is(err, storage.ErrOffsetTakenOver) {
				cancelCall(err)
			}
			return err
		}
		*call.written = max(*call.written, next)
		return nil
	}
}

// markCall gives the call, before each run, the watermarks of its
// sequenced streams (read first if needed) and their writer. ok is false if
// ctx ended first or the watermarks cannot be read.
func (b *batchRunner) markCall(ctx, dbCtx context.Context, call *inboxCall) (ok bool) {
	if b.seq == nil {
		return true
	}
	if !b.ensureLoaded(ctx, dbCtx) {
		return false
	}
	call.opts.Seq = b.seq.marks(call.seqOf, time.Now().Before(b.seqRowsUntil))
	call.opts.Watermarks = nil
	if call.opts.Seq != nil {
		call.opts.Watermarks = b.seq.writer(call.seqOf)
	}
	return true
}

// runInbox is one run of the call through the inbox's batch engine, under
// callCtx.
func (b *batchRunner) runInbox(callCtx context.Context, call *inboxCall) ([]inbox.Result, error) {
	if b.batchHandler != nil {
		return runBatch(callCtx, b.inboxOf, call.msgs, nil, b.wrapBatch(call.items), call.opts)
	}
	return runBatch(callCtx, b.inboxOf, call.msgs, b.wrap(call.items), nil, call.opts)
}

// inboxCommitted takes the results of a run of the call that succeeded,
// rs, one per message, and returns them one per item, as processInbox.
func (b *batchRunner) inboxCommitted(ctx context.Context, call *inboxCall, rs []inbox.Result) (results []inbox.Result, ok bool) {
	// Every transaction of a call that succeeded committed, but for
	// one whose COMMIT a split refused after its write: then the
	// floor is too high, and the next write finds the position
	// "moved" and resumes from the database's: redeliveries only.
	if call.written != nil {
		b.com.raiseFloor(*call.written)
	}
	if b.seq != nil {
		twice := b.seq.committed(call.seqOf, func(j int) inbox.Outcome { return rs[j].Outcome })
		b.reportTakenTwice(twice, func(j int) int64 { return call.items[call.idx[j]].msg.Offset })
	}
	processed := 0
	for j, i := range call.idx {
		call.results[i] = rs[j]
		if rs[j].Outcome == inbox.Processed {
			processed++
		}
	}
	if b.afterCommit(ctx, processed) {
		return call.results, false
	}
	return call.results, true
}

// inboxFailed handles err, the failure of a run of the call as a whole
// (its attempt-th), and reports whether to run it again, after a backoff.
// It does not when the worker is stopping, the stored offset was lost
// (b.com.lost) or a watermark moved under the call (b.seqMoved).
func (b *batchRunner) inboxFailed(ctx, dbCtx, callCtx context.Context, call *inboxCall, attempt int, err error) (again bool) {
	if taken := context.Cause(callCtx); errors.Is(taken, storage.ErrOffsetTakenOver) {
		b.com.lost = taken // rolled back; run finds out whether this member lost the partition
		return false
	}
	if dbCtx.Err() != nil || ctx.Err() != nil {
		return false // stopping: the batch was rolled back and will be redelivered
	}
	if errors.Is(err, storage.ErrOffsetMoved) {
		b.com.lost = err // rolled back; run resumes from the database's position
		return false
	}
	wait := b.retryWait(attempt)
	if b.seq != nil {
		// Transactions of the call may have committed before the
		// failure: the watermarks are read again before the next run.
		b.seq.loaded = false
		if errors.Is(err, storage.ErrWatermarkMoved) {
			level := slog.LevelInfo
			if attempt >= 5 {
				level = slog.LevelError // still retried: members keep writing the stream
			}
			b.log.Log(ctx, level, "a watermark moved since it was read (another member wrote it, or the database lost commits in a failover); reading it again",
				"messages", len(call.msgs), "error", err, "retry_in", wait)
			if backoff.Sleep(ctx, wait) != nil {
				return false
			}
			// Not the messages' doing: their run does not count.
			for _, i := range call.idx {
				call.items[i].attempts--
			}
			b.seqMoved = true
			return false
		}
	}
	level := slog.LevelWarn
	if attempt >= 5 {
		level = slog.LevelError // still retried: the database, not the messages, is failing
	}
	b.log.Log(ctx, level, "the batch could not commit; retrying it", append([]any{"messages", len(call.msgs), "attempt", attempt, "error", err, "retry_in", wait},
		b.host.missingTables(dbCtx, err)...)...)
	b.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryBatch, Offset: -1, Attempt: attempt, Err: err})
	return backoff.Sleep(ctx, wait) == nil
}

// wrap adapts the user's Handler to the inbox.
func (b *batchRunner) wrap(items []*item) inbox.Handler {
	next := 0
	return func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		it := itemAt(items, m.Offset, &next)
		if it == nil {
			return fmt.Errorf("consumer: inbox handed back unknown offset %d", m.Offset)
		}
		return b.callHandler(ctx, tx, it.msg)
	}
}

// wrapBatch adapts the user's BatchHandler to the inbox.
func (b *batchRunner) wrapBatch(items []*item) inbox.BatchHandler {
	return func(ctx context.Context, tx *gorm.DB, ms []inbox.Message) error {
		batch := make([]Message, len(ms))
		next := 0
		for i, m := range ms {
			it := itemAt(items, m.Offset, &next)
			if it == nil {
				return fmt.Errorf("consumer: inbox handed back unknown offset %d", m.Offset)
			}
			batch[i] = it.msg
		}
		return b.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
			return b.batchHandler(ctx, tx, batch)
		})
	}
}

// itemAt is the item of items at offset, or nil. items are in offset
// order, as fetched (a search that misses looks at each, should the
// bookkeeping have been broken). The handlers get their messages in offset
// order too: items[*next] is looked at first, and *next moved past the
// item found.
func itemAt(items []*item, offset int64, next *int) *item {
	i, ok := *next, false
	if ok = i < len(items) && items[i].msg.Offset == offset; !ok {
		i, ok = slices.BinarySearchFunc(items, offset, func(it *item, off int64) int { return cmp.Compare(it.msg.Offset, off) })
	}
	if !ok {
		i = slices.IndexFunc(items, func(it *item) bool { return it.msg.Offset == offset })
		if i < 0 {
			return nil
		}
	}
	*next = i + 1
	return items[i]
}

// processIdempotent runs the handler for one message in its own
// transaction, without an inbox row, with the consumer's retries.
func (b *batchRunner) processIdempotent(ctx, dbCtx context.Context, it *item) resolution {
	defer b.endDB()
	for {
		it.attempts++
		b.beginDB()
		err := b.transact(dbCtx, func(tx *gorm.DB) error {
			if err := b.callAny(b.messageContext(dbCtx, it), tx, it.msg); err != nil {
				return err
			}
			if b.com.store {
				return b.storeInTx(dbCtx, func(ctx context.Context) error {
					return b.com.advanceIn(ctx, tx, it.msg.Offset+1, fingerprint(&it.msg.Message))
				})
			}
			return nil
		})
		if err != nil && !b.infrastructure(err) {
			b.endDB() // the database answered; the message failed
		}
		if errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver) {
			b.com.lost = err
			return abandoned
		}
		if err == nil {
			if b.com.store {
				b.com.raiseFloor(it.msg.Offset + 1)
			}
			if b.afterCommit(ctx, 1) {
				return abandoned
			}
			b.finish(it, inbox.Processed)
			return resolved
		}
		if ctx.Err() != nil {
			return abandoned
		}
		if b.infrastructure(err) {
			it.attempts = min(it.attempts, b.maxAttempts-1)
		} else if inbox.IsPermanent(err) {
			return b.applyPolicy(ctx, dbCtx, it, ReasonPermanent, err)
		} else if it.attempts >= b.maxAttempts {
			return b.applyPolicy(ctx, dbCtx, it, ReasonHandlerError, err)
		}
		wait := b.retryWait(it.attempts)
		attrs := []any{"offset", it.msg.Offset, "attempt", it.attempts, "error", err, "retry_in", wait}
		if b.infrastructure(err) {
			attrs = append(attrs, b.host.missingTables(dbCtx, err)...)
		}
		b.log.Warn("message failed; retrying", attrs...)
		b.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryMessage, EventID: it.msg.EventID, Offset: it.msg.Offset, Attempt: it.attempts, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
}

// processIdempotentBatch runs the BatchHandler for all items in one
// transaction without inbox rows, retrying it while the database fails.
// stopped means a message of the batch failed and nothing of it committed:
// the caller then runs the messages one by one, with their attempts.
func (b *batchRunner) processIdempotentBatch(ctx, dbCtx context.Context, items []*item) resolution {
	batch := make([]Message, len(items))
	for i, it := range items {
		batch[i] = it.msg
	}
	lastMsg := &items[len(items)-1].msg.Message
	next := lastMsg.Offset + 1
	b.beginDB()
	defer b.endDB()
	for attempt := 1; ; attempt++ {
		err := b.transact(dbCtx, func(tx *gorm.DB) error {
			if err := b.withTimeout(b.messageContext(dbCtx, items[0]), tx, func(ctx context.Context, tx *gorm.DB) error {
				return b.batchHandler(ctx, tx, batch)
			}); err != nil {
				return err
			}
			if b.com.store {
				return b.storeInTx(dbCtx, func(ctx context.Context) error {
					return b.com.advanceIn(ctx, tx, next, fingerprint(lastMsg))
				})
			}
			return nil
		})
		if errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver) {
			b.com.lost = err
			return abandoned
		}
		if err == nil {
			if b.com.store {
				b.com.raiseFloor(next)
			}
			if b.afterCommit(ctx, len(items)) {
				return abandoned
			}
			for _, it := range items {
				b.finish(it, inbox.Processed)
			}
			return resolved
		}
		if ctx.Err() != nil {
			return abandoned
		}
		if !b.infrastructure(err) {
			b.log.Warn("a batch failed; trying its messages one by one", "messages", len(items), "error", err)
			return stopped
		}
		wait := b.retryWait(attempt)
		b.log.Warn("the batch could not commit; retrying it", append([]any{"messages", len(items), "attempt", attempt, "error", err, "retry_in", wait},
			b.host.missingTables(dbCtx, err)...)...)
		b.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryBatch, Offset: -1, Attempt: attempt, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
}

// transact runs fn in one transaction without an inbox row, with the
// inbox's fault model (see inbox.IsDatabaseFailure): a panic in fn is
// returned as an *inbox.PanicError, a COMMIT the database refused as an
// *inbox.CommitError.
func (b *batchRunner) transact(ctx context.Context, fn func(tx *gorm.DB) error) error {
	err := txn.Transact(ctx, b.db, b.classifier, nil, b.bound, func(tx *gorm.DB) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &inbox.PanicError{Value: r, Stack: debug.Stack()}
			}
		}()
		return fn(tx)
	})
	if r, ok := err.(*txn.CommitRefused); ok {
		return &inbox.CommitError{Err: r.Err}
	}
	return err
}

// storeInTx runs write, the stored offset's write in a transaction of
// batchRunner.transact, within Timeouts.Database: past it, it is a database
// failure. Its other errors are returned as they are: after a handler that
// ignored a failed statement (on PostgreSQL the transaction is then
// aborted) the write fails for the handler's doing.
func (b *batchRunner) storeInTx(ctx context.Context, write func(ctx context.Context) error) error {
	sctx, bounded, cancel := txn.WithBound(ctx, "the stored offset's write", b.bound)
	err := bounded(write(sctx))
	cancel()
	if te := (*txn.TimeoutError)(nil); errors.As(err, &te) {
		return txn.DatabaseFailure("store offset", err)
	}
	return err
}

// messageContext is the context the processing of it runs under: ctx, as
// the ContextHooks made it.
func (b *batchRunner) messageContext(ctx context.Context, it *item) context.Context {
	for _, h := range b.contexts {
		if mctx := h.MessageContext(ctx, &it.msg); mctx != nil {
			ctx = mctx
		}
	}
	return ctx
}

// callAny runs Handler, or BatchHandler with msg alone.
func (b *batchRunner) callAny(ctx context.Context, tx *gorm.DB, msg Message) error {
	if b.handler == nil {
		return b.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
			return b.batchHandler(ctx, tx, []Message{msg})
		})
	}
	return b.callHandler(ctx, tx, msg)
}

// callHandler runs the user's handler, enforcing Config.Timeouts.Handler. A
// panic is left to the inbox (or batchRunner.transact), which recovers it as an
// *inbox.PanicError with its stack.
func (b *batchRunner) callHandler(ctx context.Context, tx *gorm.DB, msg Message) error {
	return b.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
		return b.handler(ctx, tx, msg)
	})
}

// withTimeout runs fn under Config.Timeouts.Handler: its context and
// transaction handle carry the deadline, and an overrun is the handler's
// failure (ErrHandlerTimeout), whatever fn returned, unless the handler
// timed out on a database that does not answer (see
// batchRunner.handlerTimedOutOnDatabase): then it is a database failure.
func (b *batchRunner) withTimeout(ctx context.Context, tx *gorm.DB, fn func(ctx context.Context, tx *gorm.DB) error) (err error) {
	timeout := b.handlerTimeout
	if timeout <= 0 {
		return fn(ctx, txn.ForApplication(tx))
	}
	outer := ctx
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if errors.Is(hctx.Err(), context.DeadlineExceeded) && outer.Err() == nil {
			if err == nil {
				err = fmt.Errorf("%w: handler did not finish within %v", ErrHandlerTimeout, timeout)
			} else {
				err = fmt.Errorf("%w: handler did not finish within %v: %w", ErrHandlerTimeout, timeout, err)
			}
			// Timed out on a database that does not answer: its failure.
			if derr := b.handlerTimedOutOnDatabase(outer, tx, err); derr != nil {
				err = derr
			}
		}
	}()
	return fn(hctx, txn.ForApplicationUnder(hctx, tx))
}

// finish marks a message done.
func (b *batchRunner) finish(it *item, o inbox.Outcome) {
	if err := b.com.tracker.markDone(it.msg.Offset); err != nil {
		b.log.Error("offset bookkeeping broken", "error", err)
	}
	kind := hooks.Processed
	if o == inbox.Duplicate {
		kind = hooks.Duplicate
		if b.log.Enabled(context.Background(), slog.LevelDebug) {
			// Checked first: the attributes allocate even when not logged.
			b.log.Debug("duplicate skipped", "offset", it.msg.Offset, "event_id", it.msg.EventID)
		}
	}
	b.emit(hooks.Event{Kind: kind, EventID: it.msg.EventID, Offset: it.msg.Offset, Sequenced: it.watermarked(), NoDedup: b.idempotent})
	next, _ := b.com.committable()
	b.host.clearStopped(b.topic, b.partition, next)
}

// inboxMessage is the inbox's view of an item.
func (b *batchRunner) inboxMessage(it *item) inbox.Message {
	return inbox.Message{
		Consumer:  b.consumer,
		ID:        it.msg.EventID,
		Time:      it.msg.EventTime,
		Topic:     b.topic,
		Partition: int32(b.partition),
		Offset:    it.msg.Offset,
	}
}

// afterCommit runs the tests' AfterDB knob (internal/testhooks) after a
// database commit and reports whether it simulated a crash.
func (b *batchRunner) afterCommit(ctx context.Context, processed int) bool {
	if b.afterDB == nil {
		return false
	}
	next, _ := b.com.committable()
	if errors.Is(b.afterDB(b.topic, b.partition, next, processed), testhooks.ErrCrash) {
		b.host.crash()
		<-ctx.Done()
		return true
	}
	return false
}
