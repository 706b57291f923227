package inbox

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// EventKind says what an [Event] reports.
type EventKind int

const (
	EventProcessed EventKind = iota + 1
	EventDuplicate
	EventFailed
	EventRetry
)

func (k EventKind) String() string {
	switch k {
	case EventProcessed:
		return "processed"
	case EventDuplicate:
		return "duplicate"
	case EventFailed:
		return "failed"
	case EventRetry:
		return "retry"
	}
	return "unknown"
}

// Event is passed to Config.OnEvent.
type Event struct {
	Kind     EventKind
	Message  Message       // zero for EventRetry
	Err      error         // for EventFailed and EventRetry
	Attempt  int           // for EventRetry: the attempt that failed
	Duration time.Duration // for outcomes: from the call to its result
}

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

// record reports msg's outcome to the counters, the log, Config.OnEvent and,
// last, end, the Message hook's end of Config.Trace.
func (ib *Inbox) record(ctx context.Context, msg Message, out Outcome, err error, start time.Time, end func(Outcome, error)) {
	var kind EventKind
	switch out {
	case Processed:
		kind = EventProcessed
		ib.counters.processed.Add(1)
	case Duplicate:
		kind = EventDuplicate
		ib.counters.duplicates.Add(1)
		ib.log.LogAttrs(ctx, slog.LevelDebug, "duplicate skipped",
			slog.String("consumer", msg.Consumer), slog.String("event_id", msg.ID))
	default:
		kind = EventFailed
		ib.counters.failed.Add(1)
		// A cancelled context (a shutdown, a rebalance) rolls back every
		// message in flight: expected, and no reason for an alarm.
		level := slog.LevelError
		if ctx.Err() != nil {
			level = slog.LevelInfo
		}
		ib.log.LogAttrs(ctx, level, "message failed; nothing of it was committed",
			slog.String("consumer", msg.Consumer), slog.String("event_id", msg.ID), slog.Any("error", err))
	}
	if ib.cfg.OnEvent != nil {
		ib.cfg.OnEvent(Event{Kind: kind, Message: msg, Err: err, Duration: time.Since(start)})
	}
	end(out, err)
}
