package inbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Result is the outcome of one message of a batch. Err is set exactly when
// Outcome is Failed.
type Result struct {
	Outcome Outcome
	Err     error
}

// BatchHandler applies the effect of msgs, every one of them seen for the
// first time, inside tx, in one call: a set-based statement for all of them
// is what makes batches cheap. Like a Handler it must write through tx only
// and must not commit or roll back tx. Returning an error (or panicking)
// rolls back the whole transaction; ProcessBatchFunc then splits the batch
// to find the message that fails.
//
// Two messages of a batch can change the same row. One set-based statement
// that lists the row twice changes it once, silently, while both inbox rows
// say processed: PostgreSQL's and SQLite's UPDATE ... FROM take one of the
// source rows that match a target row, and MariaDB's multi-table UPDATE
// updates a row once whatever it joins. Sum (or otherwise combine) the
// changes per row first, and list each row once (the adapters' examples
// Example_batchHandlerSumsPerKey).
type BatchHandler func(ctx context.Context, tx *gorm.DB, msgs []Message) error

// ProcessBatch processes msgs in one transaction with one multi-row claim,
// running h only for the messages seen for the first time, in their order in
// msgs. results[i] tells what happened to msgs[i].
//
// Every message is admitted (validated, and checked against the retention
// window) once per call, against one reading of the clock, before any
// transaction starts.
//
// A message that cannot be processed is isolated: invalid and expired
// messages fail before the transaction starts; if h fails for a message
// (after retries, if its error is marked [Retryable]), the transaction is
// rolled back and run again without that message, so every other message
// still commits. If COMMIT refuses the batch for a reason that is not
// transient (a deferred constraint: a *CommitError), or a handler fails
// after an earlier handler of the transaction ignored a failed statement
// (which on PostgreSQL aborts the transaction for every later message), the
// batch is split in halves, each run in its own transaction, until the
// failure is pinned on the message that causes it. A message repeated
// inside msgs is handled once; its later copies get the first copy's
// outcome (Duplicate if that was Processed).
//
// The error is non-nil only when the batch as a whole could not commit (a
// database failure, see [IsDatabaseFailure], or ctx ended): then every
// message not already decided is Failed with that error, and nothing of the
// transaction that failed was committed (messages of earlier transactions
// of the same call, after a split, keep their outcome).
func (ib *Inbox) ProcessBatch(ctx context.Context, msgs []Message, h Handler) ([]Result, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: ProcessBatch needs a handler", ErrInvalidConfig)
	}
	return ib.processBatch(ctx, &batchRun{ib: ib, msgs: msgs, h: h})
}

func init() {
	batchopt.Register(func(ctx context.Context, ib *Inbox, msgs []Message, h Handler, bh BatchHandler, opts batchopt.Options[Outcome]) ([]Result, error) {
		if (h == nil) == (bh == nil) {
			return nil, fmt.Errorf("%w: the batch engine needs one handler", ErrInvalidConfig)
		}
		return ib.processBatch(ctx, &batchRun{ib: ib, msgs: msgs, h: h, bh: bh, opts: opts})
	})
	batchopt.RegisterShared(func(ib *Inbox) batchopt.Shared {
		return batchopt.Shared{Logger: ib.cfg.Logger, Hooks: ib.hooks.All()}
	})
}

// ProcessBatchFunc is ProcessBatch with a batch handler: h is called once
// per transaction with all the new messages of the batch, in their order in
// msgs (duplicates left out; h is not called when there is none). If h
// fails (after retries, if its error is marked [Retryable]) or COMMIT
// refuses the batch, the batch is split in halves, each run in its own
// transaction, until the failing messages are alone: they fail, all others
// commit. A failing batch of n messages thus costs about 2·log2(n) more
// transactions per poison message.
func (ib *Inbox) ProcessBatchFunc(ctx context.Context, msgs []Message, h BatchHandler) ([]Result, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: ProcessBatchFunc needs a batch handler", ErrInvalidConfig)
	}
	return ib.processBatch(ctx, &batchRun{ib: ib, msgs: msgs, bh: h})
}

// processBatch runs b with b.opts: the zero Options for ProcessBatch and
// ProcessBatchFunc, the consumer's through package batchopt.
func (ib *Inbox) processBatch(ctx context.Context, b *batchRun) ([]Result, error) {
	start := time.Now()
	msgs := b.msgs
	ends := b.startMessages(ctx)
	now := ib.cfg.Now()
	results := make([]Result, len(msgs))
	var firstOf map[storage.InboxKey]int // one message has no copy to find
	if len(msgs) > 1 {
		firstOf = make(map[storage.InboxKey]int, len(msgs))
	}
	var copiesOf map[int][]int
	pending := make([]int, 0, len(msgs))
	if b.opts.Seq != nil && len(b.opts.Seq) != len(msgs) {
		return nil, fmt.Errorf("%w: %d dedup marks for %d messages", ErrInvalidConfig, len(b.opts.Seq), len(msgs))
	}
	b.results = results
	var blocked map[int]bool // chains a message failed in before any transaction
	for i, m := range msgs {
		mk := b.mark(i)
		var err error
		if mk.Chain > 0 && !mk.Claim {
			// No inbox row: neither its day's storage nor the rows'
			// retention concern it.
			err = m.Validate()
		} else {
			err = ib.admit(m, now)
		}
		switch {
		case err != nil:
			results[i] = Result{Outcome: Failed, Err: err}
			if mk.Chain > 0 {
				if blocked == nil {
					blocked = map[int]bool{}
				}
				blocked[mk.Chain] = true
			}
			continue
		case mk.Chain > 0 && mk.Applied:
			results[i] = Result{Outcome: Duplicate}
		case blocked[mk.Chain]:
			results[i] = b.heldBack(i)
			continue
		}
		if firstOf != nil {
			k := m.row().Key()
			if first, seen := firstOf[k]; seen {
				if copiesOf == nil {
					copiesOf = map[int][]int{}
					b.copiesOf = copiesOf
				}
				copiesOf[first] = append(copiesOf[first], i)
				continue
			}
			firstOf[k] = i
		}
		if results[i].Outcome == 0 {
			pending = append(pending, i)
		}
	}

	var batchErr error
	failMessage := func(idx int, err error) {
		results[idx] = Result{Outcome: Failed, Err: fmt.Errorf("inbox: consumer %q event %q: %w", msgs[idx].Consumer, msgs[idx].ID, err)}
	}
	// queue holds the groups still to run, in message order: a split puts
	// both halves in front.
	var queue [][]int
	if len(pending) > 0 {
		queue = append(queue, pending)
	}
	for len(queue) > 0 {
		group := queue[0]
		outcomes, failedIdx, err := b.attempt(ctx, group)
		switch {
		case err == nil:
			for _, idx := range group {
				results[idx] = Result{Outcome: outcomes[idx]}
			}
			queue = queue[1:]
		case failedIdx >= 0:
			failMessage(failedIdx, err)
			rest := slices.DeleteFunc(slices.Clone(group), func(idx int) bool { return idx == failedIdx })
			if len(rest) == 0 {
				queue = queue[1:]
			} else {
				queue[0] = rest
			}
			queue = b.holdAfter(failedIdx, queue)
		case ctx.Err() != nil || IsDatabaseFailure(err):
			n := 0
			for _, g := range queue {
				n += len(g)
			}
			batchErr = fmt.Errorf("inbox: batch of %d messages: %w", n, err)
			for _, g := range queue {
				for _, idx := range g {
					results[idx] = Result{Outcome: Failed, Err: batchErr}
				}
			}
			queue = nil
		case len(group) == 1:
			failMessage(group[0], err)
			queue = b.holdAfter(group[0], queue[1:])
		default:
			ib.log.Warn("a batch failed for a reason no single message can be blamed for yet; splitting it to find the cause",
				"messages", len(group), "error", err)
			half := len(group) / 2
			queue = append([][]int{group[:half], group[half:]}, queue[1:]...)
		}
	}

	for first, copies := range copiesOf {
		r := results[first]
		if r.Outcome == Processed {
			r.Outcome = Duplicate
		}
		for _, idx := range copies {
			results[idx] = r
		}
	}
	for i, r := range results {
		end := endMessage
		if ends != nil {
			end = ends[i]
		}
		ib.recordFor(b.ctxOf(ctx, i), msgs[i], r.Outcome, r.Err, start, end, !b.opts.CallerReportsOutcomes, b.opts.CallerRetries)
	}
	return results, batchErr
}

// startMessages gives each message its context (batchopt's Contexts)
// and starts its MessageTracer hooks. ends[i] ends msgs[i]'s hook;
// it is nil, and so is b.ctxs, when neither is in use.
func (b *batchRun) startMessages(ctx context.Context) (ends []func(Outcome, error)) {
	given := b.opts.Contexts
	traced := b.ib.hooks.HasMessageTracers()
	if given == nil && !traced {
		return nil
	}
	b.ctxs = make([]context.Context, len(b.msgs))
	ends = make([]func(Outcome, error), len(b.msgs))
	for i, m := range b.msgs {
		mctx := ctx
		if given != nil {
			mctx = orContext(given[i], ctx)
		}
		if traced && b.mark(i).Chain > 0 {
			// Tells the tracers the message is deduplicated by its stream's
			// watermark; marked only when traced, as the mark allocates.
			mctx = hooks.WithSequenced(mctx, m.row())
		}
		b.ctxs[i], ends[i] = b.ib.startMessage(mctx, m)
	}
	return ends
}

// ctxOf is the context of msgs[i]: its own (see startMessages), or ctx.
func (b *batchRun) ctxOf(ctx context.Context, i int) context.Context {
	if b.ctxs == nil {
		return ctx
	}
	return b.ctxs[i]
}

// mark is the caller's dedup decision for msgs[i] (see batchopt.SeqMark).
func (b *batchRun) mark(i int) batchopt.SeqMark {
	if b.opts.Seq == nil {
		return batchopt.SeqMark{}
	}
	return b.opts.Seq[i]
}

// heldBack is the result of msgs[i], held back behind an earlier message of
// its chain.
func (b *batchRun) heldBack(i int) Result {
	m := b.msgs[i]
	return Result{Outcome: Failed, Err: fmt.Errorf("inbox: consumer %q event %q: %w", m.Consumer, m.ID, batchopt.ErrHeldBack)}
}

// holdAfter holds back every message of queue that comes after msgs[failed]
// in its chain, and returns what is left of queue: a watermark written with
// them would pass the failed message, whose retry would then be taken for a
// duplicate.
func (b *batchRun) holdAfter(failed int, queue [][]int) [][]int {
	chain := b.mark(failed).Chain
	if chain <= 0 {
		return queue
	}
	out := queue[:0]
	for _, g := range queue {
		g = slices.DeleteFunc(g, func(idx int) bool {
			if idx > failed && b.mark(idx).Chain == chain {
				b.results[idx] = b.heldBack(idx)
				return true
			}
			return false
		})
		if len(g) > 0 {
			out = append(out, g)
		}
	}
	return out
}

// unclearBlame is a handler failure in a transaction in which an earlier
// handler's statement had failed: which message is at fault is found by
// running them one per transaction.
type unclearBlame struct{ err error }

func (e *unclearBlame) Error() string { return e.err.Error() }
func (e *unclearBlame) Unwrap() error { return e.err }

// batchRun is one ProcessBatch or ProcessBatchFunc call.
type batchRun struct {
	ib       *Inbox
	msgs     []Message
	h        Handler      // per message; nil with bh
	bh       BatchHandler // per transaction; nil with h
	opts     batchopt.Options[Outcome]
	ctxs     []context.Context // ctxs[i] is msgs[i]'s context; nil if all use the call's
	results  []Result          // final results so far
	copiesOf map[int][]int
}

// attempt runs the transaction for the messages of group, with retries. On
// a per-message handler's failure it returns the failing message's index;
// on any other failure, -1: a database failure (or the end of ctx) fails
// the batch, anything else is to be pinned by splitting the group.
func (b *batchRun) attempt(ctx context.Context, group []int) ([]Outcome, int, error) {
	ib := b.ib
	var outcomes []Outcome
	failedIdx := -1
	// Messages of a chain that do not claim have no inbox row.
	rows := make([]storage.InboxRow, 0, len(group))
	rowOf := make([]int, len(group)) // rows[rowOf[j]] is group[j]'s row; -1: none
	for j, idx := range group {
		rowOf[j] = -1
		if mk := b.mark(idx); mk.Chain <= 0 || mk.Claim {
			rowOf[j] = len(rows)
			rows = append(rows, b.msgs[idx].row())
		}
	}
	days := ib.newDays(rows)
	err := ib.retryUnless(ctx, b.opts.CallerRetries, func(int) error {
		return days.run(ctx, func() error { return b.run(ctx, group, rows, rowOf, &outcomes, &failedIdx) })
	})
	if err != nil && (ctx.Err() != nil || IsDatabaseFailure(err)) {
		// The database failed, or the context ended: nothing committed,
		// whichever message was running, and it is not that message's fault.
		return nil, -1, err
	}
	return outcomes, failedIdx, err
}

// run is one transaction of attempt.
func (b *batchRun) run(ctx context.Context, group []int, rows []storage.InboxRow, rowOf []int, outcomesP *[]Outcome, failedIdxP *int) error {
	ib := b.ib
	*failedIdxP = -1
	// outcomes[i] is msgs[i]'s in this transaction, zero for the messages
	// outside group: indexed, not a map, as this runs per transaction.
	if *outcomesP == nil {
		*outcomesP = make([]Outcome, len(b.msgs))
	} else {
		clear(*outcomesP) // a retry
	}
	outcomes := *outcomesP
	// The claim covers the whole group: it is traced under the first
	// message's context, the transaction runs under the call's.
	var writes []storage.WatermarkWrite
	if b.opts.Watermarks != nil {
		writes = b.opts.Watermarks(group, b.view(nil))
	}
	return ib.claimTxAt(ctx, b.ctxOf(ctx, group[0]), b.opts.Bound, rows, writes, func(tx *gorm.DB, claimed []bool) error {
		inserted := make([]bool, len(group))
		for j := range group {
			inserted[j] = rowOf[j] < 0 || claimed[rowOf[j]]
		}
		if b.bh != nil {
			fresh := make([]Message, 0, len(group))
			first := -1
			for j, idx := range group {
				if inserted[j] {
					if first < 0 {
						first = idx
					}
					fresh = append(fresh, b.msgs[idx])
					outcomes[idx] = Processed
				} else {
					outcomes[idx] = Duplicate
				}
			}
			if len(fresh) > 0 {
				if err := ib.handleBatch(b.ctxOf(ctx, first), tx, fresh, b.bh); err != nil {
					return err
				}
			}
		} else {
			st := txn.StatementsOf(tx)
			firstFailure := -1 // the message during whose handler a statement failed first
			for j, idx := range group {
				if !inserted[j] {
					outcomes[idx] = Duplicate
					continue
				}
				before := st.FirstFailure()
				err := ib.handle(b.ctxOf(ctx, idx), tx, b.msgs[idx], b.h)
				if after := st.FirstFailure(); before == nil && after != nil {
					firstFailure = idx
				}
				if err != nil {
					if firstFailure >= 0 && firstFailure != idx {
						// An earlier handler ignored a failed statement; on
						// PostgreSQL that aborted the transaction, and this
						// message may only suffer from it.
						return &unclearBlame{err: err}
					}
					*failedIdxP = idx
					return err
				}
				outcomes[idx] = Processed
			}
		}
		if b.opts.BeforeCommit != nil {
			// A handler that ignored a failed statement may have left the
			// transaction unusable (PostgreSQL aborts it: 25P02), so that the
			// writes before COMMIT fail too: that is the handler's doing, not
			// the database's, and must not be retried as an outage.
			ignored := txn.StatementsOf(tx).FirstFailure()
			bctx, bounded, cancel := txn.WithBound(ctx, "the writes before COMMIT", b.opts.Bound)
			err := b.opts.BeforeCommit(bctx, tx, b.view(outcomes))
			cancel()
			if err != nil && ignored != nil {
				return &unclearBlame{err: fmt.Errorf("the writes before COMMIT failed after a handler ignored a failed statement (%w): %w", ignored, err)}
			}
			if err != nil {
				return txn.DatabaseFailure("before-commit", bounded(err))
			}
		}
		return nil
	})
}

// view is what every message's outcome will be once the current
// transaction, with outcomes (indexed by message, zero for those it does
// not run), commits.
func (b *batchRun) view(outcomes []Outcome) []Outcome {
	v := make([]Outcome, len(b.msgs))
	for i, r := range b.results {
		v[i] = r.Outcome
		if i < len(outcomes) && outcomes[i] != 0 {
			v[i] = outcomes[i]
		}
	}
	for first, copies := range b.copiesOf {
		o := v[first]
		if o == Processed {
			o = Duplicate
		}
		for _, idx := range copies {
			v[idx] = o
		}
	}
	return v
}
