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
func (b *batchRunner) retryInbox(ctx, dbCtx context.Context, it *item, err error) resolution {
	for {
		if errors.Is(err, batchopt.ErrHeldBack) {
			// It waited for an earlier message of its stream, now
			// resolved: its own first run, not a retry.
			it.attempts = max(it.attempts-1, 0)
			rs, ok := b.runAlone(ctx, dbCtx, it)
			if !ok {
				return b.unfinished(ctx)
			}
			if o := rs[0].Outcome; o == inbox.Processed || o == inbox.Duplicate {
				b.finish(it, o)
				return resolved
			}
			err = rs[0].Err
			continue
		}
		switch {
		case errors.Is(err, inbox.ErrExpired):
			return b.applyPolicy(ctx, dbCtx, it, ReasonExpired, err)
		case errors.Is(err, inbox.ErrInvalidMessage):
			return b.applyPolicy(ctx, dbCtx, it, ReasonInvalid, err)
		case b.infrastructure(err):
			// The database, not the message: retry without using up attempts.
			it.attempts = min(it.attempts, b.maxAttempts-1)
		case inbox.IsPermanent(err):
			return b.applyPolicy(ctx, dbCtx, it, ReasonPermanent, err)
		case it.attempts >= b.maxAttempts:
			return b.applyPolicy(ctx, dbCtx, it, ReasonHandlerError, err)
		}
		wait := b.retryWait(it.attempts)
		b.log.Warn("message failed; retrying", "offset", it.msg.Offset, "event_id", it.msg.EventID,
			"attempt", it.attempts, "error", err, "retry_in", wait)
		b.emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryMessage, EventID: it.msg.EventID, Offset: it.msg.Offset, Attempt: it.attempts, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
		rs, ok := b.runAlone(ctx, dbCtx, it)
		if !ok {
			return b.unfinished(ctx)
		}
		if o := rs[0].Outcome; o == inbox.Processed || o == inbox.Duplicate {
			b.finish(it, o)
			return resolved
		}
		err = rs[0].Err
	}
}

// runAlone runs it through the inbox on its own. When a watermark moved
// under it, the gap check runs again against what the database holds now:
// ok is false, with b.gapStopped set, when the partition stopped at it.
func (b *batchRunner) runAlone(ctx, dbCtx context.Context, it *item) (rs []inbox.Result, ok bool) {
	for {
		rs, ok = b.processInbox(ctx, dbCtx, []*item{it})
		if ok || !b.seqMoved {
			return rs, ok
		}
		b.seqMoved = false
		left, _, stop := b.cutAtGap(ctx, dbCtx, []*item{it})
		if stop || len(left) == 0 {
			b.gapStopped = ctx.Err() == nil
			return nil, false
		}
	}
}

// unfinished is the resolution of a message runAlone left unfinished: the
// partition stopped at it, or the worker is stopping.
func (b *batchRunner) unfinished(ctx context.Context) resolution {
	if b.gapStopped && ctx.Err() == nil {
		b.gapStopped = false
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
func (b *batchRunner) infrastructure(err error) bool { return inbox.IsDatabaseFailure(err) }

// applyPolicy dead-letters the message or stops the partition at it.
func (b *batchRunner) applyPolicy(ctx, dbCtx context.Context, it *item, reason string, cause error) resolution {
	if b.onFailure == StopPartition {
		e := &PartitionStoppedError{Topic: b.topic, Partition: b.partition, Offset: it.msg.Offset,
			EventID: it.msg.EventID, Reason: reason, Attempts: it.attempts, Err: cause}
		b.host.setStopped(e)
		b.log.Error("PARTITION STOPPED: a message cannot be processed; nothing at or after it is committed until it is fixed and the partition reassigned",
			append([]any{"offset", it.msg.Offset, "event_id", it.msg.EventID, "reason", reason, "attempts", it.attempts}, failureAttrs(cause)...)...)
		b.emit(hooks.Event{Kind: hooks.PartitionStopped, Offset: it.msg.Offset, Err: e})
		return stopped
	}
	if res, ok := b.publishDeadLetter(ctx, it, reason, cause); !ok {
		return res
	}
	b.log.Error("message dead-lettered", append([]any{"offset", it.msg.Offset, "event_id", it.msg.EventID,
		"reason", reason, "attempts", it.attempts, "dead_letter_topic", b.deadLetterTopic}, failureAttrs(cause)...)...)
	if err := b.com.tracker.markDone(it.msg.Offset); err != nil {
		b.log.Error("offset bookkeeping broken", "error", err)
	}
	b.emit(hooks.Event{Kind: hooks.DeadLettered, EventID: it.msg.EventID, Offset: it.msg.Offset, Err: cause})
	if !b.advancePast(ctx, dbCtx, it) {
		return abandoned
	}
	if b.com.store {
		// The database's position is where the next start resumes, even
		// behind the group's: a stored offset left before the dead letter
		// would dead-letter the message again. Retried while the database
		// fails, like every database failure; if the worker stops first,
		// the message is dead-lettered again by the next owner (dead
		// letters are at least once).
		next, _ := b.com.committable()
		if !b.com.storeNext(ctx, dbCtx, b.com.floor, next, b.lastOf(next)) {
			return abandoned
		}
	}
	return resolved
}

// publishDeadLetter publishes the dead letter of it, which failed for
// reason (cause), retrying while the producer fails. ok is false when it
// was not published: the worker is stopping (abandoned), or the producer
// refused it for good and the partition stopped at it (stopped; see
// deadLetterRefused).
func (b *batchRunner) publishDeadLetter(ctx context.Context, it *item, reason string, cause error) (res resolution, ok bool) {
	dl := deadLetter(b.deadLetterTopic, &it.msg, reason, it.attempts, cause, b.group, b.consumer, time.Now())
	unknownTopic := 0 // publish attempts in a row that found the topic unknown
	for attempt := 1; ; attempt++ {
		err := b.dlq.WriteMessages(ctx, dl)
		if err == nil {
			return resolved, true
		}
		if ctx.Err() != nil {
			return abandoned, false
		}
		permanent, unknown, perr := kafkaerr.Classify(err)
		if unknown {
			unknownTopic++
			permanent = unknownTopic >= kafkaerr.UnknownTopicAttempts
		} else {
			unknownTopic = 0
		}
		if permanent {
			return b.deadLetterRefused(it, reason, cause, attempt, perr), false
		}
		wait := b.retryWait(attempt)
		level := slog.LevelWarn
		if attempt >= 5 {
			level = slog.LevelError // still retried: the producer, not the message, is failing
		}
		b.log.Log(ctx, level, "publishing a dead letter failed; retrying", "offset", it.msg.Offset, "attempt", attempt, "error", err, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned, false
		}
	}
}
