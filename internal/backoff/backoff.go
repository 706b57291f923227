// Package backoff is the one retry wait of the project: the inbox's
// retries, the consumer's partition retries and dead-letter publishing, and
// the outbox relay all wait through it.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Wait returns the jittered exponential wait before retry number attempt
// (1 for the first retry): the ceiling doubles from minD per attempt up to
// maxD, and the wait is drawn from [minD/2, minD/2+ceiling). The jitter is
// wide on purpose: the concurrent losers of one race (a unique-key wait, a
// deadlock, a broker leader change) must not retry in step. Non-positive
// bounds give no wait.
func Wait(minD, maxD time.Duration, attempt int) time.Duration {
	if maxD <= 0 {
		return 0
	}
	minD = max(minD, 0)
	d := minD << min(max(attempt-1, 0), 20)
	if d > maxD || d <= 0 {
		d = maxD
	}
	return minD/2 + rand.N(d)
}

// Sleep waits d, or until ctx is done, whose error it then returns.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
