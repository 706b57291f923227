package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/transport"
)

// logOffsets returns the partition's log start offset (the first offset
// retention kept) and its log end offset (the offset the next message
// produced will get).
func (c *Consumer) logOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error) {
	start, end, err = c.client.LogOffsets(ctx, topic, partition)
	if err != nil {
		return 0, 0, err
	}
	if start < 0 || end < start {
		return 0, 0, fmt.Errorf("consumer: implausible log offsets %d..%d", start, end)
	}
	return start, end, nil
}

// beyondEndChecks is how many lookups, beyondEndSpacing apart, must all find
// an offset past the log end before the partition stops: a newly elected
// leader's high watermark can lag for a moment.
const (
	beyondEndChecks  = 3
	beyondEndSpacing = time.Second
)

// defaultLogCheckInterval is how often an idle partition checks that its
// next offset is not past the log end.
const defaultLogCheckInterval = 30 * time.Second

// checkLog compares the offset the partition would start at (from says
// where it came from) with the partition's log, and returns the concrete
// offset to start at:
//
//   - a sentinel (no committed or stored offset) becomes the log start
//     (transport.FirstOffset) or the log end (transport.LastOffset), and commit is true:
//     committing it at once makes a restart begin there, rather than at the
//     log end of the moment, skipping what was produced in between;
//   - an offset below the log start (retention deleted messages the group
//     never processed) becomes the log start: they are gone; this is logged
//     at Warn with how many were skipped, and commit is true;
//   - an offset past the log end (the topic was deleted and recreated, or
//     its log truncated) returns stop: the reader would wait there,
//     silently (kafka-go's does; see transport.PartitionReader.Fetch), for the log to
//     grow past it, and the messages below it would never be processed.
//
// The lookup is retried while it fails; ok is false if ctx ended first.
func (p *positioner) checkLog(ctx context.Context, start int64, from string) (next int64, commit bool, stop *PartitionStoppedError, ok bool) {
	beyond := 0
	for attempt := 1; ; attempt++ {
		first, end, err := p.host.logOffsets(ctx, p.topic, p.partition)
		wait := p.retryWait(attempt)
		switch {
		case err == nil && (start < 0 || start <= end):
			p.logStart = first
			return p.resolveStart(start, first, end)
		case err == nil:
			beyond++
			if beyond >= beyondEndChecks {
				return start, false, p.beyondLogEnd(start, end, from), true
			}
			wait = max(wait, beyondEndSpacing)
		default:
			level := slog.LevelWarn
			if attempt >= 5 {
				level = slog.LevelError
			}
			p.log.Log(ctx, level, "cannot read the partition's log offsets; retrying", "attempt", attempt, "error", err, "retry_in", wait)
		}
		if backoff.Sleep(ctx, wait) != nil {
			return 0, false, nil, false
		}
	}
}

// pastLogEnd checks, for a partition whose fetches come back empty, that
// its next offset is not past the log end: the topic deleted and recreated
// while consumed leaves the reader (kafka-go's, see transport.PartitionReader.Fetch)
// waiting there, silently, while the new messages below it are never
// fetched. It returns the stop to
// apply, or nil. A failed lookup is only logged at Debug: the next idle
// period tries again.
func (p *positioner) pastLogEnd(ctx context.Context) *PartitionStoppedError {
	next, ok := p.com.tracker.committable()
	if !ok || p.com.tracker.inFlight() > 0 {
		return nil
	}
	var end int64
	for i := range beyondEndChecks {
		if i > 0 && backoff.Sleep(ctx, beyondEndSpacing) != nil {
			return nil
		}
		var err error
		if _, end, err = p.host.logOffsets(ctx, p.topic, p.partition); err != nil {
			p.log.Debug("cannot read the partition's log offsets", "error", err)
			return nil
		}
		if next <= end {
			return nil
		}
	}
	return p.beyondLogEnd(next, end, "the next offset of this consumer")
}

// resolveStart is checkLog for a start offset not past the log end.
func (p *positioner) resolveStart(start, first, end int64) (int64, bool, *PartitionStoppedError, bool) {
	switch {
	case start == transport.LastOffset:
		p.log.Info("no committed offset: starting at the log end, committed at once", "log_end", end)
		return end, true, nil, true
	case start < 0:
		p.log.Info("no committed offset: starting at the log start, committed at once", "log_start", first)
		return first, true, nil, true
	case start < first:
		p.log.Warn("messages were deleted (by retention) before this group processed them; they are skipped",
			"skipped", first-start, "from_offset", start, "log_start", first)
		return first, true, nil, true
	}
	return start, false, nil, true
}

// beyondLogEnd builds the stop of a partition whose start offset is past
// its log end.
func (p *positioner) beyondLogEnd(start, end int64, from string) *PartitionStoppedError {
	return &PartitionStoppedError{
		Topic: p.topic, Partition: p.partition, Offset: start, Reason: ReasonOffsetBeyondLogEnd,
		Err: fmt.Errorf("%w: offset %d (%s) is past the log end %d; was the topic deleted and recreated? Its messages below %d would never be processed. To start over, %s, then restart",
			ErrOffsetBeyondLogEnd, start, from, end, start, p.resetAdvice()),
	}
}

// resetAdvice says how to make the partition start over at the log start:
// reset the group's offsets, and with Offsets.Store delete its rows first.
func (p *positioner) resetAdvice() string {
	fix := fmt.Sprintf("reset the group's offsets of the partition (kafka-consumer-groups.sh --group %s --topic %s --reset-offsets --to-earliest --execute, or delete the group)",
		p.group, p.topic)
	if p.store {
		fix = fmt.Sprintf("with the group's consumers stopped, reset its stored and Kafka offsets (inboxctl offsets reset --group %s --topic %s --to-start), or delete the group's rows in the offsets table (DELETE FROM %s WHERE group_id = '%s' AND topic = '%s') and %s",
			p.group, p.topic, p.table, p.group, p.topic, fix)
	}
	return fix
}
