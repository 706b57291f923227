// Package testhooks lets the project's own tests, which live in the dev
// module (they need a database driver and an in-process broker), reach into
// package consumer without any exported API: a test puts Knobs into the
// context it passes to consumer.Consumer.Run. Nothing outside this
// repository can import it, and a context without Knobs changes nothing.
package testhooks

import (
	"context"
	"errors"
	"time"
)

// Knobs change how one Run behaves, for a test.
type Knobs struct {
	// AfterDB, if set, runs after each database commit of a partition,
	// before its Kafka offset commit; returning ErrCrash simulates a crash
	// at that point. processed is how many messages of that commit were
	// applied (not duplicates).
	AfterDB func(topic string, partition int, next int64, processed int) error
	// LogCheckInterval, if positive, is how often an idle partition checks
	// the log end.
	LogCheckInterval time.Duration
	// PosCheckInterval, if positive, is how often an idle partition checks
	// its stored position.
	PosCheckInterval time.Duration
}

// ErrCrash is what an AfterDB hook returns to simulate a crash: Run leaves
// the group without committing and returns it.
var ErrCrash = errors.New("consumer: simulated crash")

type key struct{}

// With returns ctx carrying k.
func With(ctx context.Context, k *Knobs) context.Context { return context.WithValue(ctx, key{}, k) }

// From returns the Knobs ctx carries: the zero Knobs if none.
func From(ctx context.Context) Knobs {
	if k, _ := ctx.Value(key{}).(*Knobs); k != nil {
		return *k
	}
	return Knobs{}
}
