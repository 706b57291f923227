package inbox

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/inboxgo/inbox/hooks"
)

// Counters is a snapshot of an Inbox's totals since it was created.
type Counters struct {
	Processed  uint64
	Duplicates uint64
	Failed     uint64
	Retries    uint64
}

type counters struct {
	processed, duplicates, failed, retries atomic.Uint64
}

// Counters returns the totals so far.
func (ib *Inbox) Counters() Counters {
	return Counters{
		Processed:  ib.counters.processed.Load(),
		Duplicates: ib.counters.duplicates.Load(),
		Failed:     ib.counters.failed.Load(),
		Retries:    ib.counters.retries.Load(),
	}
}

// record reports msg's outcome to the counters, the log, the EventHooks
// (unless report is false) and, last, end, the MessageTracers' end.
func (ib *Inbox) record(ctx context.Context, msg Message, out Outcome, err error, start time.Time, end func(Outcome, error), report bool) {
	ib.recordFor(ctx, msg, out, err, start, end, report, false)
}

// recordFor is record for a call whose caller retries what failed
// (batchopt.Options.CallerRetries) if callerRetries: the caller then logs
// each failed run itself, once, as what it makes of it (a retry, a dead
// letter), and the inbox logs none.
func (ib *Inbox) recordFor(ctx context.Context, msg Message, out Outcome, err error, start time.Time, end func(Outcome, error), report, callerRetries bool) {
	switch out {
	case Processed:
		ib.counters.processed.Add(1)
	case Duplicate:
		ib.counters.duplicates.Add(1)
		if report {
			// A caller reporting the outcomes logs them too.
			ib.log.LogAttrs(ctx, slog.LevelDebug, "duplicate skipped",
				slog.String("consumer", msg.Consumer), slog.String("event_id", msg.ID))
		}
	default:
		ib.counters.failed.Add(1)
		if callerRetries {
			break
		}
		// A cancelled context (a shutdown, a rebalance) rolls back every
		// message in flight: expected, and no reason for an alarm.
		level := slog.LevelError
		if ctx.Err() != nil {
			level = slog.LevelInfo
		}
		ib.log.LogAttrs(ctx, level, "message failed; nothing of it was committed",
			slog.String("consumer", msg.Consumer), slog.String("event_id", msg.ID), slog.Any("error", err))
	}
	// A consumer driving the inbox reports the outcome itself, once it is
	// decided (see package hooks): report is false then.
	if report && ib.hooks.HasEvents() {
		ib.hooks.Emit(hooks.Event{Kind: out.kind(), Consumer: msg.Consumer, EventID: msg.ID, Topic: msg.Topic,
			Partition: int(msg.Partition), Offset: msg.Offset, Err: err, Duration: time.Since(start)})
	}
	end(out, err)
}
