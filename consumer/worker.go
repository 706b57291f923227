package consumer

// The partition worker: the fetch loop, its starting position and stored
// offsets, and the offset commits. Processing is in process.go, the failure
// policy in failure.go.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

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
	*part
	c   *Consumer
	com *committer
	fetchSettings
	assigned int64         // the group's committed offset, or transport.FirstOffset / LastOffset
	done     chan struct{} // closed once the worker returned (Consumer.removeWorker)

	// takenBy is the generation that took the partition over (see claim).
	takenBy int32
	// stored is the row the position was read from (Next -1: none), and
	// logStart the log start offset checkLog found.
	stored   storage.OffsetRow
	logStart int64
	// batch is the batch in process, for the fingerprint of the message
	// before a stored offset (lastOf).
	batch []*item
	// seq holds the partition's sequenced streams (nil without
	// Config.SequencedSources); seqMoved says the last processInbox gave
	// up because a watermark moved, gapStopped that runAlone stopped the
	// partition at its message.
	seq        *watermarks
	seqMoved   bool
	gapStopped bool
}

// newWorker makes the worker of the partition a, of topic, started by
// gen. It and newWorker's helpers are the only code of a worker that
// reads c.cfg: the pieces get copies of the settings they use.
func newWorker(c *Consumer, gen transport.Generation, topic string, a transport.Assignment) *worker {
	cfg := &c.cfg
	p := &part{
		topic:      topic,
		partition:  a.Partition,
		gen:        gen,
		log:        c.log.With("topic", topic, "partition", a.Partition, "generation", gen.ID()),
		host:       c,
		db:         c.db(),
		classifier: cfg.Classifier,
		bound:      max(cfg.DatabaseTimeout, 0),
		minBackoff: cfg.MinBackoff,
		maxBackoff: cfg.MaxBackoff,
	}
	com := &committer{
		part: p,
		commitSettings: commitSettings{
			store:            cfg.StoreOffsets,
			interval:         cfg.CommitInterval,
			posCheckInterval: cmp.Or(max(c.knobs.PosCheckInterval, 0), defaultPosCheckInterval),
		},
		offsets: c.offsets,
	}
	fs := fetchSettings{batchSize: cfg.BatchSize, batchWait: cfg.BatchWait, idle: cfg.CommitInterval}
	if fs.idle <= 0 {
		fs.idle = time.Second
	}
	w := &worker{part: p, c: c, com: com, fetchSettings: fs, assigned: a.Offset, done: make(chan struct{})}
	w.seq = w.newWatermarks()
	return w
}

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
	// rebalance), each step of the consumer's own within DatabaseTimeout,
	// and is rolled back when Run ends, or when this member leaves the
	// group over a stalled partition (runCtx is the membership's).
	dbCtx := runCtx

	w.com.lastCommitted = -1
	if w.assigned >= 0 {
		w.com.lastCommitted = w.assigned
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
		w.com.floor = -1
		if w.c.cfg.StoreOffsets && beyondEnd == nil {
			if (!hasStored || commitStart) && !w.com.storeNext(ctx, dbCtx, -1, start, 0) {
				if w.com.lost != nil && ctx.Err() == nil {
					// A newer generation wrote the row since position read it.
					w.com.lost = nil
					continue
				}
				return
			}
			w.com.floor = start
		}
		break
	}
	w.com.tracker = newOffsetTracker(start)
	w.emit(hooks.Event{Kind: hooks.Assigned, Offset: start})
	w.log.Info("partition assigned", "start_offset", start, "group_committed", w.assigned)
	if commitStart {
		// Now, not with the first processed message: a restart before it
		// must begin here too.
		w.com.commit(dbCtx, true)
	}
	if beyondEnd != nil {
		w.stopPartition(beyondEnd, "PARTITION STOPPED: its start offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset",
			"group_committed", w.assigned)
		// Held like a partition stopped at a message (see below).
		closeReader()
		<-ctx.Done()
		w.emit(hooks.Event{Kind: hooks.Revoked})
		w.log.Info("partition released", "cause", context.Cause(ctx))
		return
	}

	if stop, ok := w.checkLast(ctx, reader, start); !ok {
		return
	} else if stop != nil {
		w.stopPartition(stop, "PARTITION STOPPED: the message before its stored offset is not the one processed there (topic recreated?); nothing is consumed until the offsets are reset")
		closeReader()
		<-ctx.Done()
		w.emit(hooks.Event{Kind: hooks.Revoked})
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
	w.com.lastPosCheck = time.Now()
	for ctx.Err() == nil && !halted {
		batch := w.fetch(ctx, reader)
		if len(batch) > 0 {
			halted = w.process(ctx, dbCtx, batch)
			if w.c.crashed(ctx) {
				return
			}
		} else if w.com.positionDue() {
			pctx, _, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.bound)
			w.com.checkPosition(pctx)
			cancel()
		}
		if w.com.lost != nil && !halted && ctx.Err() == nil {
			halted = w.reposition(ctx, dbCtx, reader)
			if w.takenBy != 0 {
				// This member lost its hold: nothing it holds may be
				// committed or stored (Kafka would refuse the commit anyway).
				// Returning tells the client, which makes the member rejoin.
				closeReader()
				w.emit(hooks.Event{Kind: hooks.Revoked})
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
		w.com.commit(dbCtx, false)
	}
	if w.c.crashed(ctx) {
		return
	}
	closeReader()
	w.com.commit(dbCtx, true)
	if halted {
		// Keep the partition until it is revoked or Run ends: returning
		// would make the member rejoin at once, and the message would come
		// straight back.
		<-ctx.Done()
	}
	w.emit(hooks.Event{Kind: hooks.Revoked})
	w.log.Info("partition released", "cause", context.Cause(ctx))
}

// position returns the offset to start at, and from, where it came from,
// for messages. ok is false if ctx ended first or the partition was taken
// over (w.takenBy; see claim). checkLog then checks it against the
// partition's log.
//
// Without StoreOffsets it is the group's committed offset (or
// transport.FirstOffset / LastOffset). With StoreOffsets it is the stored offset whenever the
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
	if !w.c.cfg.StoreOffsets {
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
		// were reset in Kafka alone, or StoreOffsets was off for a while.
		w.log.Warn("starting at the stored offset, behind the group's committed one: the database's position wins (after a database failover its last commits may be gone); the messages in between are delivered again",
			"stored", stored, "group_committed", w.assigned, "redelivered", w.assigned-stored)
	case stored != w.assigned:
		w.log.Info("starting at the stored offset", "stored", stored, "group_committed", w.assigned)
	}
	return stored, fmt.Sprintf("the offset stored for group %q in table %s", w.c.cfg.GroupID, w.c.cfg.OffsetsTable), true, true
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
		cctx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.bound)
		row, found, err := w.c.offsets.Claim(cctx, w.db, w.topic, w.partition, w.genID())
		cancel()
		err = bounded(err)
		if err == nil && (!found || row.Generation <= w.genID()) {
			return row, found, true
		}
		if err == nil {
			w.endDB() // the group coordinator is asked, not the database
			current, ok := w.com.generationCurrent(ctx, row.Next)
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
			actx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's write", w.bound)
			adopted, aerr := w.c.offsets.Adopt(actx, w.db, w.topic, w.partition, row.Generation, w.genID())
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
		wait := w.retryWait(attempt)
		w.log.Warn("cannot read the stored offset; retrying", append([]any{"error", err, "retry_in", wait}, w.host.missingTables(ctx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return storage.OffsetRow{}, false, false
		}
	}
}

// fetch returns the next batch: up to BatchSize messages, waiting at most
// BatchWait after the first, and no longer once the reader reached the
// partition's end (CaughtUp). It returns nothing when ctx ends, when an idle
// period of CommitInterval passed (so the caller can commit), or after a
// fetch error (logged, then retried after a backoff).
func (w *worker) fetch(ctx context.Context, r transport.PartitionReader) []kafka.Message {
	fctx, cancel := context.WithTimeout(ctx, w.idle)
	m, err := r.Fetch(fctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			w.log.Warn("fetch failed; retrying", "error", err)
			_ = backoff.Sleep(ctx, w.minBackoff)
		}
		return nil
	}
	batch := []kafka.Message{m}
	if w.batchSize > 1 {
		bctx, cancel := context.WithTimeout(ctx, w.batchWait)
		defer cancel()
		for len(batch) < w.batchSize {
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

// fetchSettings are the Config's settings of the fetch loop.
type fetchSettings struct {
	batchSize int           // Config.BatchSize
	batchWait time.Duration // Config.BatchWait
	idle      time.Duration // Config.CommitInterval, or a second: how long a fetch waits for a message
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
	next, _ := w.com.tracker.committable()
	if errors.Is(w.c.knobs.AfterDB(w.topic, w.partition, next, processed), testhooks.ErrCrash) {
		w.c.crash()
		<-ctx.Done()
		return true
	}
	return false
}
