//go:build cgo

package outbox_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/outbox"
)

// timedPublisher takes took per call and notes when each call began.
type timedPublisher struct {
	took time.Duration

	mu         sync.Mutex
	starts     []time.Time
	publishedN int
}

func (p *timedPublisher) Publish(ctx context.Context, msgs []kafka.Message) error {
	start := time.Now()
	time.Sleep(p.took)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts = append(p.starts, start)
	p.publishedN += len(msgs)
	return ctx.Err()
}

func (p *timedPublisher) published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.publishedN
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// Under a steady stream of commits, each of which wakes the relay, its
// cycles start at least MinPollInterval (5 ms by default) apart, so that
// each takes several commits; but the interval counts from the start of
// the cycle that published: after a cycle that took longer (a slow
// broker), the next one starts at once, not 5 ms after it ended.
func TestRelayCyclesUnderAStreamOfCommits(t *testing.T) {
	db, store := sequenceDB(t)
	// One connection: the enqueuers and the relay's claims queue in the
	// pool in turn, not in SQLite's busy handler, whose sleeps grow.
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.SetMaxOpenConns(1)
	}
	ob := newOutbox(t, db, store, outbox.Config{})
	var cycles hooks.Hook // the next relay's, if not nil
	stream := func(t *testing.T, pub *timedPublisher, n int, every time.Duration) {
		t.Helper()
		cfg := outbox.RelayConfig{ID: "stream-" + t.Name(), PollInterval: 10 * time.Second}
		if cycles != nil {
			cfg.Hooks = []hooks.Hook{cycles}
		}
		relay, err := ob.NewRelay(pub, cfg)
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, relay)
		time.Sleep(50 * time.Millisecond) // the first cycle, on what the table holds
		before := pub.published()
		next := time.Now()
		for i := range n {
			time.Sleep(time.Until(next))
			next = next.Add(every)
			if err := enqueue(t.Context(), db, ob, outbox.Message{Topic: "t", Key: []byte("k" + strconv.Itoa(i%7)), Value: []byte(t.Name() + strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for pub.published() < before+n {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d published after 30s", pub.published()-before, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	t.Run("fast broker", func(t *testing.T) {
		pub := &timedPublisher{}
		const n = 300
		stream(t, pub, n, time.Millisecond)
		var apart []time.Duration
		for i := 1; i < len(pub.starts); i++ {
			apart = append(apart, pub.starts[i].Sub(pub.starts[i-1]))
		}
		if len(apart) < 5 {
			t.Fatalf("%d publishes for %d messages", len(pub.starts), n)
		}
		// The claim before each publish varies: the median, not each
		// interval, shows the cycles' spacing.
		if m := median(apart); m < 4*time.Millisecond {
			t.Errorf("publishes start a median %v apart under commits 1 ms apart, want about 5 ms or more", m)
		}
		if per := float64(n) / float64(len(pub.starts)); per < 2 {
			t.Errorf("%.1f messages per publish, want several", per)
		}
	})

	t.Run("slow broker", func(t *testing.T) {
		pub := &timedPublisher{took: 15 * time.Millisecond}
		var mu sync.Mutex
		var starts, ends []time.Time
		cycles = hooks.EventFunc(func(e hooks.Event) {
			if e.Kind == hooks.RelayCycle && e.Relay.Published > 0 {
				end := time.Now()
				mu.Lock()
				starts, ends = append(starts, end.Add(-e.Duration)), append(ends, end)
				mu.Unlock()
			}
		})
		defer func() { cycles = nil }()
		stream(t, pub, 100, 2*time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		var idle []time.Duration
		for i := 1; i < len(starts); i++ {
			idle = append(idle, starts[i].Sub(ends[i-1]))
		}
		if len(idle) < 5 {
			t.Fatalf("%d cycles published", len(starts))
		}
		// A cycle of over 15 ms is followed at once (commits came
		// meanwhile): no 5 ms gap after it.
		if m := median(idle); m >= 2500*time.Microsecond {
			t.Errorf("a cycle starts a median %v after the last one ended (%v), want at once", m, idle)
		}
	})
}
