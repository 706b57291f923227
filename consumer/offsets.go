package consumer

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport"
)

// DefaultOffsetsTable is the table of stored offsets when
// Config.OffsetsTable is empty.
const DefaultOffsetsTable = "inbox_offsets"

// offsetTable is the group's rows in the table of stored offsets
// (Config.StoreOffsets), kept by the inbox's storage.OffsetStore.
type offsetTable struct {
	store        storage.OffsetStore // nil without StoreOffsets
	table, group string
}

func (t offsetTable) key(topic string, partition int) storage.OffsetKey {
	return storage.OffsetKey{Group: t.group, Topic: topic, Partition: int32(partition)}
}

// Read returns the partition's stored position; found is false if there
// is none.
func (t offsetTable) Read(ctx context.Context, db *gorm.DB, topic string, partition int) (row storage.OffsetRow, found bool, err error) {
	rows, err := t.store.Offsets(ctx, db, t.table, t.group, topic, int32(partition))
	if err != nil || len(rows) == 0 {
		return storage.OffsetRow{}, false, err
	}
	return rows[0], true, nil
}

// Advance stores w as the partition's position inside tx, for a worker
// that has committed floor as the stored offset (floor < 0: nothing yet):
// see storage.OffsetStore's SaveOffset, whose refusals (an error wrapping
// storage.ErrOffsetMoved or storage.ErrOffsetTakenOver) roll the
// transaction back.
func (t offsetTable) Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor int64, w storage.OffsetWrite) error {
	w.OffsetKey, w.Floor = t.key(topic, partition), floor
	return t.store.SaveOffset(ctx, tx, t.table, w)
}

// Claim is storage.OffsetStore's ClaimOffset of the partition.
func (t offsetTable) Claim(ctx context.Context, db *gorm.DB, topic string, partition int, gen int32) (storage.OffsetRow, bool, error) {
	return t.store.ClaimOffset(ctx, db, t.table, t.key(topic, partition), gen)
}

// Adopt is storage.OffsetStore's AdoptOffset of the partition.
func (t offsetTable) Adopt(ctx context.Context, db *gorm.DB, topic string, partition int, from, gen int32) (bool, error) {
	return t.store.AdoptOffset(ctx, db, t.table, t.key(topic, partition), from, gen)
}

// defaultPosCheckInterval is how often an idle partition with StoreOffsets
// checks that the database still holds the offset it stored: a failover
// that lost the last commits of a partition that then receives no message
// would otherwise leave their effects unapplied until the next rebalance.
const defaultPosCheckInterval = 5 * time.Second

// reposition reads the database's position again after w.com.lost, and either
// stops the worker or resumes the partition from there. It returns halt, as
// process does.
//
// A newer generation wrote the row (a *storage.OffsetTakenOverError):
// position finds out whether this member's generation is over, and then sets
// w.takenBy and returns (the caller stops the worker), or whether the group
// was recreated, and then takes the row over, and the partition resumes
// from it.
//
// The stored offset went back behind what this worker committed
// (storage.ErrOffsetMoved), with a generation that is not newer: the
// effects of the messages in between are gone from the database (a
// failover to a replica that lacked the last commits), and they must be
// applied again. It reads the position as on assignment, checks it against
// the log, discards what the worker holds and moves the reader there. The
// group's offset is not moved back: the database's position wins on the
// next assignment anyway.
func (w *worker) reposition(ctx, dbCtx context.Context, reader transport.PartitionReader) (halt bool) {
	cause := w.com.lost
	w.com.lost = nil
	if w.seq != nil {
		// The watermarks went back with the stored offset: the messages
		// read again are judged by the database's, not by those in memory,
		// which would take them for duplicates.
		w.seq.loaded = false
	}
	prev, _ := w.com.tracker.committable()
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
	if (!hasStored || commitStart) && !w.com.storeNext(ctx, dbCtx, -1, start, 0) {
		return false
	}
	stop, ok := w.checkLast(ctx, reader, start)
	if !ok {
		return false
	}
	if stop != nil {
		w.com.tracker = newOffsetTracker(start)
		w.stopPartition(stop, "PARTITION STOPPED: the message before the database's position is not the one processed there (topic recreated?); nothing is consumed until the offsets are reset")
		return true
	}
	w.com.floor = start
	if errors.Is(cause, storage.ErrOffsetTakenOver) && start >= prev {
		// The group was recreated and the row taken over (position): no
		// commit was lost.
		w.log.Info("resuming from the stored offset, now this generation's", "stored", start, "worker_next", prev)
	} else {
		w.log.Warn("the database's stored offset went back behind what this worker committed (a failover to a replica that lacked the last commits?); resuming from it: the messages in between are applied again",
			"stored", start, "worker_next", prev, "redelivered", max(prev-start, 0), "cause", cause)
		w.emit(hooks.Event{Kind: hooks.Repositioned, Offset: start, Err: cause})
	}
	w.com.tracker = newOffsetTracker(start)
	if err := reader.SetOffset(start); err != nil {
		w.log.Error("cannot position the partition reader", "offset", start, "error", err)
		return true
	}
	return false
}
