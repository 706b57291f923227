package consumer

// The partition worker: the fetch loop, its starting position and stored
// offsets, and the offset commits. Processing is in process.go, the failure
// policy in failure.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/offsets"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/internal/txn"
)

// worker consumes one assigned partition for one generation.
type worker struct {
	c         *Consumer
	gen       generation
	commitMu  *sync.Mutex // serialises the generation's offset commits
	topic     string
	partition int
	assigned  int64 // the group's committed offset, or offsetFirst / offsetLast
	log       *slog.Logger

	tracker       *offsetTracker
	lastCommitted int64
	lastCommitAt  time.Time

	// With StoreOffsets: floor is the highest stored offset this worker
	// knows to be committed (-1: none), and every later write of the stored
	// offset checks that the database is still at or past it. lost is set
	// when it is not (the database went back in time: a failover that lost
	// commits); the worker then resumes from the database's position.
	floor        int64
	lost         error
	lastPosCheck time.Time

	// waitingSince (UnixNano; 0: not waiting) is when the worker began
	// waiting for the database to answer its work: the watchdog's view of
	// it (see Consumer.watch).
	waitingSince atomic.Int64
}

// item is one fetched message on its way through the worker.
type item struct {
	msg        Message
	extractErr error
	attempts   int
}

// resolution is what became of a message that failed.
type resolution int

const (
	resolved  resolution = iota // finished: processed, duplicate or dead-lettered
	stopped                     // the partition stops at it
	abandoned                   // the worker is stopping; the message stays unfinished
)

// run is the worker's whole life. It returns only when ctx or genCtx ends:
// the generation ends as soon as one started function returns.
func (w *worker) run(runCtx, genCtx context.Context) {
	ctx, cancel := context.WithCancelCause(runCtx)
	defer cancel(nil)
	stopAfter := context.AfterFunc(genCtx, func() { cancel(context.Cause(genCtx)) })
	defer stopAfter()
	// Database work in flight finishes when the generation ends (a
	// rebalance), each step of the consumer's own within DatabaseTimeout,
	// and is rolled back when Run ends, or when this member leaves the
	// group over a stalled partition (runCtx is the membership's).
	dbCtx := runCtx

	start, from, hasStored, ok := w.position(ctx, dbCtx)
	if !ok {
		return
	}
	start, commitStart, beyondEnd, ok := w.checkLog(ctx, start, from)
	if !ok {
		return
	}
	w.floor = -1
	if w.c.cfg.StoreOffsets && beyondEnd == nil {
		if (!hasStored || commitStart) && !w.storeNext(ctx, dbCtx, -1, start) {
			return
		}
		w.floor = start
	}
	w.tracker = newOffsetTracker(start)
	w.lastCommitted = -1
	if w.assigned >= 0 {
		w.lastCommitted = w.assigned
	}
	w.c.emit(hooks.Event{Kind: hooks.Assigned, Topic: w.topic, Partition: w.partition, Offset: start})
	w.log.Info("partition assigned", "start_offset", start, "group_committed", w.assigned)
	if commitStart {
		// Now, not with the first processed message: a restart before it
		// must begin here too.
		w.commit(true)
	}
	if beyondEnd != nil {
		w.stopPartition(beyondEnd, "PARTITION STOPPED: its start offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset",
			"group_committed", w.assigned)
		// Held like a partition stopped at a message (see below).
		<-ctx.Done()
		w.c.emit(hooks.Event{Kind: hooks.Revoked, Topic: w.topic, Partition: w.partition})
		w.log.Info("partition released", "cause", context.Cause(ctx))
		return
	}

	reader := w.c.client.reader(w.topic, w.partition, w.log)
	closeReader := func() {
		if reader == nil {
			return
		}
		if err := reader.close(); err != nil {
			w.log.Debug("closing the partition reader failed", "error", err)
		}
		reader = nil
	}
	defer closeReader()
	if err := reader.seek(start); err != nil {
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
		} else if w.c.cfg.StoreOffsets && time.Since(w.lastPosCheck) >= w.posCheckInterval() {
			pctx, _, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.c.bound())
			w.checkPosition(ctx, pctx)
			cancel()
		}
		if w.lost != nil && !halted && ctx.Err() == nil {
			halted = w.reposition(ctx, dbCtx, reader)
			continue
		}
		if len(batch) == 0 && time.Since(lastLogCheck) >= w.logCheckInterval() {
			if e := w.pastLogEnd(ctx); e != nil {
				w.stopPartition(e, "PARTITION STOPPED: its next offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset")
				halted = true
			}
			lastLogCheck = time.Now()
		}
		w.commit(false)
	}
	if w.c.crashed(ctx) {
		return
	}
	closeReader()
	w.commit(true)
	if halted {
		// Keep the partition (and the generation) until the next rebalance or
		// the end of Run: returning would trigger a rebalance at once, and the
		// message would come straight back.
		<-ctx.Done()
	}
	w.c.emit(hooks.Event{Kind: hooks.Revoked, Topic: w.topic, Partition: w.partition})
	w.log.Info("partition released", "cause", context.Cause(ctx))
}

// position returns the offset to start at, and from, where it came from,
// for messages. ok is false if ctx ended first. checkLog then checks it
// against the partition's log.
//
// Without StoreOffsets it is the group's committed offset (or offsetFirst /
// offsetLast). With StoreOffsets it is the stored offset whenever the
// database has one, also when it is behind the group's: the database's
// position belongs to the state the effects are in. After a failover to an
// asynchronous replica, the effects, inbox rows and stored offset of the
// last commits vanish together while the group's offset in Kafka may
// already be past them; starting at the larger of the two would skip
// exactly those messages. Starting lower only redelivers messages whose
// inbox rows are there, which the inbox absorbs. hasStored reports whether
// the database had a row for the partition.
func (w *worker) position(ctx, dbCtx context.Context) (start int64, from string, hasStored, ok bool) {
	start = w.assigned
	from = fmt.Sprintf("the offset committed by group %q", w.c.cfg.GroupID)
	if !w.c.cfg.StoreOffsets {
		return start, from, false, true
	}
	w.beginDB()
	defer w.endDB()
	for attempt := 1; ; attempt++ {
		lctx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.c.bound())
		stored, err := w.c.offsets.Load(lctx, w.c.db(), w.topic, w.partition)
		cancel()
		err = bounded(err)
		if err == nil {
			if stored < 0 {
				return start, from, false, true
			}
			switch {
			case w.assigned >= 0 && stored < w.assigned:
				// Not an error: a failover to a replica that lacked the last
				// commits, or a commit to Kafka after an offset that did not
				// move the stored one (a duplicate), look the same.
				w.log.Warn("starting at the stored offset, behind the group's committed one: the database's position wins (after a database failover its last commits may be gone); the messages in between are delivered again",
					"stored", stored, "group_committed", w.assigned, "redelivered", w.assigned-stored)
			case stored != w.assigned:
				w.log.Info("starting at the stored offset", "stored", stored, "group_committed", w.assigned)
			}
			return stored, fmt.Sprintf("the offset stored for group %q in table %s", w.c.cfg.GroupID, w.c.cfg.OffsetsTable), true, true
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, attempt)
		w.log.Warn("cannot read the stored offset; retrying", "error", err, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return 0, "", false, false
		}
	}
}

// storeNext writes next as the partition's stored offset in a transaction
// of its own (checked against floor, see offsets.Store.Advance), retrying
// while the database fails; false if ctx ended first or the stored offset
// moved back (w.lost is then set).
//
// It stores the resolved start offset when the database had no position
// for the partition (or one the log no longer holds): from then on the
// database has one, so a later failover that loses commits finds a
// position at or below them instead of falling back to the group's, which
// may be past them. And it stores the offset after a dead letter.
func (w *worker) storeNext(ctx, dbCtx context.Context, floor, next int64) bool {
	w.beginDB()
	defer w.endDB()
	for attempt := 1; ; attempt++ {
		err := txn.Transact(dbCtx, w.c.db(), w.c.classifier(), nil, w.c.bound(), func(tx *gorm.DB) error {
			actx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's write", w.c.bound())
			defer cancel()
			return bounded(w.c.offsets.Advance(actx, tx, w.topic, w.partition, floor, next))
		})
		if err == nil {
			w.floor = max(w.floor, next)
			return true
		}
		if errors.Is(err, offsets.ErrPositionMoved) {
			w.lost = err
			return false
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, attempt)
		w.log.Warn("cannot store the partition's offset; retrying", "offset", next, "error", err, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return false
		}
	}
}

// fetch returns the next batch: up to BatchSize messages, waiting at most
// BatchWait after the first. It returns nothing when ctx ends, when an idle
// period of CommitInterval passed (so the caller can commit), or after a
// fetch error (logged, then retried after a backoff).
func (w *worker) fetch(ctx context.Context, r partitionReader) []kafka.Message {
	idle := w.c.cfg.CommitInterval
	if idle <= 0 {
		idle = time.Second
	}
	fctx, cancel := context.WithTimeout(ctx, idle)
	m, err := r.fetch(fctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			w.log.Warn("fetch failed; retrying", "error", err)
			_ = backoff.Sleep(ctx, w.c.cfg.MinBackoff)
		}
		return nil
	}
	batch := []kafka.Message{m}
	if w.c.cfg.BatchSize > 1 {
		bctx, cancel := context.WithTimeout(ctx, w.c.cfg.BatchWait)
		defer cancel()
		for len(batch) < w.c.cfg.BatchSize {
			m, err := r.fetch(bctx)
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
	}
	return batch
}

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
// per CommitInterval unless force.
func (w *worker) commit(force bool) {
	next, ok := w.tracker.committable()
	if !ok || next <= w.lastCommitted {
		return
	}
	if !force && w.c.cfg.CommitInterval > 0 && time.Since(w.lastCommitAt) < w.c.cfg.CommitInterval {
		return
	}
	w.commitMu.Lock()
	err := w.gen.commit(w.topic, w.partition, next)
	w.commitMu.Unlock()
	if err != nil {
		w.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds (the inbox absorbs them)",
			"next_offset", next, "error", err)
		return
	}
	w.lastCommitted, w.lastCommitAt = next, time.Now()
	w.c.emit(hooks.Event{Kind: hooks.Committed, Topic: w.topic, Partition: w.partition, Offset: next})
}
