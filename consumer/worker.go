package consumer

// The partition worker: the fetch loop, its starting position and stored
// offsets, and the offset commits. Processing is in process.go, the failure
// policy in failure.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport"
)

// worker consumes one partition from the generation that started it until
// the partition is revoked from this member (see Consumer.startGeneration).
type worker struct {
	c         *Consumer
	gen       transport.Generation // the generation that started it
	topic     string
	partition int
	assigned  int64 // the group's committed offset, or transport.FirstOffset / LastOffset
	log       *slog.Logger
	done      chan struct{} // closed once the worker returned (Consumer.removeWorker)

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
	// then reads the database's position again (reposition), which tells
	// it to resume from there or, taken over, to stop (takenBy: the
	// generation that has the partition now).
	floor        int64
	lost         error
	takenBy      int32
	lastPosCheck time.Time
	// tail is the committable offset when the last batch was done, with
	// the fingerprint of the message before it, kept when the batch left
	// the stored offset behind it (see storeCommittable).
	tail struct{ next, last int64 }
	// stored is the row the position was read from (Next -1: none), and
	// logStart the log start offset checkLog found.
	stored   storage.OffsetRow
	logStart int64
	// batch is the batch in process, for the fingerprint of the message
	// before a stored offset (lastOf).
	batch []*item
	// seq holds the partition's sequenced streams (nil without
	// Config.Sequenced.Sources); seqMoved says the last processInbox gave
	// up because a watermark moved, gapStopped that runAlone stopped the
	// partition at its message.
	seq        *watermarks
	seqMoved   bool
	gapStopped bool

	// waitingSince (UnixNano; 0: not waiting) is when the worker began
	// waiting for the database to answer its work: the watchdog's view of
	// it (see Consumer.watch).
	waitingSince atomic.Int64
}

// genID is the group generation that started this worker, which it writes
// into the stored offset's row (see offsetTable.Advance).
func (w *worker) genID() int32 { return w.gen.ID() }

// item is one fetched message on its way through the worker.
type item struct {
	msg        Message
	extractErr error
	// seq is the message's place in a trusted sequenced stream (nil: it
	// takes an inbox row); seqErr says why a trusted source's message has
	// none.
	seq      *seqPos
	seqErr   error
	attempts int
}

// resolution is what became of a message that failed.
type resolution int

const (
	resolved  resolution = iota // finished: processed, duplicate or dead-lettered
	stopped                     // the partition stops at it
	abandoned                   // the worker is stopping; the message stays unfinished
)

// run is the worker's whole life, reading the partition with reader. It
// returns only when runCtx or genCtx (the partition's hold, see
// transport.Generation.Start) ends, or when it finds that a newer
// generation of the group took its partition over (this member lost its
// hold; see claim): the client then makes the member rejoin the group.
func (w *worker) run(runCtx, genCtx context.Context, reader transport.PartitionReader) {
	ctx, cancel := context.WithCancelCause(runCtx)
	defer cancel(nil)
	stopAfter := context.AfterFunc(genCtx, func() { cancel(context.Cause(genCtx)) })
	defer stopAfter()
	// Database work in flight finishes when the partition is revoked (a
	// rebalance), each step of the consumer's own within Timeouts.Database,
	// and is rolled back when Run ends, or when this member leaves the
	// group over a stalled partition (runCtx is the membership's).
	dbCtx := runCtx

	w.lastCommitted = -1
	if w.assigned >= 0 {
		w.lastCommitted = w.assigned
	}
	closeReader := func() {
		if reader == nil {
			return
		}
		if err := reader.Close(); err != nil {
			w.log.Debug("closing the partition reader failed", "error", err)
		}
		reader = nil
	}
	defer closeReader()
	var start int64
	var commitStart bool
	var beyondEnd *PartitionStoppedError
	for {
		var from string
		var hasStored, ok bool
		start, from, hasStored, ok = w.position(ctx, dbCtx)
		if !ok {
			return // ctx ended, or the partition was taken over (logged)
		}
		start, commitStart, beyondEnd, ok = w.checkLog(ctx, start, from)
		if !ok {
			return
		}
		w.floor = -1
		if w.c.cfg.Offsets.Store && beyondEnd == nil {
			if (!hasStored || commitStart) && !w.storeNext(ctx, dbCtx, -1, start, 0) {
				if w.lost != nil && ctx.Err() == nil {
					// A newer generation wrote the row since position read it.
					w.lost = nil
					continue
				}
				return
			}
			w.floor = start
		}
		break
	}
	w.tracker = newOffsetTracker(start)
	w.c.emit(hooks.Event{Kind: hooks.Assigned, Topic: w.topic, Partition: w.partition, Offset: start})
	w.log.Info("partition assigned", "start_offset", start, "group_committed", w.assigned)
	if commitStart {
		// Now, not with the first processed message: a restart before it
		// must begin here too.
		w.commit(dbCtx, true)
	}
	if beyondEnd != nil {
		w.stopPartition(beyondEnd, "PARTITION STOPPED: its start offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset",
			"group_committed", w.assigned)
		// Held like a partition stopped at a message (see below).
		closeReader()
		<-ctx.Done()
		w.c.emit(hooks.Event{Kind: hooks.Revoked, Topic: w.topic, Partition: w.partition})
		w.log.Info("partition released", "cause", context.Cause(ctx))
		return
	}

	if stop, ok := w.checkLast(ctx, reader, start); !ok {
		return
	} else if stop != nil {
		w.stopPartition(stop, "PARTITION STOPPED: the message before its stored offset is not the one processed there (topic recreated?); nothing is consumed until the offsets are reset")
		closeReader()
		<-ctx.Done()
		w.c.emit(hooks.Event{Kind: hooks.Revoked, Topic: w.topic, Partition: w.partition})
		w.log.Info("partition released", "cause", context.Cause(ctx))
		return
	}
	if err := reader.SetOffset(start); err != nil {
		// Only fails on a closed reader; nothing to fetch from.
		w.log.Error("cannot position the partition reader", "offset", start, "error", err)
		<-ctx.Done()
		return
	}

	halted := false
	lastLogCheck := time.Now()
	w.lastPosCheck = time.Now()
	for ctx.Err() == nil && !halted {
		batch := w.fetch(ctx, reader)
		if len(batch) > 0 {
			halted = w.process(ctx, dbCtx, batch)
			if w.c.crashed(ctx) {
				return
			}
		} else if w.c.cfg.Offsets.Store && time.Since(w.lastPosCheck) >= w.posCheckInterval() {
			pctx, _, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.c.bound())
			w.checkPosition(ctx, pctx)
			cancel()
		}
		if w.lost != nil && !halted && ctx.Err() == nil {
			halted = w.reposition(ctx, dbCtx, reader)
			if w.takenBy != 0 {
				// This member lost its hold: nothing it holds may be
				// committed or stored (Kafka would refuse the commit anyway).
				// Returning tells the client, which makes the member rejoin.
				closeReader()
				w.c.emit(hooks.Event{Kind: hooks.Revoked, Topic: w.topic, Partition: w.partition})
				w.log.Info("partition released", "cause", "taken over", "owner_generation", w.takenBy)
				return
			}
			continue
		}
		if len(batch) == 0 && time.Since(lastLogCheck) >= w.logCheckInterval() {
			if e := w.pastLogEnd(ctx); e != nil {
				w.stopPartition(e, "PARTITION STOPPED: its next offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset")
				halted = true
			}
			lastLogCheck = time.Now()
		}
		w.commit(dbCtx, false)
	}
	if w.c.crashed(ctx) {
		return
	}
	closeReader()
	w.commit(dbCtx, true)
	if halted {
		// Keep the partition until it is revoked or Run ends: returning
		// would make the member rejoin at once, and the message would come
		// straight back.
		<-ctx.Done()
	}
	w.c.emit(hooks.Event{Kind: hooks.Revoked, Topic: w.topic, Partition: w.partition})
	w.log.Info("partition released", "cause", context.Cause(ctx))
}

// position returns the offset to start at, and from, where it came from,
// for messages. ok is false if ctx ended first or the partition was taken
// over (w.takenBy; see claim). checkLog then checks it against the
// partition's log.
//
// Without Offsets.Store it is the group's committed offset (or
// transport.FirstOffset / LastOffset). With Offsets.Store it is the stored offset whenever the
// database has one, also when it is behind the group's: the database's
// position belongs to the state the effects are in. After a failover to an
// asynchronous replica, the effects, inbox rows and stored offset of the
// last commits vanish together while the group's offset in Kafka may
// already be past them; starting at the larger of the two would skip
// exactly those messages. Starting lower only redelivers messages whose
// inbox rows are there, which the inbox absorbs. hasStored reports whether
// the database had a row for the partition; w.stored is that row.
func (w *worker) position(ctx, dbCtx context.Context) (start int64, from string, hasStored, ok bool) {
	start = w.assigned
	from = fmt.Sprintf("the offset committed by group %q", w.c.cfg.GroupID)
	w.stored = storage.OffsetRow{Next: -1}
	if !w.c.cfg.Offsets.Store {
		return start, from, false, true
	}
	row, found, ok := w.claim(ctx, dbCtx)
	if !ok {
		return 0, "", false, false
	}
	if !found {
		return start, from, false, true
	}
	w.stored = row
	stored := row.Next
	switch {
	case w.assigned >= 0 && stored < w.assigned:
		// A member commits to Kafka only offsets it stored (see
		// storeCommittable): the database lost commits, or the offsets
		// were reset in Kafka alone, or Offsets.Store was off for a while.
		w.log.Warn("starting at the stored offset, behind the group's committed one: the database's position wins (after a database failover its last commits may be gone); the messages in between are delivered again",
			"stored", stored, "group_committed", w.assigned, "redelivered", w.assigned-stored)
	case stored != w.assigned:
		w.log.Info("starting at the stored offset", "stored", stored, "group_committed", w.assigned)
	}
	return stored, fmt.Sprintf("the offset stored for group %q in table %s", w.c.cfg.GroupID, w.c.cfg.Offsets.Table), true, true
}

// claim reads the partition's stored row, claiming it for this worker's
// generation first (storage.OffsetStore's ClaimOffset: from then on the
// writes of older generations are refused), and retries while the database
// fails. found
// is false if there is no row. ok is false if ctx ended first, or if the
// partition was taken over (w.takenBy is then set and the takeover logged).
//
// A row written by a newer generation than this worker's means one of two
// things, and the group coordinator tells which (generationCurrent): this
// member's generation is over (it was paused past its session timeout and
// another member owns the partition now: the zombie stops, writing
// nothing), or this generation is current and the row comes from before
// the group was deleted and recreated, when its generation ids started
// again (the row is taken over: storage.OffsetStore's AdoptOffset). A row
// of an older generation is simply claimed: a failover may have brought back an older
// row, offset and generation alike; the offset checks (Advance) deal with
// that.
func (w *worker) claim(ctx, dbCtx context.Context) (row storage.OffsetRow, found, ok bool) {
	w.beginDB()
	defer w.endDB()
	for attempt := 1; ; attempt++ {
		cctx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.c.bound())
		row, found, err := w.c.offsets.Claim(cctx, w.c.db(), w.topic, w.partition, w.genID())
		cancel()
		err = bounded(err)
		if err == nil && (!found || row.Generation <= w.genID()) {
			return row, found, true
		}
		if err == nil {
			w.endDB() // the group coordinator is asked, not the database
			current, ok := w.generationCurrent(ctx, row.Next)
			w.beginDB()
			if !ok {
				return row, found, false
			}
			if !current {
				w.takenBy = row.Generation
				w.log.Warn("partition taken over by a newer generation of the group: this member's generation is over (it was paused or cut off longer than its session timeout: a GC pause, a frozen VM, SIGSTOP); its worker stops without writing or committing anything, and the owner goes on",
					"member_generation", w.genID(), "owner_generation", row.Generation, "stored", row.Next)
				return row, found, false
			}
			actx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's write", w.c.bound())
			adopted, aerr := w.c.offsets.Adopt(actx, w.c.db(), w.topic, w.partition, row.Generation, w.genID())
			cancel()
			aerr = bounded(aerr)
			if aerr == nil && adopted {
				w.log.Info("the stored offset names a newer generation than this member's, which the group coordinator confirms as current: the group was recreated (its generation ids started again); the row is taken over",
					"member_generation", w.genID(), "row_generation", row.Generation, "stored", row.Next)
				row.Generation = w.genID()
				return row, true, true
			}
			if aerr == nil {
				continue // another writer came first: read the row again
			}
			err = aerr
		}
		wait := backoff.Wait(w.c.cfg.Failure.MinBackoff, w.c.cfg.Failure.MaxBackoff, attempt)
		w.log.Warn("cannot read the stored offset; retrying", append([]any{"error", err, "retry_in", wait}, w.c.missingTables(ctx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return storage.OffsetRow{}, false, false
		}
	}
}

// generationCurrent asks the group coordinator whether this member still
// holds the partition in the group's current generation, by committing the
// group offset this worker last committed (or was assigned; stored if there
// is none), which changes nothing: the coordinator accepts a commit only
// from a current member. It retries while the answer says neither (see
// transport.Generation.Over); ok is false if ctx ended first (the partition
// was revoked meanwhile).
func (w *worker) generationCurrent(ctx context.Context, stored int64) (current, ok bool) {
	next := w.lastCommitted
	if next < 0 {
		next = stored
	}
	for attempt := 1; ; attempt++ {
		err := w.gen.Commit(w.topic, w.partition, next)
		switch {
		case err == nil:
			w.lastCommitted = next
			return true, true
		case w.gen.Over(err):
			return false, true
		}
		wait := backoff.Wait(w.c.cfg.Failure.MinBackoff, w.c.cfg.Failure.MaxBackoff, attempt)
		w.log.Warn("cannot ask the group coordinator whether this member's generation is current; retrying", "error", err, "retry_in", wait)
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
// wrote it (w.lost is then set).
//
// It stores the resolved start offset when the database had no position
// for the partition (or one the log no longer holds): from then on the
// database has one, so a later failover that loses commits finds a
// position at or below them instead of falling back to the group's, which
// may be past them. And it stores the offset after a dead letter.
func (w *worker) storeNext(ctx, dbCtx context.Context, floor, next, last int64) bool {
	w.beginDB()
	defer w.endDB()
	for attempt := 1; ; attempt++ {
		err := w.storeOnce(dbCtx, floor, next, last)
		if err == nil {
			return true
		}
		if errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver) {
			return false
		}
		wait := backoff.Wait(w.c.cfg.Failure.MinBackoff, w.c.cfg.Failure.MaxBackoff, attempt)
		w.log.Warn("cannot store the partition's offset; retrying", append([]any{"offset", next, "error", err, "retry_in", wait},
			w.c.missingTables(dbCtx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return false
		}
	}
}

// storeOnce is one attempt of storeNext: the write in a transaction of its
// own. It sets w.lost if the stored offset moved back or a newer
// generation wrote it.
func (w *worker) storeOnce(dbCtx context.Context, floor, next, last int64) error {
	err := txn.Transact(dbCtx, w.c.db(), w.c.classifier(), nil, w.c.bound(), func(tx *gorm.DB) error {
		actx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's write", w.c.bound())
		defer cancel()
		return bounded(w.c.offsets.Advance(actx, tx, w.topic, w.partition, floor, w.write(next, last)))
	})
	switch {
	case err == nil:
		w.floor = max(w.floor, next)
	case errors.Is(err, storage.ErrOffsetMoved) || errors.Is(err, storage.ErrOffsetTakenOver):
		w.lost = err
	}
	return err
}

// write is what a write of next as the stored offset stores: with this
// worker's generation and last, the fingerprint of the message at next - 1
// (0 if unknown).
func (w *worker) write(next, last int64) storage.OffsetWrite {
	return storage.OffsetWrite{Next: next, Generation: w.genID(), Last: last}
}

// fetch returns the next batch: up to BatchSize messages, waiting at most
// BatchWait after the first, and no longer once the reader reached the
// partition's end (CaughtUp). It returns nothing when ctx ends, when an idle
// period of Kafka.CommitInterval passed (so the caller can commit), or after a
// fetch error (logged, then retried after a backoff).
func (w *worker) fetch(ctx context.Context, r transport.PartitionReader) []kafka.Message {
	idle := w.c.cfg.Kafka.CommitInterval
	if idle <= 0 {
		idle = time.Second
	}
	fctx, cancel := context.WithTimeout(ctx, idle)
	m, err := r.Fetch(fctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			w.log.Warn("fetch failed; retrying", "error", err)
			_ = backoff.Sleep(ctx, w.c.cfg.Failure.MinBackoff)
		}
		return nil
	}
	batch := []kafka.Message{m}
	if w.c.cfg.BatchSize > 1 {
		bctx, cancel := context.WithTimeout(ctx, w.c.cfg.BatchWait)
		defer cancel()
		for len(batch) < w.c.cfg.BatchSize {
			var m kafka.Message
			var err error
			if r.CaughtUp() {
				// Nothing more is on its way: the batch goes now rather
				// than after BatchWait, unless a message was fetched
				// meanwhile. While the partition holds more, the batch
				// waits for it as before: batches stay full under load.
				gctx, gcancel := context.WithTimeout(bctx, batchGrace)
				m, err = r.Fetch(gctx)
				gcancel()
			} else {
				m, err = r.Fetch(bctx)
			}
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
	}
	return batch
}

// batchGrace is how long a batch waits for one more message once its
// reader reached the partition's end.
const batchGrace = time.Millisecond

// afterCommit runs the tests' AfterDB knob (internal/testhooks) after a
// database commit and reports whether it simulated a crash.
func (w *worker) afterCommit(ctx context.Context, processed int) bool {
	if w.c.knobs.AfterDB == nil {
		return false
	}
	next, _ := w.tracker.committable()
	if errors.Is(w.c.knobs.AfterDB(w.topic, w.partition, next, processed), testhooks.ErrCrash) {
		w.c.crash()
		<-ctx.Done()
		return true
	}
	return false
}

// commit commits the committable offset to Kafka if it moved, at most once
// per Kafka.CommitInterval unless force. With Offsets.Store it commits no offset
// the database does not hold (see storeCommittable).
func (w *worker) commit(dbCtx context.Context, force bool) {
	next, ok := w.tracker.committable()
	if !ok || next <= w.lastCommitted {
		return
	}
	if !force && w.c.cfg.Kafka.CommitInterval > 0 && time.Since(w.lastCommitAt) < w.c.cfg.Kafka.CommitInterval {
		return
	}
	if w.c.cfg.Offsets.Store && next > w.floor {
		if next, ok = w.storeCommittable(dbCtx, next); !ok || next <= w.lastCommitted {
			return
		}
	}
	err := w.gen.Commit(w.topic, w.partition, next)
	if err != nil {
		w.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds (the inbox absorbs them)",
			"next_offset", next, "error", err)
		return
	}
	w.lastCommitted, w.lastCommitAt = next, time.Now()
	w.c.emit(hooks.Event{Kind: hooks.Committed, Topic: w.topic, Partition: w.partition, Offset: next})
}
