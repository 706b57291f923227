package consumer

// Failure policy: what a message that failed gets, after how many attempts,
// and which failures are the database's own (retried without limit).

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/internal/kafkaerr"
)

// ReasonPermanent is the dlq_reason (and the Reason of a stopped
// partition) of a message whose handler failed with an error marked
// inbox.Permanent: it went to the failure policy at that failure, without
// retries.
const ReasonPermanent = "permanent"

// retryInbox tries a failed message again, alone, until it commits, its
// attempts are used up (then the policy applies) or the worker stops.
// Invalid and expired messages, and handler errors marked inbox.Permanent,
// go to the policy at once.
func (w *worker) retryInbox(ctx, dbCtx context.Context, it *item, err error) resolution {
	for {
		if errors.Is(err, batchopt.ErrHeldBack) {
			// It waited for an earlier message of its stream, now
			// resolved: its own first run, not a retry.
			it.attempts = max(it.attempts-1, 0)
			rs, ok := w.runAlone(ctx, dbCtx, it)
			if !ok {
				return w.unfinished(ctx)
			}
			if o := rs[0].Outcome; o == inbox.Processed || o == inbox.Duplicate {
				w.finish(it, o)
				return resolved
			}
			err = rs[0].Err
			continue
		}
		switch {
		case errors.Is(err, inbox.ErrExpired):
			return w.applyPolicy(ctx, dbCtx, it, ReasonExpired, err)
		case errors.Is(err, inbox.ErrInvalidMessage):
			return w.applyPolicy(ctx, dbCtx, it, ReasonInvalid, err)
		case w.infrastructure(err):
			// The database, not the message: retry without using up attempts.
			it.attempts = min(it.attempts, w.c.cfg.MaxAttempts-1)
		case inbox.IsPermanent(err):
			return w.applyPolicy(ctx, dbCtx, it, ReasonPermanent, err)
		case it.attempts >= w.c.cfg.MaxAttempts:
			return w.applyPolicy(ctx, dbCtx, it, ReasonHandlerError, err)
		}
		wait := w.retryWait(it.attempts)
		w.log.Warn("message failed; retrying", "offset", it.msg.Offset, "event_id", it.msg.EventID,
			"attempt", it.attempts, "error", err, "retry_in", wait)
		w.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryMessage, EventID: it.msg.EventID, Offset: it.msg.Offset, Attempt: it.attempts, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
		rs, ok := w.runAlone(ctx, dbCtx, it)
		if !ok {
			return w.unfinished(ctx)
		}
		if o := rs[0].Outcome; o == inbox.Processed || o == inbox.Duplicate {
			w.finish(it, o)
			return resolved
		}
		err = rs[0].Err
	}
}

// runAlone runs it through the inbox on its own. When a watermark moved
// under it, the gap check runs again against what the database holds now:
// ok is false, with w.gapStopped set, when the partition stopped at it.
func (w *worker) runAlone(ctx, dbCtx context.Context, it *item) (rs []inbox.Result, ok bool) {
	for {
		rs, ok = w.processInbox(ctx, dbCtx, []*item{it})
		if ok || !w.seqMoved {
			return rs, ok
		}
		w.seqMoved = false
		left, _, stop := w.cutAtGap(ctx, dbCtx, []*item{it})
		if stop || len(left) == 0 {
			w.gapStopped = ctx.Err() == nil
			return nil, false
		}
	}
}

// unfinished is the resolution of a message runAlone left unfinished: the
// partition stopped at it, or the worker is stopping.
func (w *worker) unfinished(ctx context.Context) resolution {
	if w.gapStopped && ctx.Err() == nil {
		w.gapStopped = false
		return stopped
	}
	return abandoned
}

// infrastructure reports whether err says the database failed rather than
// the message (inbox.IsDatabaseFailure: BEGIN, the claim or COMMIT failed,
// or a statement failed with an error the Store classifies as transient).
// Such errors never send a message to the failure policy and are retried
// without limit, also when the handler marked them inbox.Permanent. Nothing
// a handler returns by itself is one: its own network errors, EOFs and
// deadlines count as attempts, marked with inbox.Retryable or not.
func (w *worker) infrastructure(err error) bool { return inbox.IsDatabaseFailure(err) }

// applyPolicy dead-letters the message or stops the partition at it.
func (w *worker) applyPolicy(ctx, dbCtx context.Context, it *item, reason string, cause error) resolution {
	if w.c.cfg.OnFailure == StopPartition {
		e := &PartitionStoppedError{Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset,
			EventID: it.msg.EventID, Reason: reason, Attempts: it.attempts, Err: cause}
		w.c.setStopped(e)
		w.log.Error("PARTITION STOPPED: a message cannot be processed; nothing at or after it is committed until it is fixed and the partition reassigned",
			append([]any{"offset", it.msg.Offset, "event_id", it.msg.EventID, "reason", reason, "attempts", it.attempts}, failureAttrs(cause)...)...)
		w.emit(hooks.Event{Kind: hooks.PartitionStopped, Offset: it.msg.Offset, Err: e})
		return stopped
	}
	dl := deadLetter(w.c.cfg.DeadLetterTopic, &it.msg, reason, it.attempts, cause, w.c.cfg.GroupID, w.c.cfg.Consumer, time.Now())
	unknownTopic := 0 // publish attempts in a row that found the topic unknown
	for attempt := 1; ; attempt++ {
		err := w.c.dlq.WriteMessages(ctx, dl)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return abandoned
		}
		permanent, unknown, perr := kafkaerr.Classify(err)
		if unknown {
			unknownTopic++
			permanent = unknownTopic >= kafkaerr.UnknownTopicAttempts
		} else {
			unknownTopic = 0
		}
		if permanent {
			return w.deadLetterRefused(it, reason, cause, attempt, perr)
		}
		wait := w.retryWait(attempt)
		level := slog.LevelWarn
		if attempt >= 5 {
			level = slog.LevelError // still retried: the producer, not the message, is failing
		}
		w.log.Log(ctx, level, "publishing a dead letter failed; retrying", "offset", it.msg.Offset, "attempt", attempt, "error", err, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
	w.log.Error("message dead-lettered", append([]any{"offset", it.msg.Offset, "event_id", it.msg.EventID,
		"reason", reason, "attempts", it.attempts, "dead_letter_topic", w.c.cfg.DeadLetterTopic}, failureAttrs(cause)...)...)
	if err := w.com.tracker.markDone(it.msg.Offset); err != nil {
		w.log.Error("offset bookkeeping broken", "error", err)
	}
	w.emit(hooks.Event{Kind: hooks.DeadLettered, EventID: it.msg.EventID, Offset: it.msg.Offset, Err: cause})
	if !w.advancePast(ctx, dbCtx, it) {
		return abandoned
	}
	if w.c.cfg.StoreOffsets {
		// The database's position is where the next start resumes, even
		// behind the group's: a stored offset left before the dead letter
		// would dead-letter the message again. Retried while the database
		// fails, like every database failure; if the worker stops first,
		// the message is dead-lettered again by the next owner (dead
		// letters are at least once).
		next, _ := w.com.tracker.committable()
		if !w.com.storeNext(ctx, dbCtx, w.com.floor, next, w.lastOf(next)) {
			return abandoned
		}
	}
	return resolved
}
