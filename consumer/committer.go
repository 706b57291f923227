package consumer

// The committer: which offset of the partition may be committed (the
// offset tracker), its commit to Kafka, and, with Offsets.Store, the stored
// offset's writes and checks.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// commitSettings are the Config's settings the committer uses.
type commitSettings struct {
	store            bool          // Config.Offsets.Store
	interval         time.Duration // Config.Kafka.CommitInterval
	posCheckInterval time.Duration // how often an idle partition runs checkPosition
}

// committer owns a partition's offsets: the tracker of its fetched
// messages, the commits to Kafka, and with Offsets.Store the stored offset.
type committer struct {
	*part
	commitSettings
	offsets offsetTable // with Offsets.Store

	tracker       *offsetTracker
	lastCommitted int64
	lastCommitAt  time.Time

	// With Offsets.Store: floor is the highest stored offset this worker
	// knows to be committed (-1: none), and every later write of the stored
	// offset checks that the database is still at or past it, and that no
	// newer generation of the group wrote the row. lost is set when one of
	// the two does not hold: the database went back in time (a failover
	// that lost commits; storage.ErrOffsetMoved), or a newer generation
	// took the partition over (a *storage.OffsetTakenOverError); the worker
	// then reads the database's position again (worker.reposition), which
	// tells it to resume from there or, taken over, to stop.
	floor        int64
	lost         error
	lastPosCheck time.Time
	// tail is the committable offset when the last batch was done, with
	// the fingerprint of the message before it, kept when the batch left
	// the stored offset behind it (see storeCommittable).
	tail struct{ next, last int64 }
}

// restart makes start the committable offset, forgetting every message
// fetched before.
func (c *committer) restart(start int64) { c.tracker = newOffsetTracker(start) }

// committable is the tracker's committable offset (see
// offsetTracker.committable).
func (c *committer) committable() (int64, bool) { return c.tracker.committable() }

// raiseFloor records that next is committed as the stored offset.
func (c *committer) raiseFloor(next int64) { c.floor = max(c.floor, next) }

// commit commits the committable offset to Kafka if it moved, at most once
// per Kafka.CommitInterval unless force. With Offsets.Store it commits no offset
// the database does not hold (see storeCommittable).
func (c *committer) commit(dbCtx context.Context, force bool) {
	next, ok := c.tracker.committable()
	if !ok || next <= c.lastCommitted {
		return
	}
	if !force && c.interval > 0 && time.Since(c.lastCommitAt) < c.interval {
		return
	}
	if c.store && next > c.floor {
		if next, ok = c.storeCommittable(dbCtx, next); !ok || next <= c.lastCommitted {
			return
		}
	}
	err := c.gen.Commit(c.topic, c.partition, next)
	if err != nil {
		c.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds (the inbox absorbs them)",
			"next_offset", next, "error", err)
		return
	}
	c.lastCommitted, c.lastCommitAt = next, time.Now()
	c.emit(hooks.Event{Kind: hooks.Committed, Offset: next})
}

// generationCurrent asks the group coordinator whether this member still
// holds the partition in the group's current generation, by committing the
// group offset this worker last committed (or was assigned; stored if there
// is none), which changes nothing: the coordinator accepts a commit only
// from a current member. It retries while the answer says neither (see
// transport.Generation.Over); ok is false if ctx ended first (the partition
// was revoked meanwhile).
func (c *committer) generationCurrent(ctx context.Context, stored int64) (current, ok bool) {
	next := c.lastCommitted
	if next < 0 {
		next = stored
	}
	for attempt := 1; ; attempt++ {
		err := c.gen.Commit(c.topic, c.partition, next)
		switch {
		case err == nil:
			c.lastCommitted = next
			return true, true
		case c.gen.Over(err):
			return false, true
		}
		wait := c.retryWait(attempt)
		c.log.Warn("cannot ask the group coordinator whether this member's generation is current; retrying", "error", err, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return false, false
		}
	}
}

// storeNext writes next as the partition's stored offset in a transaction
// of its own (checked against floor and this worker's generation, see
// offsetTable.Advance), with last, the fingerprint of the message at
// next - 1 (0 if unknown), retrying while the database fails; false if ctx
// ended first, or if the stored offset moved back or a newer generation
// wrote it (c.lost is then set).
//
// It stores the resolved start offset when the database had no position
// for the partition (or one the log no longer holds): from then on the
// database has one, so a later failover that loses commits finds a
// position at or below them instead of falling back to the group's, which
// may be past them. And it stores the offset after a dead letter.
func (c *committer) storeNext(ctx, dbCtx context.Context, floor, next, last int64) bool {
	c.beginDB()
	defer c.endDB()
	for attempt := 1; ; attempt++ {
		err := c.storeOnce(dbCtx, floor, next, last)
		if err == nil {
			return true
		}
		if errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver) {
			return false
		}
		wait := c.retryWait(attempt)
		c.log.Warn("cannot store the partition's offset; retrying", append([]any{"offset", next, "error", err, "retry_in", wait},
			c.host.missingTables(dbCtx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return false
		}
	}
}

// storeOnce is one attempt of storeNext: the write in a transaction of its
// own. It sets c.lost if the stored offset moved back or a newer
// generation wrote it.
func (c *committer) storeOnce(dbCtx context.Context, floor, next, last int64) error {
	err := txn.Transact(dbCtx, c.db, c.classifier, nil, c.bound, func(tx *gorm.DB) error {
		actx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's write", c.bound)
		defer cancel()
		return bounded(c.offsets.Advance(actx, tx, c.topic, c.partition, floor, c.write(next, last)))
	})
	switch {
	case err == nil:
		c.raiseFloor(next)
	case errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver):
		c.lost = err
	}
	return err
}

// advanceIn writes next as the stored offset inside tx, the transaction of
// the messages before it, with last, the fingerprint of the message at
// next - 1; checked against floor like every write.
func (c *committer) advanceIn(ctx context.Context, tx *gorm.DB, next, last int64) error {
	return c.offsets.Advance(ctx, tx, c.topic, c.partition, c.floor, c.write(next, last))
}

// write is what a write of next as the stored offset stores: with this
// worker's generation and last, the fingerprint of the message at next - 1
// (0 if unknown).
func (c *committer) write(next, last int64) storage.OffsetWrite {
	return storage.OffsetWrite{Next: next, Generation: c.genID(), Last: last}
}

// storeCommittable returns the offset that commit may commit to Kafka for
// next, the committable offset, which is past the stored offset (c.floor):
// next, once written as the stored offset, or c.floor if the write failed;
// ok is false, with c.lost set, if the stored offset moved back or a newer
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
func (c *committer) storeCommittable(dbCtx context.Context, next int64) (int64, bool) {
	last := int64(0)
	if c.tail.next == next {
		last = c.tail.last
	}
	c.beginDB()
	err := c.storeOnce(dbCtx, c.floor, next, last)
	c.endDB()
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
	c.log.Log(dbCtx, level, "cannot store the partition's offset before committing it; committing the stored one",
		append([]any{"offset", next, "stored", c.floor, "error", err}, c.host.missingTables(dbCtx, err)...)...)
	return c.floor, true
}

// noteTail keeps the committable offset and the fingerprint of the message
// before it (lastOf, see batchRunner.lastOf) when a batch is done and left
// the stored offset behind it, for storeCommittable.
func (c *committer) noteTail(lastOf func(next int64) int64) {
	c.tail.next = -1
	if !c.store {
		return
	}
	if next, ok := c.tracker.committable(); ok && next > c.floor {
		c.tail.next, c.tail.last = next, lastOf(next)
	}
}

// checkPosition sets c.lost if the stored offset is behind the one this
// worker committed, or was written by a newer generation of the group. A
// failed read is only logged at Debug: the next idle period (or the next
// write, which checks as well) tries again.
func (c *committer) checkPosition(dbCtx context.Context) {
	c.lastPosCheck = time.Now()
	if c.floor < 0 || c.tracker.inFlight() > 0 {
		return
	}
	c.readPosition(dbCtx)
}

// positionDue reports whether an idle partition is due to run
// checkPosition.
func (c *committer) positionDue() bool {
	return c.store && time.Since(c.lastPosCheck) >= c.posCheckInterval
}

// readPosition reads the stored offset and sets c.lost as checkPosition
// says; it reports whether it did.
func (c *committer) readPosition(dbCtx context.Context) (lost bool) {
	row, found, err := c.offsets.Read(dbCtx, c.db, c.topic, c.partition)
	if err != nil {
		c.log.Debug("cannot read the stored offset", "error", err)
		return false
	}
	switch {
	case found && row.Generation > c.genID():
		c.lost = &storage.OffsetTakenOverError{OffsetKey: c.offsets.key(c.topic, c.partition), Generation: row.Generation, Mine: c.genID(), Next: row.Next}
	case !found || row.Next < c.floor:
		c.lost = fmt.Errorf("%w: %s/%d is stored at %d, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
			storage.ErrOffsetMoved, c.topic, c.partition, max(row.Next, -1), c.floor)
	}
	return c.lost != nil
}
