package consumer

// What the pieces of a partition's worker (the positioner, the batch runner
// and the committer) share, and what they ask of the Consumer that runs
// them.

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/transport"
)

// host is what a worker's pieces ask of the Consumer that runs them: the
// services every partition shares. *Consumer implements it.
type host interface {
	// emit reports e to the hooks.
	emit(e hooks.Event)
	// setStopped and clearStopped keep the registry of stopped partitions
	// (Consumer.Stopped).
	setStopped(e *PartitionStoppedError)
	clearStopped(topic string, partition int, next int64)
	// missingTables are the log attributes naming the tables err says are
	// missing, if any.
	missingTables(ctx context.Context, err error) []any
	// logOffsets is the partition's log start and end.
	logOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error)
	// ping asks the database for an answer (see Consumer.ping).
	ping(ctx context.Context) error
	// crash simulates a process death (tests only).
	crash()
	// firstNoteOf reports whether src is noted for the first time.
	firstNoteOf(src string) bool
}

// part is what the pieces of one partition's worker share: the partition,
// the generation that started the worker, its logger, the database with
// the bound of the consumer's own steps, the retry backoff, and the stall
// clock. Its settings are copied from the Config when the worker is made
// (newWorker).
type part struct {
	topic     string
	partition int
	gen       transport.Generation // the generation that started the worker
	log       *slog.Logger
	host      host

	db         *gorm.DB // the Consumer's, quiet (see txn.Quiet)
	classifier txn.ErrorClassifier
	bound      time.Duration // Config.Timeouts.Database as the bound of a step: 0 for none
	minBackoff time.Duration
	maxBackoff time.Duration

	// waitingSince (UnixNano; 0: not waiting) is when the worker began
	// waiting for the database to answer its work: the watchdog's view of
	// it (see Consumer.watch).
	waitingSince atomic.Int64
}

// genID is the group generation that started this worker, which it writes
// into the stored offset's row (see offsetTable.Advance).
func (p *part) genID() int32 { return p.gen.ID() }

// retryWait is the backoff before the next of attempt tries.
func (p *part) retryWait(attempt int) time.Duration {
	return backoff.Wait(p.minBackoff, p.maxBackoff, attempt)
}

// beginDB starts the worker's stall clock, unless it runs already: the
// worker now waits for the database to answer its work.
func (p *part) beginDB() {
	p.waitingSince.CompareAndSwap(0, time.Now().UnixNano())
}

// endDB stops the stall clock: the database answered (a commit, or a
// failure of a message's own), or the worker stopped waiting.
func (p *part) endDB() { p.waitingSince.Store(0) }

// stalledFor is how long the worker has been waiting for the database, or 0.
func (p *part) stalledFor(now time.Time) time.Duration {
	since := p.waitingSince.Load()
	if since == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, since))
}

// emit reports e, an event of this partition, to the hooks.
func (p *part) emit(e hooks.Event) {
	e.Topic, e.Partition = p.topic, p.partition
	p.host.emit(e)
}

// stopPartition records e as the partition's stop, logs msg at Error with
// attrs (slog key-value pairs) and reports EventPartitionStopped. The caller
// then holds the partition: nothing at or after e.Offset may be committed or
// stored until the stop clears (see Consumer.clearStopped).
func (p *part) stopPartition(e *PartitionStoppedError, msg string, attrs ...any) {
	p.host.setStopped(e)
	attrs = append(attrs, "offset", e.Offset, "reason", e.Reason, "error", e.Err)
	p.log.Error(msg, attrs...)
	p.emit(hooks.Event{Kind: hooks.PartitionStopped, Offset: e.Offset, Err: e})
}
