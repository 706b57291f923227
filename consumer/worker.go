package consumer

// The partition worker: the loop that wires a partition's pieces (the
// positioner, the batch runner and the committer): fetch, run, commit.

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport"
)

// worker consumes one partition from the generation that started it until
// the partition is revoked from this member (see Consumer.startGeneration).
type worker struct {
	*part
	pos    *positioner
	runner *batchRunner
	com    *committer
	fetchSettings
	done chan struct{} // closed once the worker returned (Consumer.removeWorker)
}

// newWorker makes the worker of the partition a, of topic, started by
// gen. It and the constructors it calls are the only code of a worker that
// reads the Config: the pieces get copies of the settings they use.
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
		bound:      c.bound(),
		minBackoff: cfg.Failure.MinBackoff,
		maxBackoff: cfg.Failure.MaxBackoff,
	}
	com := newCommitter(c, p, a.Offset)
	fs := fetchSettings{batchSize: cfg.BatchSize, batchWait: cfg.BatchWait, idle: cfg.Kafka.CommitInterval}
	if fs.idle <= 0 {
		fs.idle = time.Second
	}
	return &worker{
		part:          p,
		pos:           newPositioner(c, p, com, a.Offset),
		runner:        newBatchRunner(c, p, com),
		com:           com,
		fetchSettings: fs,
		done:          make(chan struct{}),
	}
}

// newCommitter makes the committer of p, whose group's committed offset is
// assigned (or a sentinel).
func newCommitter(c *Consumer, p *part, assigned int64) *committer {
	com := &committer{
		part: p,
		commitSettings: commitSettings{
			store:            c.cfg.Offsets.Store,
			interval:         c.cfg.Kafka.CommitInterval,
			posCheckInterval: cmp.Or(max(c.knobs.PosCheckInterval, 0), defaultPosCheckInterval),
		},
		offsets:       c.offsets,
		lastCommitted: -1,
		floor:         -1,
	}
	if assigned >= 0 {
		com.lastCommitted = assigned
	}
	return com
}

// newPositioner makes the positioner of p, whose group's committed offset
// is assigned (or a sentinel).
func newPositioner(c *Consumer, p *part, com *committer, assigned int64) *positioner {
	return &positioner{
		part: p,
		positionSettings: positionSettings{
			store:            c.cfg.Offsets.Store,
			group:            c.cfg.GroupID,
			table:            c.cfg.Offsets.Table,
			logCheckInterval: cmp.Or(max(c.knobs.LogCheckInterval, 0), defaultLogCheckInterval),
		},
		com:      com,
		offsets:  c.offsets,
		assigned: assigned,
	}
}

// newBatchRunner makes the batch runner of p.
func newBatchRunner(c *Consumer, p *part, com *committer) *batchRunner {
	cfg := &c.cfg
	b := &batchRunner{
		part: p,
		runSettings: runSettings{
			extract:         cfg.Extract,
			idempotent:      cfg.NaturallyIdempotent,
			handler:         cfg.Handler,
			batchHandler:    cfg.BatchHandler,
			inboxOf:         cfg.Inbox,
			consumer:        cfg.Consumer,
			maxAttempts:     cfg.Failure.MaxAttempts,
			handlerTimeout:  cfg.Timeouts.Handler,
			onFailure:       cfg.Failure.Policy,
			deadLetterTopic: cfg.Failure.DeadLetterTopic,
			group:           cfg.GroupID,
			seqRowsUntil:    cfg.Sequenced.RowsUntil,
			acceptGaps:      cfg.Sequenced.AcceptGaps,
		},
		com:      com,
		contexts: c.contexts,
		dlq:      c.dlq,
		afterDB:  c.knobs.AfterDB,
		trusted:  c.trusted,
	}
	if len(c.trusted) > 0 {
		b.seq = &watermarks{store: c.watermarks, scope: cfg.Consumer, topic: p.topic, partition: int32(p.partition)}
	}
	return b
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
// hold; see positioner.claim): the client then makes the member rejoin the
// group.
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
	r := &heldReader{PartitionReader: reader, log: w.log}
	defer r.close()

	if !w.assign(ctx, dbCtx, r) {
		return
	}
	halted, ok := w.consume(ctx, dbCtx, r)
	if !ok {
		return
	}
	r.close()
	w.com.commit(dbCtx, true)
	if halted {
		// Keep the partition until it is revoked or Run ends: returning
		// would make the member rejoin at once, and the message would come
		// straight back.
		<-ctx.Done()
	}
	w.released(ctx)
}

// heldReader is the partition's reader until the worker closes it.
type heldReader struct {
	transport.PartitionReader // nil once closed
	log                       *slog.Logger
}

// close closes the reader, once.
func (r *heldReader) close() {
	if r.PartitionReader == nil {
		return
	}
	if err := r.Close(); err != nil {
		r.log.Debug("closing the partition reader failed", "error", err)
	}
	r.PartitionReader = nil
}

// released reports that the worker gives its partition up as ctx ended.
func (w *worker) released(ctx context.Context) {
	w.emit(hooks.Event{Kind: hooks.Revoked})
	w.log.Info("partition released", "cause", context.Cause(ctx))
}

// hold keeps a partition stopped on assignment until it is revoked or Run
// ends, as a partition stopped at a message (see run), reading nothing.
func (w *worker) hold(ctx context.Context, r *heldReader) {
	r.close()
	<-ctx.Done()
	w.released(ctx)
}

// assign starts the partition: it finds and stores its start (startAt),
// commits it when it must be at once, checks that the topic was not
// recreated (positioner.checkLast) and moves r there. It returns false when
// the worker is done: ctx ended, the partition was taken over, or it was
// stopped and held until ctx ended.
func (w *worker) assign(ctx, dbCtx context.Context, r *heldReader) bool {
	s, ok := w.startAt(ctx, dbCtx)
	if !ok {
		return false // ctx ended, or the partition was taken over (logged)
	}
	w.com.restart(s.offset)
	w.emit(hooks.Event{Kind: hooks.Assigned, Offset: s.offset})
	w.log.Info("partition assigned", "start_offset", s.offset, "group_committed", w.pos.assigned)
	if s.commit {
		// Now, not with the first processed message: a restart before it
		// must begin here too.
		w.com.commit(dbCtx, true)
	}
	if s.beyondEnd != nil {
		w.stopPartition(s.beyondEnd, "PARTITION STOPPED: its start offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset",
			"group_committed", w.pos.assigned)
		w.hold(ctx, r)
		return false
	}
	if stop, ok := w.pos.checkLast(ctx, r, s.offset); !ok {
		return false
	} else if stop != nil {
		w.stopPartition(stop, "PARTITION STOPPED: the message before its stored offset is not the one processed there (topic recreated?); nothing is consumed until the offsets are reset")
		w.hold(ctx, r)
		return false
	}
	if err := r.SetOffset(s.offset); err != nil {
		// Only fails on a closed reader; nothing to fetch from.
		w.log.Error("cannot position the partition reader", "offset", s.offset, "error", err)
		<-ctx.Done()
		return false
	}
	return true
}

// startAt is where the partition starts (positioner.locate). With
// Offsets.Store it stores that offset first when the database has none, or
// when it is to be committed at once, and makes it the committer's floor.
// ok is false if ctx ended first or the partition was taken over.
func (w *worker) startAt(ctx, dbCtx context.Context) (s start, ok bool) {
	for {
		s, ok = w.pos.locate(ctx, dbCtx)
		if !ok {
			return s, false
		}
		w.com.floor = -1
		if w.com.store && s.beyondEnd == nil {
			if (!s.hasStored || s.commit) && !w.com.storeNext(ctx, dbCtx, -1, s.offset, 0) {
				if w.com.lost != nil && ctx.Err() == nil {
					// A newer generation wrote the row since position read it.
					w.com.lost = nil
					continue
				}
				return s, false
			}
			w.com.floor = s.offset
		}
		return s, true
	}
}

// consume is the fetch loop: fetch a batch, run it, commit, until ctx ends
// or the partition halts (halted). Idle, it checks the stored offset
// (committer.checkPosition) and the log end (positioner.pastLogEnd). ok is
// false when the worker is to return at once, committing nothing: a
// simulated crash, or the partition was taken over.
func (w *worker) consume(ctx, dbCtx context.Context, r *heldReader) (halted, ok bool) {
	lastLogCheck := time.Now()
	w.com.lastPosCheck = time.Now()
	for ctx.Err() == nil && !halted {
		batch := w.fetch(ctx, r)
		if len(batch) > 0 {
			halted = w.runner.process(ctx, dbCtx, batch)
			if crashed(ctx) {
				return halted, false
			}
		} else if w.com.positionDue() {
			pctx, _, cancel := txn.WithBound(dbCtx, "the stored offset's read", w.bound)
			w.com.checkPosition(pctx)
			cancel()
		}
		if w.com.lost != nil && !halted && ctx.Err() == nil {
			halted = w.reposition(ctx, dbCtx, r)
			if w.pos.takenBy != 0 {
				// This member lost its hold: nothing it holds may be
				// committed or stored (Kafka would refuse the commit anyway).
				// Returning tells the client, which makes the member rejoin.
				r.close()
				w.emit(hooks.Event{Kind: hooks.Revoked})
				w.log.Info("partition released", "cause", "taken over", "owner_generation", w.pos.takenBy)
				return halted, false
			}
			continue
		}
		if len(batch) == 0 && time.Since(lastLogCheck) >= w.pos.logCheckInterval {
			if e := w.pos.pastLogEnd(ctx); e != nil {
				w.stopPartition(e, "PARTITION STOPPED: its next offset is past the log end (topic recreated?); nothing is consumed until the offsets are reset")
				halted = true
			}
			lastLogCheck = time.Now()
		}
		w.com.commit(dbCtx, false)
	}
	return halted, !crashed(ctx)
}

// reposition reads the database's position again after the committer lost
// it (committer.lost), and either stops the worker or resumes the partition
// from there. It returns halt, as batchRunner.process does.
//
// A newer generation wrote the row (a *storage.OffsetTakenOverError):
// positioner.claim finds out whether this member's generation is over, and
// then sets positioner.takenBy and returns (the caller stops the worker), or
// whether the group was recreated, and then takes the row over, and the
// partition resumes from it.
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
	if seq := w.runner.seq; seq != nil {
		// The watermarks went back with the stored offset: the messages
		// read again are judged by the database's, not by those in memory,
		// which would take them for duplicates.
		seq.loaded = false
	}
	prev, _ := w.com.committable()
	s, ok := w.pos.locate(ctx, dbCtx)
	if !ok {
		return false
	}
	start := s.offset
	if s.beyondEnd != nil {
		w.stopPartition(s.beyondEnd, "PARTITION STOPPED: the database's position is past the log end; nothing is consumed until the offsets are reset")
		return true
	}
	if (!s.hasStored || s.commit) && !w.com.storeNext(ctx, dbCtx, -1, start, 0) {
		return false
	}
	stop, ok := w.pos.checkLast(ctx, reader, start)
	if !ok {
		return false
	}
	if stop != nil {
		w.com.restart(start)
		w.stopPartition(stop, "PARTITION STOPPED: the message before the database's position is not the one processed there (topic recreated?); nothing is consumed until the offsets are reset")
		return true
	}
	w.com.floor = start
	if errors.Is(cause, storage.ErrOffsetTakenOver) && start >= prev {
		// The group was recreated and the row taken over (positioner.claim): no
		// commit was lost.
		w.log.Info("resuming from the stored offset, now this generation's", "stored", start, "worker_next", prev)
	} else {
		w.log.Warn("the database's stored offset went back behind what this worker committed (a failover to a replica that lacked the last commits?); resuming from it: the messages in between are applied again",
			"stored", start, "worker_next", prev, "redelivered", max(prev-start, 0), "cause", cause)
		w.emit(hooks.Event{Kind: hooks.Repositioned, Offset: start, Err: cause})
	}
	w.com.restart(start)
	if err := reader.SetOffset(start); err != nil {
		w.log.Error("cannot position the partition reader", "offset", start, "error", err)
		return true
	}
	return false
}

// fetch returns the next batch: up to BatchSize messages, waiting at most
// BatchWait after the first, and no longer once the reader reached the
// partition's end (CaughtUp). It returns nothing when ctx ends, when an idle
// period of Kafka.CommitInterval passed (so the caller can commit), or after a
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
	idle      time.Duration // Config.Kafka.CommitInterval, or a second: how long a fetch waits for a message
}

// batchGrace is how long a batch waits for one more message once its
// reader reached the partition's end.
const batchGrace = time.Millisecond
