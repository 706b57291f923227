package consumer

// Processing: a fetched batch through the inbox (or, for a naturally
// idempotent consumer, without it), the user's handlers and their timeout.

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
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// process handles a batch in order and reports whether the partition must
// stop. Messages left unfinished (the worker is stopping) are not marked
// done, so their offsets are not committed.
func (w *worker) process(ctx, dbCtx context.Context, batch []kafka.Message) (halt bool) {
	// The batch's items, and their places in sequenced streams, are
	// allocated together, not one by one.
	slab := make([]item, len(batch))
	items := make([]*item, len(batch))
	var positions []seqPos
	if w.seq != nil {
		positions = make([]seqPos, len(batch))
	}
	var source string // the last stream's source id, which its next messages share
	for i := range batch {
		m := &batch[i]
		if err := w.com.tracker.fetched(m.Offset); err != nil {
			w.log.Error("offset bookkeeping broken", "error", err)
		}
		id, at, err := extract(w.c.cfg.Extract, m)
		it := &slab[i]
		*it = item{msg: Message{Message: *m, EventID: id, EventTime: at}, extractErr: err}
		items[i] = it
		if err == nil && w.seq != nil {
			it.seq, it.seqErr = w.sequenceOf(m, &positions[i], source)
			if p := it.seq; p != nil {
				p.eventID = id
				source = p.stream.source
			}
		}
	}
	w.batch = items
	defer func() { w.batch = nil }()
	defer w.com.noteTail(w.lastOf)
	defer func() {
		last := batch[len(batch)-1]
		if last.HighWaterMark > 0 {
			next, _ := w.com.tracker.committable()
			w.emit(hooks.Event{Kind: hooks.Lag, Offset: next, Lag: max(last.HighWaterMark-next, 0)})
		}
	}()
	if w.c.cfg.NaturallyIdempotent {
		if w.c.cfg.BatchHandler != nil && len(items) > 1 {
			switch w.processIdempotentBatch(ctx, dbCtx, items) {
			case resolved:
				return false
			case abandoned:
				return false
			}
			// A message of the batch failed: each is tried alone below.
		}
		for _, it := range items {
			switch w.processIdempotent(ctx, dbCtx, it) {
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
		if halt, goOn := w.processSegment(ctx, dbCtx, items[:n]); !goOn {
			return halt
		}
		items = items[n:]
	}
	return false
}

// processSegment processes items, a batch or the part of one before a
// number its stream took again, through the inbox. halt says the partition
// must stop; goOn that the rest of the batch may follow (false also when
// the worker is stopping, with items left unfinished).
func (w *worker) processSegment(ctx, dbCtx context.Context, items []*item) (halt, goOn bool) {
	var gap *gapError
	var results []inbox.Result
	for {
		var stop bool
		if items, gap, stop = w.cutAtGap(ctx, dbCtx, items); stop {
			return true, false
		}
		if w.com.lost != nil {
			return false, false // the database went back: run resumes from its position
		}
		var ok bool
		if results, ok = w.processInbox(ctx, dbCtx, items); ok {
			break
		}
		if !w.seqMoved {
			return false, false
		}
		// A watermark moved under the batch (another member, or a
		// failover that lost commits): the gaps are checked again against
		// what the database holds now.
		w.seqMoved = false
	}
	// Every message whose effect committed is finished, also those after a
	// failure: the tracker still holds the commit back at the failure.
	for i, it := range items {
		if o := results[i].Outcome; o == inbox.Processed || o == inbox.Duplicate {
			w.finish(it, o)
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
			res = w.applyPolicy(ctx, dbCtx, it, ReasonNoEventID, it.extractErr)
		case it.seqErr != nil:
			res = w.applyPolicy(ctx, dbCtx, it, ReasonInvalid, it.seqErr)
		default:
			res = w.retryInbox(ctx, dbCtx, it, r.Err)
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
// With StoreOffsets the partition's next offset is written in the batch's
// transaction, after the longest run of items from the start of the batch
// that this transaction finishes, as ProcessBatch decided them (one
// admission per message and attempt): the stored offset never passes a
// message that failed, was rejected or is still to be retried. Everything
// before the batch is finished: a worker resolves each batch before the next.
// What finishes without such a write (a call that runs no transaction, all
// of its messages duplicates a watermark covers; messages that committed
// before a failed one this call retries alone) is stored before its Kafka
// commit (storeCommittable).
func (w *worker) processInbox(ctx, dbCtx context.Context, items []*item) (results []inbox.Result, ok bool) {
	results = make([]inbox.Result, len(items))
	msgs := make([]inbox.Message, 0, len(items))
	msgIndex := make([]int, len(items)) // items[i] is msgs[msgIndex[i]], or -1
	idx := make([]int, 0, len(items))
	var seqOf []*seqPos // seqOf[j]: msgs[j]'s place in its sequenced stream, or nil
	if w.seq != nil {
		seqOf = make([]*seqPos, 0, len(items))
	}
	for i, it := range items {
		msgIndex[i] = -1
		if it.extractErr != nil || it.seqErr != nil {
			results[i] = inbox.Result{Outcome: inbox.Failed, Err: cmp.Or(it.extractErr, it.seqErr)}
			continue
		}
		it.attempts++
		msgIndex[i] = len(msgs)
		msgs = append(msgs, w.inboxMessage(it))
		idx = append(idx, i)
		if w.seq != nil {
			seqOf = append(seqOf, it.seq)
		}
	}
	if len(msgs) == 0 {
		return results, true
	}
	var opts batchopt.Options[inbox.Outcome]
	callCtx := dbCtx
	var written *int64 // the highest stored offset this call wrote
	if w.c.cfg.StoreOffsets {
		// The call runs under a context of its own, which a write of the
		// stored offset refused because a newer generation took the
		// partition over cancels: the batch then rolls back as on a
		// rebalance (the inbox logs that at Info), not as a failure of its
		// messages.
		var cancelCall context.CancelCauseFunc
		callCtx, cancelCall = context.WithCancelCause(dbCtx)
		defer cancelCall(nil)
		written = new(int64)
		*written = -1
		opts.BeforeCommit = func(ctx context.Context, tx *gorm.DB, outcomes []inbox.Outcome) error {
			last := -1
			for i := range items {
				j := msgIndex[i]
				if j < 0 || (outcomes[j] != inbox.Processed && outcomes[j] != inbox.Duplicate) {
					break
				}
				last = i
			}
			if last < 0 {
				return nil
			}
			m := &items[last].msg.Message
			next := m.Offset + 1
			if err := w.com.advanceIn(ctx, tx, next, fingerprint(m)); err != nil {
				if errors.Is(err, storage.ErrOffsetTakenOver) {
					cancelCall(err)
				}
				return err
			}
			*written = max(*written, next)
			return nil
		}
	}
	if len(w.c.contexts) > 0 {
		opts.Contexts = make([]context.Context, len(msgs))
		for j, i := range idx {
			opts.Contexts[j] = w.messageContext(callCtx, items[i])
		}
	}
	// The consumer reports each message's outcome once it is decided.
	opts.CallerReportsOutcomes = true
	// The consumer owns the retries of what it runs through the inbox (see
	// the fault model in docs/RELIABILITY.md).
	opts.CallerRetries = true
	// BEGIN, the claim, the stored offset's write, COMMIT and ROLLBACK each
	// within DatabaseTimeout.
	opts.Bound = w.bound
	// The stall clock runs until the batch commits or fails for a reason of
	// a message's own; database failures retried below do not stop it.
	w.beginDB()
	defer w.endDB()
	for attempt := 1; ; attempt++ {
		if w.seq != nil {
			if !w.ensureLoaded(ctx, dbCtx) {
				return nil, false
			}
			opts.Seq = w.seq.marks(seqOf, time.Now().Before(w.c.cfg.SequencedRowsUntil))
			opts.Watermarks = nil
			if opts.Seq != nil {
				opts.Watermarks = w.seq.writer(seqOf)
			}
		}
		var rs []inbox.Result
		var err error
		if w.c.cfg.BatchHandler != nil {
			rs, err = runBatch(callCtx, w.c.cfg.Inbox, msgs, nil, w.wrapBatch(items), opts)
		} else {
			rs, err = runBatch(callCtx, w.c.cfg.Inbox, msgs, w.wrap(items), nil, opts)
		}
		if err == nil {
			// Every transaction of a call that succeeded committed, but for
			// one whose COMMIT a split refused after its write: then the
			// floor is too high, and the next write finds the position
			// "moved" and resumes from the database's: redeliveries only.
			if written != nil {
				w.com.raiseFloor(*written)
			}
			if w.seq != nil {
				twice := w.seq.committed(seqOf, func(j int) inbox.Outcome { return rs[j].Outcome })
				w.reportTakenTwice(twice, func(j int) int64 { return items[idx[j]].msg.Offset })
			}
			processed := 0
			for j, i := range idx {
				results[i] = rs[j]
				if rs[j].Outcome == inbox.Processed {
					processed++
				}
			}
			if w.afterCommit(ctx, processed) {
				return results, false
			}
			return results, true
		}
		if taken := context.Cause(callCtx); errors.Is(taken, storage.ErrOffsetTakenOver) {
			w.com.lost = taken // rolled back; run finds out whether this member lost the partition
			return nil, false
		}
		if dbCtx.Err() != nil || ctx.Err() != nil {
			return nil, false // stopping: the batch was rolled back and will be redelivered
		}
		if errors.Is(err, storage.ErrOffsetMoved) {
			w.com.lost = err // rolled back; run resumes from the database's position
			return nil, false
		}
		wait := w.retryWait(attempt)
		if w.seq != nil {
			// Transactions of the call may have committed before the
			// failure: the watermarks are read again before the next run.
			w.seq.loaded = false
			if errors.Is(err, storage.ErrWatermarkMoved) {
				level := slog.LevelInfo
				if attempt >= 5 {
					level = slog.LevelError // still retried: members keep writing the stream
				}
				w.log.Log(ctx, level, "a watermark moved since it was read (another member wrote it, or the database lost commits in a failover); reading it again",
					"messages", len(msgs), "error", err, "retry_in", wait)
				if backoff.Sleep(ctx, wait) != nil {
					return nil, false
				}
				// Not the messages' doing: their run does not count.
				for _, i := range idx {
					items[i].attempts--
				}
				w.seqMoved = true
				return nil, false
			}
		}
		level := slog.LevelWarn
		if attempt >= 5 {
			level = slog.LevelError // still retried: the database, not the messages, is failing
		}
		w.log.Log(ctx, level, "the batch could not commit; retrying it", append([]any{"messages", len(msgs), "attempt", attempt, "error", err, "retry_in", wait},
			w.host.missingTables(dbCtx, err)...)...)
		w.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryBatch, Offset: -1, Attempt: attempt, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return nil, false
		}
	}
}

// wrap adapts the user's Handler to the inbox.
func (w *worker) wrap(items []*item) inbox.Handler {
	next := 0
	return func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		it := itemAt(items, m.Offset, &next)
		if it == nil {
			return fmt.Errorf("consumer: inbox handed back unknown offset %d", m.Offset)
		}
		return w.callHandler(ctx, tx, it.msg)
	}
}

// wrapBatch adapts the user's BatchHandler to the inbox.
func (w *worker) wrapBatch(items []*item) inbox.BatchHandler {
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
		return w.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
			return w.c.cfg.BatchHandler(ctx, tx, batch)
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
func (w *worker) processIdempotent(ctx, dbCtx context.Context, it *item) resolution {
	defer w.endDB()
	for {
		it.attempts++
		w.beginDB()
		err := w.transact(dbCtx, func(tx *gorm.DB) error {
			if err := w.callAny(w.messageContext(dbCtx, it), tx, it.msg); err != nil {
				return err
			}
			if w.c.cfg.StoreOffsets {
				return w.storeInTx(dbCtx, func(ctx context.Context) error {
					return w.com.advanceIn(ctx, tx, it.msg.Offset+1, fingerprint(&it.msg.Message))
				})
			}
			return nil
		})
		if err != nil && !w.infrastructure(err) {
			w.endDB() // the database answered; the message failed
		}
		if errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver) {
			w.com.lost = err
			return abandoned
		}
		if err == nil {
			if w.c.cfg.StoreOffsets {
				w.com.raiseFloor(it.msg.Offset + 1)
			}
			if w.afterCommit(ctx, 1) {
				return abandoned
			}
			w.finish(it, inbox.Processed)
			return resolved
		}
		if ctx.Err() != nil {
			return abandoned
		}
		if w.infrastructure(err) {
			it.attempts = min(it.attempts, w.c.cfg.MaxAttempts-1)
		} else if inbox.IsPermanent(err) {
			return w.applyPolicy(ctx, dbCtx, it, ReasonPermanent, err)
		} else if it.attempts >= w.c.cfg.MaxAttempts {
			return w.applyPolicy(ctx, dbCtx, it, ReasonHandlerError, err)
		}
		wait := w.retryWait(it.attempts)
		attrs := []any{"offset", it.msg.Offset, "attempt", it.attempts, "error", err, "retry_in", wait}
		if w.infrastructure(err) {
			attrs = append(attrs, w.host.missingTables(dbCtx, err)...)
		}
		w.log.Warn("message failed; retrying", attrs...)
		w.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryMessage, EventID: it.msg.EventID, Offset: it.msg.Offset, Attempt: it.attempts, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
}

// processIdempotentBatch runs the BatchHandler for all items in one
// transaction without inbox rows, retrying it while the database fails.
// stopped means a message of the batch failed and nothing of it committed:
// the caller then runs the messages one by one, with their attempts.
func (w *worker) processIdempotentBatch(ctx, dbCtx context.Context, items []*item) resolution {
	batch := make([]Message, len(items))
	for i, it := range items {
		batch[i] = it.msg
	}
	lastMsg := &items[len(items)-1].msg.Message
	next := lastMsg.Offset + 1
	w.beginDB()
	defer w.endDB()
	for attempt := 1; ; attempt++ {
		err := w.transact(dbCtx, func(tx *gorm.DB) error {
			if err := w.withTimeout(w.messageContext(dbCtx, items[0]), tx, func(ctx context.Context, tx *gorm.DB) error {
				return w.c.cfg.BatchHandler(ctx, tx, batch)
			}); err != nil {
				return err
			}
			if w.c.cfg.StoreOffsets {
				return w.storeInTx(dbCtx, func(ctx context.Context) error {
					return w.com.advanceIn(ctx, tx, next, fingerprint(lastMsg))
				})
			}
			return nil
		})
		if errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver) {
			w.com.lost = err
			return abandoned
		}
		if err == nil {
			if w.c.cfg.StoreOffsets {
				w.com.raiseFloor(next)
			}
			if w.afterCommit(ctx, len(items)) {
				return abandoned
			}
			for _, it := range items {
				w.finish(it, inbox.Processed)
			}
			return resolved
		}
		if ctx.Err() != nil {
			return abandoned
		}
		if !w.infrastructure(err) {
			w.log.Warn("a batch failed; trying its messages one by one", "messages", len(items), "error", err)
			return stopped
		}
		wait := w.retryWait(attempt)
		w.log.Warn("the batch could not commit; retrying it", append([]any{"messages", len(items), "attempt", attempt, "error", err, "retry_in", wait},
			w.host.missingTables(dbCtx, err)...)...)
		w.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryBatch, Offset: -1, Attempt: attempt, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
}

// transact runs fn in one transaction without an inbox row, with the
// inbox's fault model (see inbox.IsDatabaseFailure): a panic in fn is
// returned as an *inbox.PanicError, a COMMIT the database refused as an
// *inbox.CommitError.
func (w *worker) transact(ctx context.Context, fn func(tx *gorm.DB) error) error {
	err := txn.Transact(ctx, w.db, w.classifier, nil, w.bound, func(tx *gorm.DB) (err error) {
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
// worker.transact, within DatabaseTimeout: past it, it is a database
// failure. Its other errors are returned as they are: after a handler that
// ignored a failed statement (on PostgreSQL the transaction is then
// aborted) the write fails for the handler's doing.
func (w *worker) storeInTx(ctx context.Context, write func(ctx context.Context) error) error {
	sctx, bounded, cancel := txn.WithBound(ctx, "the stored offset's write", w.bound)
	err := bounded(write(sctx))
	cancel()
	if te := (*txn.TimeoutError)(nil); errors.As(err, &te) {
		return txn.DatabaseFailure("store offset", err)
	}
	return err
}

// messageContext is the context the processing of it runs under: ctx, as
// the ContextHooks made it.
func (w *worker) messageContext(ctx context.Context, it *item) context.Context {
	for _, h := range w.c.contexts {
		if mctx := h.MessageContext(ctx, &it.msg); mctx != nil {
			ctx = mctx
		}
	}
	return ctx
}

// callAny runs Handler, or BatchHandler with msg alone.
func (w *worker) callAny(ctx context.Context, tx *gorm.DB, msg Message) error {
	if w.c.cfg.Handler == nil {
		return w.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
			return w.c.cfg.BatchHandler(ctx, tx, []Message{msg})
		})
	}
	return w.callHandler(ctx, tx, msg)
}

// callHandler runs the user's handler, enforcing Config.HandlerTimeout. A
// panic is left to the inbox (or worker.transact), which recovers it as an
// *inbox.PanicError with its stack.
func (w *worker) callHandler(ctx context.Context, tx *gorm.DB, msg Message) error {
	return w.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
		return w.c.cfg.Handler(ctx, tx, msg)
	})
}

// withTimeout runs fn under Config.HandlerTimeout: its context and
// transaction handle carry the deadline, and an overrun is the handler's
// failure (ErrHandlerTimeout), whatever fn returned, unless the handler
// timed out on a database that does not answer (see
// worker.handlerTimedOutOnDatabase): then it is a database failure.
func (w *worker) withTimeout(ctx context.Context, tx *gorm.DB, fn func(ctx context.Context, tx *gorm.DB) error) (err error) {
	timeout := w.c.cfg.HandlerTimeout
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
			if derr := w.handlerTimedOutOnDatabase(outer, tx, err); derr != nil {
				err = derr
			}
		}
	}()
	return fn(hctx, txn.ForApplicationUnder(hctx, tx))
}

// finish marks a message done.
func (w *worker) finish(it *item, o inbox.Outcome) {
	if err := w.com.tracker.markDone(it.msg.Offset); err != nil {
		w.log.Error("offset bookkeeping broken", "error", err)
	}
	kind := hooks.Processed
	if o == inbox.Duplicate {
		kind = hooks.Duplicate
		if w.log.Enabled(context.Background(), slog.LevelDebug) {
			// Checked first: the attributes allocate even when not logged.
			w.log.Debug("duplicate skipped", "offset", it.msg.Offset, "event_id", it.msg.EventID)
		}
	}
	w.emit(hooks.Event{Kind: kind, EventID: it.msg.EventID, Offset: it.msg.Offset, Sequenced: it.watermarked(), NoDedup: w.c.cfg.NaturallyIdempotent})
	next, _ := w.com.tracker.committable()
	w.c.clearStopped(w.topic, w.partition, next)
}

// inboxMessage is the inbox's view of an item.
func (w *worker) inboxMessage(it *item) inbox.Message {
	return inbox.Message{
		Consumer:  w.c.cfg.Consumer,
		ID:        it.msg.EventID,
		Time:      it.msg.EventTime,
		Topic:     w.topic,
		Partition: int32(w.partition),
		Offset:    it.msg.Offset,
	}
}
