package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

type tally struct {
	mu         sync.Mutex
	processed  int
	duplicates int
	errs       []error
}

func (t *tally) add(out inbox.Outcome, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.errs = append(t.errs, err)
	case out == inbox.Processed:
		t.processed++
	case out == inbox.Duplicate:
		t.duplicates++
	default:
		t.errs = append(t.errs, fmt.Errorf("outcome %v without an error", out))
	}
}

var concurrencyChecks = []Check{
	{Area: "concurrency", Name: "concurrent-deliveries-of-one-id",
		Doc: "16 concurrent deliveries of one id: exactly one effect, every other delivery Duplicate",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("race-1")
			var t tally
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range env.H.Concurrency {
				wg.Go(func() {
					<-start
					t.add(ib.Process(ctx, msg, env.Apply))
				})
			}
			close(start)
			wg.Wait()
			if len(t.errs) > 0 || t.processed != 1 || t.duplicates != env.H.Concurrency-1 {
				return fmt.Errorf("%d concurrent deliveries: %d processed, %d duplicates, errors %v; want 1 processed, %d duplicates, no error",
					env.H.Concurrency, t.processed, t.duplicates, errors.Join(t.errs...), env.H.Concurrency-1)
			}
			return env.expectEffects(ctx, msg, 1)
		}},
	{Area: "concurrency", Name: "concurrent-deliveries-first-rolls-back",
		Doc: "the first of 16 concurrent deliveries holds the row and then rolls back: exactly one of the others applies the effect",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("race-rollback-1")
			claimed := make(chan struct{})
			var firstErr error
			var firstOut inbox.Outcome
			var firstDone sync.WaitGroup
			firstFinished := make(chan struct{})
			// Also on an early return: the first delivery must have ended
			// (and rolled back) before the harness drops its table.
			defer firstDone.Wait()
			firstDone.Go(func() {
				defer close(firstFinished)
				firstOut, firstErr = ib.Process(ctx, msg, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
					if err := env.Apply(ctx, tx, m); err != nil {
						return err
					}
					close(claimed)
					// Hold the row while the others pile up behind it.
					time.Sleep(300 * time.Millisecond)
					return errHandler
				})
			})
			select {
			case <-claimed:
			case <-firstFinished:
				return fmt.Errorf("the first delivery of a new id ended without running its handler: outcome %v, error %v", firstOut, firstErr)
			case <-ctx.Done():
				return ctx.Err()
			}
			var t tally
			var wg sync.WaitGroup
			for range env.H.Concurrency - 1 {
				wg.Go(func() { t.add(ib.Process(ctx, msg, env.Apply)) })
			}
			firstDone.Wait()
			wg.Wait()
			if !errors.Is(firstErr, errHandler) {
				return fmt.Errorf("the rolled-back delivery returned %v, want the handler's error", firstErr)
			}
			if len(t.errs) > 0 || t.processed != 1 || t.duplicates != env.H.Concurrency-2 {
				return fmt.Errorf("after the first rolled back, %d deliveries: %d processed, %d duplicates, errors %v; want 1 processed, %d duplicates",
					env.H.Concurrency-1, t.processed, t.duplicates, errors.Join(t.errs...), env.H.Concurrency-2)
			}
			return env.expectEffects(ctx, msg, 1)
		}},
	{Area: "concurrency", Name: "concurrent-distinct-and-repeated-ids",
		Doc: "16 workers deliver overlapping sets of ids at once: every id applied exactly once",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			const ids = 40
			var t tally
			var wg sync.WaitGroup
			for w := range env.H.Concurrency {
				wg.Go(func() {
					// Each worker walks the ids from its own starting point.
					for i := range ids {
						t.add(ib.Process(ctx, env.Msg(fmt.Sprintf("mix-%d", (i+w*7)%ids)), env.Apply))
					}
				})
			}
			wg.Wait()
			if len(t.errs) > 0 || t.processed != ids || t.duplicates != ids*(env.H.Concurrency-1) {
				return fmt.Errorf("%d processed, %d duplicates, errors %v; want %d processed, %d duplicates",
					t.processed, t.duplicates, errors.Join(t.errs...), ids, ids*(env.H.Concurrency-1))
			}
			for i := range ids {
				if err := env.expectEffects(ctx, env.Msg(fmt.Sprintf("mix-%d", i)), 1); err != nil {
					return err
				}
			}
			return nil
		}},
}
