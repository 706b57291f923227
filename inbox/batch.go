package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
)

// Result is the outcome of one message of a batch. Err is set exactly when
// Outcome is Failed.
type Result struct {
	Outcome Outcome
	Err     error
}

// BatchOption changes how ProcessBatch runs.
type BatchOption func(*batchOptions)

type batchOptions struct {
	beforeCommit func(ctx context.Context, tx *gorm.DB, outcomes []Outcome) error
}

// BeforeCommit makes ProcessBatch call fn in each transaction it is about to
// commit, after the handlers ran, so that fn's writes commit with the batch
// (a consumer stores its offset this way). outcomes[i] is what msgs[i] will
// be once this transaction commits: Processed or Duplicate for the messages
// of this transaction and of transactions the same call committed before,
// Failed for messages that failed (rejected before any transaction, or
// isolated after failing), and zero for messages still to be run. An error
// from fn fails the whole transaction like a failed claim: a database
// failure, reported for the batch.
func BeforeCommit(fn func(ctx context.Context, tx *gorm.DB, outcomes []Outcome) error) BatchOption {
	return func(o *batchOptions) { o.beforeCommit = fn }
}

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
// messages are run again one per transaction, so that the failure is pinned
// on the message that causes it. A message repeated inside msgs is handled once; its later
// copies get the first copy's outcome (Duplicate if that was Processed).
//
// The error is non-nil only when the batch as a whole could not commit (a
// database failure, see [IsDatabaseFailure], or ctx ended): then every
// message not already failed is Failed with that error, and nothing of the
// batch was committed by the transaction that failed.
func (ib *Inbox) ProcessBatch(ctx context.Context, msgs []Message, h Handler, opts ...BatchOption) ([]Result, error) {
	start := time.Now()
	var o batchOptions
	for _, opt := range opts {
		opt(&o)
	}
	now := ib.cfg.Now()
	results := make([]Result, len(msgs))
	firstOf := make(map[Key]int, len(msgs))
	copiesOf := make(map[int][]int)
	pending := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if err := ib.admit(m, now); err != nil {
			results[i] = Result{Outcome: Failed, Err: err}
			continue
		}
		k := m.Row().Key()
		if first, seen := firstOf[k]; seen {
			copiesOf[first] = append(copiesOf[first], i)
			continue
		}
		firstOf[k] = i
		pending = append(pending, i)
	}
	b := &batchRun{ib: ib, msgs: msgs, h: h, opts: o, results: results, copiesOf: copiesOf}

	var batchErr error
	oneByOne := false
	for len(pending) > 0 {
		group := pending
		if oneByOne {
			group = pending[:1]
		}
		outcomes, failedIdx, err := b.attempt(ctx, group)
		if err == nil {
			for _, idx := range group {
				results[idx] = Result{Outcome: outcomes[idx]}
			}
			pending = pending[len(group):]
			continue
		}
		if failedIdx >= 0 {
			results[failedIdx] = Result{Outcome: Failed, Err: fmt.Errorf("inbox: consumer %q event %q: %w",
				msgs[failedIdx].Consumer, msgs[failedIdx].ID, err)}
			pending = slices.DeleteFunc(pending, func(idx int) bool { return idx == failedIdx })
			continue
		}
		var ce *CommitError
		var ub *unclearBlame
		if (errors.As(err, &ce) || errors.As(err, &ub)) && ctx.Err() == nil {
			if len(group) > 1 {
				ib.log.Warn("a batch failed for a reason no single message can be blamed for yet; running its messages one per transaction to find the cause",
					"messages", len(group), "error", err)
				oneByOne = true
				continue
			}
			idx := group[0]
			results[idx] = Result{Outcome: Failed, Err: fmt.Errorf("inbox: consumer %q event %q: %w", msgs[idx].Consumer, msgs[idx].ID, err)}
			pending = pending[1:]
			continue
		}
		batchErr = fmt.Errorf("inbox: batch of %d messages: %w", len(pending), err)
		for _, idx := range pending {
			results[idx] = Result{Outcome: Failed, Err: batchErr}
		}
		break
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
		ib.record(ctx, msgs[i], r.Outcome, r.Err, start)
	}
	return results, batchErr
}

// unclearBlame is a handler failure in a transaction in which an earlier
// handler's statement had failed: which message is at fault is found by
// running them one per transaction.
type unclearBlame struct{ err error }

func (e *unclearBlame) Error() string { return e.err.Error() }
func (e *unclearBlame) Unwrap() error { return e.err }

// batchRun is one ProcessBatch call.
type batchRun struct {
	ib       *Inbox
	msgs     []Message
	h        Handler
	opts     batchOptions
	results  []Result // final results so far
	copiesOf map[int][]int
}

// attempt runs the transaction for the messages of group, with retries. On
// a handler failure it returns the failing message's index; on any other
// failure, -1.
func (b *batchRun) attempt(ctx context.Context, group []int) (map[int]Outcome, int, error) {
	ib := b.ib
	var outcomes map[int]Outcome
	failedIdx := -1
	rows := make([]Row, len(group))
	for j, idx := range group {
		rows[j] = b.msgs[idx].Row()
	}
	err := ib.retry(ctx, func(int) error {
		failedIdx = -1
		outcomes = make(map[int]Outcome, len(group))
		return runTx(ctx, ib.db, ib.store, ib.cfg.TxOptions, func(tx *gorm.DB) error {
			inserted, err := ib.claim(ctx, tx, rows)
			if err != nil {
				return err
			}
			st := lookupState(tx)
			firstFailure := -1 // the message during whose handler a statement failed first
			for j, idx := range group {
				if !inserted[j] {
					outcomes[idx] = Duplicate
					continue
				}
				_, before := st.state()
				err := callHandler(ctx, tx, b.msgs[idx], b.h)
				if _, after := st.state(); before == nil && after != nil {
					firstFailure = idx
				}
				if err != nil {
					if firstFailure >= 0 && firstFailure != idx {
						// An earlier handler ignored a failed statement; on
						// PostgreSQL that aborted the transaction, and this
						// message may only suffer from it.
						return &unclearBlame{err: err}
					}
					failedIdx = idx
					return err
				}
				outcomes[idx] = Processed
			}
			if b.opts.beforeCommit != nil {
				if err := b.opts.beforeCommit(ctx, tx, b.view(outcomes)); err != nil {
					return &dbError{op: "before-commit", err: err}
				}
			}
			return nil
		})
	})
	if err != nil && (ctx.Err() != nil || IsDatabaseFailure(err)) {
		// The database failed, or the context ended: nothing committed,
		// whichever message was running, and it is not that message's fault.
		return nil, -1, err
	}
	return outcomes, failedIdx, err
}

// view is what every message's outcome will be once the current
// transaction, with outcomes, commits.
func (b *batchRun) view(outcomes map[int]Outcome) []Outcome {
	v := make([]Outcome, len(b.msgs))
	for i, r := range b.results {
		v[i] = r.Outcome
	}
	for idx, o := range outcomes {
		v[idx] = o
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
