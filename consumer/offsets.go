package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/offsets"
)

// DefaultOffsetsTable is the table of stored offsets when
// Config.OffsetsTable is empty.
const DefaultOffsetsTable = "inbox_offsets"

// defaultPosCheckInterval is how often an idle partition with StoreOffsets
// checks that the database still holds the offset it stored: a failover
// that lost the last commits of a partition that then receives no message
// would otherwise leave their effects unapplied until the next rebalance.
const defaultPosCheckInterval = 5 * time.Second

// posCheckInterval is how often an idle partition runs checkPosition.
func (w *worker) posCheckInterval() time.Duration {
	if d := w.c.knobs.PosCheckInterval; d > 0 {
		return d
	}
	return defaultPosCheckInterval
}

// checkPosition sets w.lost if the stored offset is behind the one this
// worker committed. A failed read is only logged at Debug: the next idle
// period (or the next write, which checks as well) tries again.
func (w *worker) checkPosition(ctx, dbCtx context.Context) {
	w.lastPosCheck = time.Now()
	if w.floor < 0 || w.tracker.inFlight() > 0 {
		return
	}
	stored, err := w.c.offsets.Load(dbCtx, w.c.db(), w.topic, w.partition)
	if err != nil {
		w.log.Debug("cannot read the stored offset", "error", err)
		return
	}
	if stored < w.floor {
		w.lost = fmt.Errorf("%w: %s/%d is stored at %d, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
			offsets.ErrPositionMoved, w.topic, w.partition, stored, w.floor)
	}
}

// reposition resumes the partition from the database's position after
// w.lost: the stored offset went back behind what this worker committed,
// so the effects of the messages in between are gone from the database
// (a failover to a replica that lacked the last commits), and they must be
// applied again. It reads the position as on assignment, checks it against
// the log, discards what the worker holds and moves the reader there. The
// group's offset is not moved back: the database's position wins on the
// next assignment anyway. It returns halt, as process does.
func (w *worker) reposition(ctx, dbCtx context.Context, reader partitionReader) (halt bool) {
	cause := w.lost
	w.lost = nil
	prev, _ := w.tracker.committable()
	start, from, hasStored, ok := w.position(ctx, dbCtx)
	if !ok {
		return false
	}
	start, commitStart, beyondEnd, ok := w.checkLog(ctx, start, from)
	if !ok {
		return false
	}
	if beyondEnd != nil {
		w.stopPartition(beyondEnd, "PARTITION STOPPED: the database's position is past the log end; nothing is consumed until the offsets are reset")
		return true
	}
	if (!hasStored || commitStart) && !w.storeNext(ctx, dbCtx, -1, start) {
		return false
	}
	w.floor = start
	w.log.Warn("the database's stored offset went back behind what this worker committed (a failover to a replica that lacked the last commits?); resuming from it: the messages in between are applied again",
		"stored", start, "worker_next", prev, "redelivered", max(prev-start, 0), "cause", cause)
	w.c.emit(hooks.Event{Kind: hooks.Repositioned, Topic: w.topic, Partition: w.partition, Offset: start, Err: cause})
	w.tracker = newOffsetTracker(start)
	if err := reader.seek(start); err != nil {
		w.log.Error("cannot position the partition reader", "offset", start, "error", err)
		return true
	}
	return false
}
