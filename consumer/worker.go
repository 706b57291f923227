package consumer

import (
	"context"
	"errors"
	"fmt"
	"github.com/inboxgo/inbox/internal/backoff"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/kafkaerr"
)

// worker consumes one assigned partition for one generation.
type worker struct {
	c         *Consumer
	gen       *kafka.Generation
	commitMu  *sync.Mutex // serialises the generation's offset commits
	topic     string
	partition int
	assigned  int64 // the group's committed offset, or a kafka-go sentinel
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
// kafka-go ends the generation as soon as one started function returns.
func (w *worker) run(runCtx, genCtx context.Context) {
	ctx, cancel := context.WithCancelCause(runCtx)
	defer cancel(nil)
	stopAfter := context.AfterFunc(genCtx, func() { cancel(kafka.ErrGenerationEnded) })
	defer stopAfter()
	// Database work in flight finishes when the generation ends (a rebalance)
	// and is rolled back when Run ends.
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
	w.c.emit(Event{Kind: EventAssigned, Topic: w.topic, Partition: w.partition, Offset: start})
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
		w.c.emit(Event{Kind: EventRevoked, Topic: w.topic, Partition: w.partition})
		w.log.Info("partition released", "cause", context.Cause(ctx))
		return
	}

	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     w.c.cfg.Brokers,
		Topic:       w.topic,
		Partition:   w.partition,
		Dialer:      w.c.cfg.Dialer,
		MinBytes:    1,
		MaxBytes:    readerMaxBytes,
		MaxWait:     w.c.cfg.MaxWait,
		Logger:      kafkaLogger(w.log, slog.LevelDebug),
		ErrorLogger: kafkaLogger(w.log, slog.LevelWarn),
	})
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
		} else if w.c.cfg.StoreOffsets && time.Since(w.lastPosCheck) >= w.posCheckInterval() {
			w.checkPosition(ctx, dbCtx)
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
	w.c.emit(Event{Kind: EventRevoked, Topic: w.topic, Partition: w.partition})
	w.log.Info("partition released", "cause", context.Cause(ctx))
}

// position returns the offset to start at, and from, where it came from,
// for messages. ok is false if ctx ended first. checkLog then checks it
// against the partition's log.
//
// Without StoreOffsets it is the group's committed offset (or a kafka-go
// sentinel). With StoreOffsets it is the stored offset whenever the
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
	for attempt := 1; ; attempt++ {
		stored, err := w.c.offsets.load(dbCtx, w.c.db(), w.topic, w.partition)
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
// of its own (checked against floor, see offsetStore.advance), retrying
// while the database fails; false if ctx ended first or the stored offset
// moved back (w.lost is then set).
//
// It stores the resolved start offset when the database had no position
// for the partition (or one the log no longer holds): from then on the
// database has one, so a later failover that loses commits finds a
// position at or below them instead of falling back to the group's, which
// may be past them. And it stores the offset after a dead letter.
func (w *worker) storeNext(ctx, dbCtx context.Context, floor, next int64) bool {
	for attempt := 1; ; attempt++ {
		err := w.c.db().WithContext(dbCtx).Transaction(func(tx *gorm.DB) error {
			return w.c.offsets.advance(dbCtx, tx, w.topic, w.partition, floor, next)
		})
		if err == nil {
			w.floor = max(w.floor, next)
			return true
		}
		if errors.Is(err, errPositionMoved) {
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
func (w *worker) fetch(ctx context.Context, r *kafka.Reader) []kafka.Message {
	idle := w.c.cfg.CommitInterval
	if idle <= 0 {
		idle = time.Second
	}
	fctx, cancel := context.WithTimeout(ctx, idle)
	m, err := r.FetchMessage(fctx)
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
			m, err := r.FetchMessage(bctx)
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
	}
	return batch
}

// process handles a batch in order and reports whether the partition must
// stop. Messages left unfinished (the worker is stopping) are not marked
// done, so their offsets are not committed.
func (w *worker) process(ctx, dbCtx context.Context, batch []kafka.Message) (halt bool) {
	items := make([]*item, len(batch))
	for i, m := range batch {
		if err := w.tracker.fetched(m.Offset); err != nil {
			w.log.Error("offset bookkeeping broken", "error", err)
		}
		id, at, err := extract(w.c.cfg.Extract, &batch[i])
		items[i] = &item{msg: Message{Message: m, EventID: id, EventTime: at}, extractErr: err}
	}
	defer func() {
		last := batch[len(batch)-1]
		if last.HighWaterMark > 0 {
			next, _ := w.tracker.committable()
			w.c.emit(Event{Kind: EventLag, Topic: w.topic, Partition: w.partition, Offset: next, Lag: max(last.HighWaterMark-next, 0)})
		}
	}()
	if w.c.cfg.NaturallyIdempotent {
		if w.c.cfg.BatchHandler != nil && len(items) > 1 {
			switch w.processIdempotentBatch(ctx, dbCtx, items) {
			case resolved:
				return false
			case abandoned:
				return false
			}
			// A message of the batch failed: each is tried alone below.
		}
		for _, it := range items {
			switch w.processIdempotent(ctx, dbCtx, it) {
			case stopped:
				return true
			case abandoned:
				return false
			}
		}
		return false
	}

	results, ok := w.processInbox(ctx, dbCtx, items)
	if !ok {
		return false
	}
	// Every message whose effect committed is finished, also those after a
	// failure: the tracker still holds the commit back at the failure.
	for i, it := range items {
		if o := results[i].Outcome; o == inbox.Processed || o == inbox.Duplicate {
			w.finish(it, o)
		}
	}
	for i, it := range items {
		r := results[i]
		if r.Outcome == inbox.Processed || r.Outcome == inbox.Duplicate {
			continue
		}
		var res resolution
		if it.extractErr != nil {
			res = w.applyPolicy(ctx, dbCtx, it, ReasonNoEventID, it.extractErr)
		} else {
			res = w.retryInbox(ctx, dbCtx, it, r.Err)
		}
		switch res {
		case stopped:
			return true
		case abandoned:
			return false
		}
	}
	return false
}

// processInbox runs the messages with an id through inbox.ProcessBatch, in
// one transaction, retrying without limit while the batch as a whole cannot
// commit because the database failed. results[i] belongs to items[i]; items
// without id are Failed. ok is false when the worker is stopping and the
// batch did not commit.
//
// With StoreOffsets the partition's next offset is written in the batch's
// transaction, after the longest run of items from the start of the batch
// that this transaction finishes, as ProcessBatch decided them (one
// admission per message and attempt): the stored offset never passes a
// message that failed, was rejected or is still to be retried. Everything
// before the batch is finished: a worker resolves each batch before the next.
func (w *worker) processInbox(ctx, dbCtx context.Context, items []*item) (results []inbox.Result, ok bool) {
	results = make([]inbox.Result, len(items))
	var msgs []inbox.Message
	msgIndex := make([]int, len(items)) // items[i] is msgs[msgIndex[i]], or -1
	var idx []int
	for i, it := range items {
		msgIndex[i] = -1
		if it.extractErr != nil {
			results[i] = inbox.Result{Outcome: inbox.Failed, Err: it.extractErr}
			continue
		}
		it.attempts++
		msgIndex[i] = len(msgs)
		msgs = append(msgs, w.inboxMessage(it))
		idx = append(idx, i)
	}
	if len(msgs) == 0 {
		return results, true
	}
	var opts []inbox.BatchOption
	if w.c.cfg.MessageContext != nil {
		opts = append(opts, inbox.MessageContext(func(ctx context.Context, j int) context.Context {
			return w.messageContext(ctx, items[idx[j]])
		}))
	}
	written := int64(-1) // the highest stored offset this call wrote
	if w.c.cfg.StoreOffsets {
		opts = append(opts, inbox.BeforeCommit(func(ctx context.Context, tx *gorm.DB, outcomes []inbox.Outcome) error {
			next := int64(-1)
			for i, it := range items {
				j := msgIndex[i]
				if j < 0 || (outcomes[j] != inbox.Processed && outcomes[j] != inbox.Duplicate) {
					break
				}
				next = it.msg.Offset + 1
			}
			if next < 0 {
				return nil
			}
			if err := w.c.offsets.advance(ctx, tx, w.topic, w.partition, w.floor, next); err != nil {
				return err
			}
			written = max(written, next)
			return nil
		}))
	}
	for attempt := 1; ; attempt++ {
		var rs []inbox.Result
		var err error
		if w.c.cfg.BatchHandler != nil {
			rs, err = w.c.cfg.Inbox.ProcessBatchFunc(dbCtx, msgs, w.wrapBatch(items), opts...)
		} else {
			rs, err = w.c.cfg.Inbox.ProcessBatch(dbCtx, msgs, w.wrap(items), opts...)
		}
		if err == nil {
			// Every transaction of a call that succeeded committed, but for
			// one whose COMMIT a split refused after its write: then the
			// floor is too high, and the next write finds the position
			// "moved" and resumes from the database's: redeliveries only.
			w.floor = max(w.floor, written)
			processed := 0
			for j, i := range idx {
				results[i] = rs[j]
				if rs[j].Outcome == inbox.Processed {
					processed++
				}
			}
			if w.afterCommit(ctx, processed) {
				return results, false
			}
			return results, true
		}
		if dbCtx.Err() != nil || ctx.Err() != nil {
			return nil, false // stopping: the batch was rolled back and will be redelivered
		}
		if errors.Is(err, errPositionMoved) {
			w.lost = err // rolled back; run resumes from the database's position
			return nil, false
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, attempt)
		level := slog.LevelWarn
		if attempt >= 5 {
			level = slog.LevelError // still retried: the database, not the messages, is failing
		}
		w.log.Log(ctx, level, "the batch could not commit; retrying it", "messages", len(msgs), "attempt", attempt, "error", err, "retry_in", wait)
		w.c.emit(Event{Kind: EventRetry, Topic: w.topic, Partition: w.partition, Offset: -1, Attempt: attempt, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return nil, false
		}
	}
}

// wrap adapts the user's Handler to the inbox.
func (w *worker) wrap(items []*item) inbox.Handler {
	byOffset := make(map[int64]*item, len(items))
	for _, it := range items {
		byOffset[it.msg.Offset] = it
	}
	return func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		it, ok := byOffset[m.Offset]
		if !ok {
			return fmt.Errorf("consumer: inbox handed back unknown offset %d", m.Offset)
		}
		return w.callHandler(ctx, tx, it.msg)
	}
}

// retryInbox tries a failed message again, alone, until it commits, its
// attempts are used up (then the policy applies) or the worker stops.
// Invalid and expired messages go to the policy at once.
func (w *worker) retryInbox(ctx, dbCtx context.Context, it *item, err error) resolution {
	for {
		switch {
		case errors.Is(err, inbox.ErrExpired):
			return w.applyPolicy(ctx, dbCtx, it, ReasonExpired, err)
		case errors.Is(err, inbox.ErrInvalidMessage):
			return w.applyPolicy(ctx, dbCtx, it, ReasonInvalid, err)
		case w.infrastructure(err):
			// The database, not the message: retry without using up attempts.
			it.attempts = min(it.attempts, w.c.cfg.MaxAttempts-1)
		case it.attempts >= w.c.cfg.MaxAttempts:
			return w.applyPolicy(ctx, dbCtx, it, ReasonHandlerError, err)
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, it.attempts)
		w.log.Warn("message failed; retrying", "offset", it.msg.Offset, "event_id", it.msg.EventID,
			"attempt", it.attempts, "error", err, "retry_in", wait)
		w.c.emit(Event{Kind: EventRetry, Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset, Attempt: it.attempts, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
		rs, ok := w.processInbox(ctx, dbCtx, []*item{it})
		if !ok {
			return abandoned
		}
		if o := rs[0].Outcome; o == inbox.Processed || o == inbox.Duplicate {
			w.finish(it, o)
			return resolved
		}
		err = rs[0].Err
	}
}

// wrapBatch adapts the user's BatchHandler to the inbox.
func (w *worker) wrapBatch(items []*item) inbox.BatchHandler {
	byOffset := make(map[int64]*item, len(items))
	for _, it := range items {
		byOffset[it.msg.Offset] = it
	}
	return func(ctx context.Context, tx *gorm.DB, ms []inbox.Message) error {
		batch := make([]Message, len(ms))
		for i, m := range ms {
			it, ok := byOffset[m.Offset]
			if !ok {
				return fmt.Errorf("consumer: inbox handed back unknown offset %d", m.Offset)
			}
			batch[i] = it.msg
		}
		return w.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
			return w.c.cfg.BatchHandler(ctx, tx, batch)
		})
	}
}

// infrastructure reports whether err says the database failed rather than
// the message (inbox.IsDatabaseFailure: BEGIN, the claim or COMMIT failed,
// or a statement failed with an error the Store classifies as transient).
// Such errors never send a message to the failure policy and are retried
// without limit. Nothing a handler returns by itself is one: its own network
// errors, EOFs and deadlines count as attempts, marked with inbox.Retryable
// or not.
func (w *worker) infrastructure(err error) bool { return inbox.IsDatabaseFailure(err) }

// processIdempotent runs the handler for one message in its own
// transaction, without an inbox row, with the consumer's retries.
func (w *worker) processIdempotent(ctx, dbCtx context.Context, it *item) resolution {
	for {
		it.attempts++
		err := inbox.Transact(dbCtx, w.c.db(), w.c.classifier(), nil, func(tx *gorm.DB) error {
			if err := w.callAny(w.messageContext(dbCtx, it), tx, it.msg); err != nil {
				return err
			}
			if w.c.cfg.StoreOffsets {
				return w.c.offsets.advance(dbCtx, tx, w.topic, w.partition, w.floor, it.msg.Offset+1)
			}
			return nil
		})
		if errors.Is(err, errPositionMoved) {
			w.lost = err
			return abandoned
		}
		if err == nil {
			if w.c.cfg.StoreOffsets {
				w.floor = max(w.floor, it.msg.Offset+1)
			}
			if w.afterCommit(ctx, 1) {
				return abandoned
			}
			w.finish(it, inbox.Processed)
			return resolved
		}
		if ctx.Err() != nil {
			return abandoned
		}
		if w.infrastructure(err) {
			it.attempts = min(it.attempts, w.c.cfg.MaxAttempts-1)
		} else if it.attempts >= w.c.cfg.MaxAttempts {
			return w.applyPolicy(ctx, dbCtx, it, ReasonHandlerError, err)
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, it.attempts)
		w.log.Warn("message failed; retrying", "offset", it.msg.Offset, "attempt", it.attempts, "error", err, "retry_in", wait)
		w.c.emit(Event{Kind: EventRetry, Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset, Attempt: it.attempts, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
}

// processIdempotentBatch runs the BatchHandler for all items in one
// transaction without inbox rows, retrying it while the database fails.
// stopped means a message of the batch failed and nothing of it committed:
// the caller then runs the messages one by one, with their attempts.
func (w *worker) processIdempotentBatch(ctx, dbCtx context.Context, items []*item) resolution {
	batch := make([]Message, len(items))
	for i, it := range items {
		batch[i] = it.msg
	}
	next := items[len(items)-1].msg.Offset + 1
	for attempt := 1; ; attempt++ {
		err := inbox.Transact(dbCtx, w.c.db(), w.c.classifier(), nil, func(tx *gorm.DB) error {
			if err := w.withTimeout(w.messageContext(dbCtx, items[0]), tx, func(ctx context.Context, tx *gorm.DB) error {
				return w.c.cfg.BatchHandler(ctx, tx, batch)
			}); err != nil {
				return err
			}
			if w.c.cfg.StoreOffsets {
				return w.c.offsets.save(dbCtx, tx, w.topic, w.partition, next)
			}
			return nil
		})
		if err == nil {
			if w.afterCommit(ctx, len(items)) {
				return abandoned
			}
			for _, it := range items {
				w.finish(it, inbox.Processed)
			}
			return resolved
		}
		if ctx.Err() != nil {
			return abandoned
		}
		if !w.infrastructure(err) {
			w.log.Warn("a batch failed; trying its messages one by one", "messages", len(items), "error", err)
			return stopped
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, attempt)
		w.log.Warn("the batch could not commit; retrying it", "messages", len(items), "attempt", attempt, "error", err, "retry_in", wait)
		w.c.emit(Event{Kind: EventRetry, Topic: w.topic, Partition: w.partition, Offset: -1, Attempt: attempt, Err: err})
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
}

// messageContext is the context the processing of it runs under: ctx, or what
// Config.MessageContext made of it.
func (w *worker) messageContext(ctx context.Context, it *item) context.Context {
	mc := w.c.cfg.MessageContext
	if mc == nil {
		return ctx
	}
	if mctx := mc(ctx, &it.msg); mctx != nil {
		return mctx
	}
	return ctx
}

// callAny runs Handler, or BatchHandler with msg alone.
func (w *worker) callAny(ctx context.Context, tx *gorm.DB, msg Message) error {
	if w.c.cfg.Handler == nil {
		return w.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
			return w.c.cfg.BatchHandler(ctx, tx, []Message{msg})
		})
	}
	return w.callHandler(ctx, tx, msg)
}

// callHandler runs the user's handler, enforcing Config.HandlerTimeout. A
// panic is left to the inbox (or inbox.Transact), which recovers it as an
// *inbox.PanicError with its stack.
func (w *worker) callHandler(ctx context.Context, tx *gorm.DB, msg Message) error {
	return w.withTimeout(ctx, tx, func(ctx context.Context, tx *gorm.DB) error {
		return w.c.cfg.Handler(ctx, tx, msg)
	})
}

// withTimeout runs fn under Config.HandlerTimeout: its context and
// transaction handle carry the deadline, and an overrun is the handler's
// failure (ErrHandlerTimeout), whatever fn returned.
func (w *worker) withTimeout(ctx context.Context, tx *gorm.DB, fn func(ctx context.Context, tx *gorm.DB) error) (err error) {
	timeout := w.c.cfg.HandlerTimeout
	if timeout <= 0 {
		return fn(ctx, tx)
	}
	outer := ctx
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if errors.Is(hctx.Err(), context.DeadlineExceeded) && outer.Err() == nil {
			if err == nil {
				err = fmt.Errorf("%w: handler did not finish within %v", ErrHandlerTimeout, timeout)
			} else {
				err = fmt.Errorf("%w: handler did not finish within %v: %w", ErrHandlerTimeout, timeout, err)
			}
		}
	}()
	return fn(hctx, tx.WithContext(hctx))
}

// afterCommit runs the test seam after a database commit and reports
// whether it simulated a crash.
func (w *worker) afterCommit(ctx context.Context, processed int) bool {
	if w.c.cfg.afterDB == nil {
		return false
	}
	next, _ := w.tracker.committable()
	if errors.Is(w.c.cfg.afterDB(w.topic, w.partition, next, processed), errCrash) {
		w.c.crash()
		<-ctx.Done()
		return true
	}
	return false
}

// finish marks a message done.
func (w *worker) finish(it *item, o inbox.Outcome) {
	if err := w.tracker.markDone(it.msg.Offset); err != nil {
		w.log.Error("offset bookkeeping broken", "error", err)
	}
	kind := EventProcessed
	if o == inbox.Duplicate {
		kind = EventDuplicate
		w.log.Debug("duplicate skipped", "offset", it.msg.Offset, "event_id", it.msg.EventID)
	}
	w.c.emit(Event{Kind: kind, Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset})
	next, _ := w.tracker.committable()
	w.c.clearStopped(w.topic, w.partition, next)
}

// applyPolicy dead-letters the message or stops the partition at it.
func (w *worker) applyPolicy(ctx, dbCtx context.Context, it *item, reason string, cause error) resolution {
	if w.c.cfg.OnFailure == StopPartition {
		e := &PartitionStoppedError{Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset,
			EventID: it.msg.EventID, Reason: reason, Attempts: it.attempts, Err: cause}
		w.c.setStopped(e)
		w.log.Error("PARTITION STOPPED: a message cannot be processed; nothing at or after it is committed until it is fixed and the partition reassigned",
			append([]any{"offset", it.msg.Offset, "event_id", it.msg.EventID, "reason", reason, "attempts", it.attempts}, failureAttrs(cause)...)...)
		w.c.emit(Event{Kind: EventPartitionStopped, Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset, Err: e})
		return stopped
	}
	dl := deadLetter(w.c.cfg.DeadLetterTopic, &it.msg, reason, it.attempts, cause, w.c.cfg.GroupID, w.c.cfg.Consumer, time.Now())
	unknownTopic := 0 // publish attempts in a row that found the topic unknown
	for attempt := 1; ; attempt++ {
		err := w.c.dlq.WriteMessages(ctx, dl)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return abandoned
		}
		permanent, unknown, perr := kafkaerr.Classify(err)
		if unknown {
			unknownTopic++
			permanent = unknownTopic >= deadLetterUnknownTopicAttempts
		} else {
			unknownTopic = 0
		}
		if permanent {
			return w.deadLetterRefused(it, reason, cause, attempt, perr)
		}
		wait := backoff.Wait(w.c.cfg.MinBackoff, w.c.cfg.MaxBackoff, attempt)
		level := slog.LevelWarn
		if attempt >= 5 {
			level = slog.LevelError // still retried: the producer, not the message, is failing
		}
		w.log.Log(ctx, level, "publishing a dead letter failed; retrying", "offset", it.msg.Offset, "attempt", attempt, "error", err, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return abandoned
		}
	}
	w.log.Error("message dead-lettered", append([]any{"offset", it.msg.Offset, "event_id", it.msg.EventID,
		"reason", reason, "attempts", it.attempts, "dead_letter_topic", w.c.cfg.DeadLetterTopic}, failureAttrs(cause)...)...)
	if err := w.tracker.markDone(it.msg.Offset); err != nil {
		w.log.Error("offset bookkeeping broken", "error", err)
	}
	w.c.emit(Event{Kind: EventDeadLettered, Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset, Err: cause})
	if w.c.cfg.StoreOffsets {
		// The database's position is where the next start resumes, even
		// behind the group's: a stored offset left before the dead letter
		// would dead-letter the message again. Retried while the database
		// fails, like every database failure; if the worker stops first,
		// the message is dead-lettered again by the next owner (dead
		// letters are at least once).
		next, _ := w.tracker.committable()
		if !w.storeNext(ctx, dbCtx, w.floor, next) {
			return abandoned
		}
	}
	return resolved
}

// inboxMessage is the inbox's view of an item.
func (w *worker) inboxMessage(it *item) inbox.Message {
	return inbox.Message{
		Consumer:  w.c.cfg.Consumer,
		ID:        it.msg.EventID,
		Time:      it.msg.EventTime,
		Topic:     w.topic,
		Partition: int32(w.partition),
		Offset:    it.msg.Offset,
	}
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
	err := w.gen.CommitOffsets(map[string]map[int]int64{w.topic: {w.partition: next}})
	w.commitMu.Unlock()
	if err != nil {
		w.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds (the inbox absorbs them)",
			"next_offset", next, "error", err)
		return
	}
	w.lastCommitted, w.lastCommitAt = next, time.Now()
	w.c.emit(Event{Kind: EventCommitted, Topic: w.topic, Partition: w.partition, Offset: next})
}
