package inbox

import (
	"context"
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

// ProcessBatch processes msgs in one transaction with one multi-row claim,
// running h only for the messages seen for the first time, in their order in
// msgs. results[i] tells what happened to msgs[i].
//
// A message that cannot be processed is isolated: invalid and expired
// messages fail before the transaction starts; if h fails for a message
// (after retries, if its error is transient), the transaction is rolled back
// and run again without that message, so every other message still commits.
// A message repeated inside msgs is handled once; its later copies get the
// first copy's outcome (Duplicate if that was Processed).
//
// The error is non-nil only when the batch as a whole could not commit (the
// database is unreachable, ctx ended): then every message not already failed
// is Failed with that error, and nothing of the batch was committed.
func (ib *Inbox) ProcessBatch(ctx context.Context, msgs []Message, h Handler) ([]Result, error) {
	start := time.Now()
	results := make([]Result, len(msgs))
	firstOf := make(map[Key]int, len(msgs))
	copiesOf := make(map[int][]int)
	pending := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if err := ib.admit(m); err != nil {
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

	var batchErr error
	for len(pending) > 0 {
		outcomes, failedIdx, err := ib.attemptBatch(ctx, msgs, pending, h)
		if err == nil {
			for _, idx := range pending {
				results[idx] = Result{Outcome: outcomes[idx]}
			}
			break
		}
		if failedIdx < 0 {
			batchErr = fmt.Errorf("inbox: batch of %d messages: %w", len(pending), err)
			for _, idx := range pending {
				results[idx] = Result{Outcome: Failed, Err: batchErr}
			}
			break
		}
		results[failedIdx] = Result{Outcome: Failed, Err: fmt.Errorf("inbox: consumer %q event %q: %w",
			msgs[failedIdx].Consumer, msgs[failedIdx].ID, err)}
		pending = slices.DeleteFunc(pending, func(idx int) bool { return idx == failedIdx })
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

// attemptBatch runs the batch transaction for the pending messages, with
// retries. On a handler failure it returns the failing message's index; on
// any other failure, -1.
func (ib *Inbox) attemptBatch(ctx context.Context, msgs []Message, pending []int, h Handler) (map[int]Outcome, int, error) {
	var outcomes map[int]Outcome
	failedIdx := -1
	rows := make([]Row, len(pending))
	for j, idx := range pending {
		rows[j] = msgs[idx].Row()
	}
	err := ib.retry(ctx, func(int) error {
		failedIdx = -1
		outcomes = make(map[int]Outcome, len(pending))
		return ib.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			inserted, err := ib.claim(ctx, tx, rows)
			if err != nil {
				return err
			}
			for j, idx := range pending {
				if !inserted[j] {
					outcomes[idx] = Duplicate
					continue
				}
				if err := callHandler(ctx, tx, msgs[idx], h); err != nil {
					failedIdx = idx
					return err
				}
				outcomes[idx] = Processed
			}
			return nil
		}, ib.cfg.TxOptions)
	})
	if err != nil && ctx.Err() != nil {
		// The context ended: nothing can commit, whichever message was running.
		return nil, -1, err
	}
	return outcomes, failedIdx, err
}
