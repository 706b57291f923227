package outbox

import (
	"context"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// wakers are the relays of one Outbox that run in this process: an
// enqueue's commit wakes them.
type wakers struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func (w *wakers) add(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs == nil {
		w.subs = map[chan struct{}]struct{}{}
	}
	w.subs[ch] = struct{}{}
}

func (w *wakers) remove(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs, ch)
}

// wake signals every relay without waiting: a relay that has a signal
// pending already will look anyway.
func (w *wakers) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wakeAfter wakes the relays of this process once tx commits, when its
// transaction tells its commit (an inbox handler's, a consumer's), and
// else at once: a relay woken before the commit finds nothing and polls
// again soon after (RelayConfig.MinPollInterval, doubling), and the
// safety poll catches a commit that comes later still.
func (w *wakers) wakeAfter(tx *gorm.DB) {
	w.mu.Lock()
	none := len(w.subs) == 0
	w.mu.Unlock()
	if none {
		return
	}
	if !txn.AfterCommit(tx, w.wake) {
		w.wake()
	}
}

// listen keeps a listening connection of the store open while ctx lasts,
// signalling wake on every notification, and reports on up whether it is
// listening. A lost connection is logged and opened again after a backoff;
// meanwhile the relay polls. After every (re)connection the relay is woken
// once, for the commits it may have missed.
func (r *Relay) listen(ctx context.Context, n storage.Notifier, wake chan<- struct{}, up func(bool)) {
	failures := 0
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		l, err := n.Listen(ctx, r.o.db.WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			// A database that is down fails the relay's cycles too, logged
			// there; a connection that cannot listen at all (another
			// driver) is said once in a while, not on every try.
			pause := backoff.Wait(r.o.cfg.MinBackoff, max(r.o.cfg.MaxBackoff, listenRetryMax), failures)
			if failures%10 == 1 {
				r.log.Warn("relay cannot open its listening connection; it polls until it can", "error", err, "attempts", failures,
					"retry_in", pause, "min_poll", r.cfg.MinPollInterval, "safety_poll", r.cfg.PollInterval)
			}
			if backoff.Sleep(ctx, pause) != nil {
				return
			}
			continue
		}
		if failures > 0 {
			r.log.Info("relay listens for commits again")
		}
		since := time.Now()
		up(true)
		signal()
		for {
			if err = l.Wait(ctx); err != nil {
				break
			}
			signal()
		}
		up(false)
		_ = l.Close()
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("relay lost its listening connection; it polls until it listens again", "error", err,
			"min_poll", r.cfg.MinPollInterval, "safety_poll", r.cfg.PollInterval)
		signal()
		if time.Since(since) > time.Minute {
			failures = 0
		}
		failures++
		if backoff.Sleep(ctx, backoff.Wait(r.o.cfg.MinBackoff, r.o.cfg.MaxBackoff, failures)) != nil {
			return
		}
	}
}

// listenRetryMax bounds the pause between two attempts to open a listening
// connection.
const listenRetryMax = 30 * time.Second

// pause waits for d, a wake-up or ctx's end, whichever comes first, and
// reports whether a wake-up ended it. While listening says the relay
// listens for the database's notifications, the in-process signal is
// passed over: the notification of the same commit follows.
func pause(ctx context.Context, d time.Duration, notified, local <-chan struct{}, listening func() bool) (woken bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
			return false, nil
		case <-notified:
			return true, nil
		case <-local:
			if !listening() {
				return true, nil
			}
		}
	}
}
