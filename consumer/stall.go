package consumer

// A database that does not answer: the bound of the consumer's own steps
// (Config.Timeouts.Database), the ping that tells a handler timed out on such
// a database from one that timed out on its own (Config.Timeouts.Handler),
// and the watchdog that makes a member whose partitions make no progress
// leave the group (Config.Timeouts.ProcessingStall).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
)

// bound is Config.Timeouts.Database as the bound of a step: 0 for none.
func (c *Consumer) bound() time.Duration { return max(c.cfg.Timeouts.Database, 0) }

// maxPingTimeout bounds a ping of the database (see Consumer.ping).
const maxPingTimeout = 5 * time.Second

// ping asks the database for an answer on a connection of the pool other
// than any a transaction holds, within maxPingTimeout (or Timeouts.Database,
// if shorter). It returns nil if the database answered, and also if the
// consumer's DB gives no *sql.DB to ping: then nothing can be told.
func (c *Consumer) ping(ctx context.Context) error {
	sqlDB, err := c.db().DB()
	if err != nil || sqlDB == nil {
		return nil
	}
	timeout := maxPingTimeout
	if b := c.bound(); b > 0 {
		timeout = min(timeout, b)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := sqlDB.PingContext(pctx); err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			return &txn.TimeoutError{Step: "a ping", Bound: timeout, Err: err}
		}
		return err
	}
	return nil
}

// handlerTimedOutOnDatabase is the error of a handler call whose deadline
// passed (handlerErr, wrapping ErrHandlerTimeout), told apart: a database
// failure if a statement the handler sent through tx was cut short by the
// deadline (or refused after it) and the database does not answer a ping
// either; else nil, and the timeout is the message's.
//
// Why no handler can pass its own failure off as the database's this way:
// the ping runs on another connection, under the consumer's context, not
// the handler's; it carries no SQL of the handler's and takes no lock, so
// neither a slow query, a lock wait nor a payload delays its answer. It
// fails only when the server, or the way to it, does not answer, or when
// the pool has no connection to give within the timeout; in either state
// no transaction of the consumer can begin, so the message is not what
// fails.
func (b *batchRunner) handlerTimedOutOnDatabase(ctx context.Context, tx *gorm.DB, handlerErr error) error {
	if !txn.StatementsOf(tx).EndedByContext() {
		return nil
	}
	perr := b.host.ping(ctx)
	if perr == nil || ctx.Err() != nil {
		return nil
	}
	b.log.Warn("the handler timed out on a database that does not answer a ping either; retrying as a database failure, without counting an attempt",
		"error", handlerErr, "ping_error", perr)
	return &txn.Failure{Op: "handler timeout, ping", Err: perr, HandlerErr: handlerErr}
}

// addWorker registers a worker about to start, as its partition's holder,
// and returns the partition's previous holder if that one has not
// returned yet.
func (c *Consumer) addWorker(w *worker) (prev *worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.workers[w] = struct{}{}
	tp := topicPartition{w.topic, w.partition}
	prev = c.holders[tp]
	c.holders[tp] = w
	return prev
}

// removeWorker unregisters a worker that returned.
func (c *Consumer) removeWorker(w *worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.workers, w)
	tp := topicPartition{w.topic, w.partition}
	if c.holders[tp] == w {
		delete(c.holders, tp)
	}
	close(w.done)
}

// stalled returns the worker that has waited longest for the database,
// if that is longer than limit.
func (c *Consumer) stalled(limit time.Duration) (*worker, time.Duration) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var worst *worker
	var longest time.Duration
	for w := range c.workers {
		if d := w.stalledFor(now); d > longest {
			worst, longest = w, d
		}
	}
	if longest <= limit {
		return nil, 0
	}
	return worst, longest
}

// errStalled ends a membership of the group (see Consumer.watch).
var errStalled = errors.New("consumer: a partition made no progress for longer than Timeouts.ProcessingStall")

// watch ends member, with errStalled, once a worker has waited for the
// database longer than Config.Timeouts.ProcessingStall; Run then leaves the
// group. It returns when member ends.
func (c *Consumer) watch(member context.Context, leave context.CancelCauseFunc) {
	limit := c.cfg.Timeouts.ProcessingStall
	t := time.NewTicker(min(time.Second, max(limit/8, 10*time.Millisecond)))
	defer t.Stop()
	for {
		select {
		case <-member.Done():
			return
		case <-t.C:
		}
		w, d := c.stalled(limit)
		if w == nil {
			continue
		}
		w.log.Error("PARTITION STALLED: the database has not answered this partition's work (or a handler ran) for longer than Timeouts.ProcessingStall; leaving the group so that the other members take over this member's partitions, and rejoining once the database answers a ping",
			"stalled_for", d.Round(time.Millisecond), "max_processing_stall", limit)
		leave(fmt.Errorf("%w: %s/%d waited %v", errStalled, w.topic, w.partition, d.Round(time.Millisecond)))
		return
	}
}

// awaitDatabase waits, out of the group, until the database answers a
// ping; false if ctx ended first.
func (c *Consumer) awaitDatabase(ctx context.Context) bool {
	for attempt := 1; ; attempt++ {
		err := c.ping(ctx)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			c.log.Info("the database answers again; rejoining the group")
			return true
		}
		wait := backoff.Wait(c.cfg.Failure.MinBackoff, c.cfg.Failure.MaxBackoff, attempt)
		c.log.Warn("out of the group: the database does not answer; rejoining once it does", "error", err, "attempt", attempt, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return false
		}
	}
}
