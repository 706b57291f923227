package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport"
)

// DefaultOffsetsTable is the table of stored offsets when
// Config.Offsets.Table is empty.
const DefaultOffsetsTable = "inbox_offsets"

// offsetTable is the group's rows in the table of stored offsets
// (Config.Offsets.Store), kept by the inbox's storage.OffsetStore.
type offsetTable struct {
	store        storage.OffsetStore // nil without Offsets.Store
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

// defaultPosCheckInterval is how often an idle partition with Offsets.Store
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
// worker committed, or was written by a newer generation of the group. A
// failed read is only logged at Debug: the next idle period (or the next
// write, which checks as well) tries again.
func (w *worker) checkPosition(ctx, dbCtx context.Context) {
	w.lastPosCheck = time.Now()
	if w.floor < 0 || w.tracker.inFlight() > 0 {
		return
	}
	w.readPosition(dbCtx)
}

// readPosition reads the stored offset and sets w.lost as checkPosition
// says; it reports whether it did.
func (w *worker) readPosition(dbCtx context.Context) (lost bool) {
	row, found, err := w.c.offsets.Read(dbCtx, w.c.db(), w.topic, w.partition)
	if err != nil {
		w.log.Debug("cannot read the stored offset", "error", err)
		return false
	}
	switch {
	case found && row.Generation > w.genID():
		w.lost = &storage.OffsetTakenOverError{OffsetKey: w.c.offsets.key(w.topic, w.partition), Generation: row.Generation, Mine: w.genID(), Next: row.Next}
	case !found || row.Next < w.floor:
		w.lost = fmt.Errorf("%w: %s/%d is stored at %d, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
			storage.ErrOffsetMoved, w.topic, w.partition, max(row.Next, -1), w.floor)
	}
	return w.lost != nil
}

// reposition reads the database's position again after w.lost, and either
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
	cause := w.lost
	w.lost = nil
	if w.seq != nil {
		// The watermarks went back with the stored offset: the messages
		// read again are judged by the database's, not by those in memory,
		// which would take them for duplicates.
		w.seq.loaded = false
	}
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
	if (!hasStored || commitStart) && !w.storeNext(ctx, dbCtx, -1, start, 0) {
		return false
	}
	stop, ok := w.checkLast(ctx, reader, start)
	if !ok {
		return false
	}
	if stop != nil {
		w.tracker = newOffsetTracker(start)
		w.stopPartition(stop, "PARTITION STOPPED: the message before the database's position is not the one processed there (topic recreated?); nothing is consumed until the offsets are reset")
		return true
	}
	w.floor = start
	if errors.Is(cause, storage.ErrOffsetTakenOver) && start >= prev {
		// The group was recreated and the row taken over (position): no
		// commit was lost.
		w.log.Info("resuming from the stored offset, now this generation's", "stored", start, "worker_next", prev)
	} else {
		w.log.Warn("the database's stored offset went back behind what this worker committed (a failover to a replica that lacked the last commits?); resuming from it: the messages in between are applied again",
			"stored", start, "worker_next", prev, "redelivered", max(prev-start, 0), "cause", cause)
		w.c.emit(hooks.Event{Kind: hooks.Repositioned, Topic: w.topic, Partition: w.partition, Offset: start, Err: cause})
	}
	w.tracker = newOffsetTracker(start)
	if err := reader.SetOffset(start); err != nil {
		w.log.Error("cannot position the partition reader", "offset", start, "error", err)
		return true
	}
	return false
}

// storeCommittable returns the offset that commit may commit to Kafka for
// next, the committable offset, which is past the stored offset (w.floor):
// next, once written as the stored offset, or w.floor if the write failed;
// ok is false, with w.lost set, if the stored offset moved back or a newer
// generation wrote it (the worker then repositions or stops, as after a
// batch's write).
//
// The group's committed offset must not pass the stored one: the
// partition's next owner starts at the stored offset, and takes a group's
// offset ahead of it for commits a database failover lost. Most messages
// move the stored offset in their own transaction. Those that do not
// (duplicates a watermark covers run none; the messages of a batch after
// one that failed commit in one that cannot move it past that message,
// whose retry alone stores only its own offset) have it written here, in
// a transaction of the write alone, once per Kafka commit (at most once
// per Kafka.CommitInterval) rather than once per batch. One attempt: after a
// failure the next commit tries again, and a next owner gets the messages
// past the stored offset again and finds them applied.
func (w *worker) storeCommittable(dbCtx context.Context, next int64) (int64, bool) {
	last := int64(0)
	if w.tail.next == next {
		last = w.tail.last
	}
	w.beginDB()
	err := w.storeOnce(dbCtx, w.floor, next, last)
	w.endDB()
	switch {
	case err == nil:
		return next, true
	case errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver):
		return 0, false
	}
	level := slog.LevelWarn
	if dbCtx.Err() != nil {
		level = slog.LevelDebug // stopping: the next owner redelivers them
	}
	w.log.Log(dbCtx, level, "cannot store the partition's offset before committing it; committing the stored one",
		append([]any{"offset", next, "stored", w.floor, "error", err}, w.c.missingTables(dbCtx, err)...)...)
	return w.floor, true
}

// noteTail keeps the committable offset and the fingerprint of the message
// before it when the batch in process (w.batch) is done and left the
// stored offset behind it, for storeCommittable.
func (w *worker) noteTail() {
	w.tail.next = -1
	if !w.c.cfg.Offsets.Store {
		return
	}
	if next, ok := w.tracker.committable(); ok && next > w.floor {
		w.tail.next, w.tail.last = next, w.lastOf(next)
	}
}
