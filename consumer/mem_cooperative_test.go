package consumer

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/transport/memtransport"
)

// partitionEvents returns the events of kind k of partition p.
func (e *memEnv) partitionEvents(k hooks.Kind, p int) []hooks.Event {
	return slices.DeleteFunc(e.eventsOf(k), func(ev hooks.Event) bool { return ev.Partition != p })
}

// Cooperative rebalancing: a partition the member keeps goes on in the
// worker that started it, its batch in flight finishing undisturbed (no
// Revoked or Assigned event, its handler's context not ended, its stored
// offset still written under the generation that started it); a partition
// that moves is drained, its worker committing what it finished before the
// revocation is acknowledged; when it comes back it starts at that commit.
// Nothing is processed twice or lost.
func TestMemCooperativeRebalance(t *testing.T) {
	for _, stored := range []bool{false, true} {
		t.Run(map[bool]string{false: "group offsets", true: "stored offsets"}[stored], func(t *testing.T) {
			e := newMemEnv(t, 2)
			e.mode = memtransport.Cooperative
			inFlight, release := make(chan struct{}), make(chan struct{})
			var interrupted atomic.Bool
			cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error {
				if string(m.Value) == "slow" {
					close(inFlight)
					select {
					case <-release:
					case <-ctx.Done():
					}
					interrupted.Store(ctx.Err() != nil)
				}
				return apply(tx, m)
			})
			cfg.Offsets.Store = stored
			// Offsets are committed only when a partition is let go: the
			// revocation's commit is the worker's last.
			cfg.Kafka.CommitInterval = time.Hour
			has := func(v string) func() bool { return func() bool { return slices.Contains(e.effects(), v) } }
			e.produce(1, event("b", "2"), event("c", "3"))
			r := e.start(cfg)
			e.eventually("partition 1's messages", has("3"))
			first := e.generation()
			if got := e.committed(1); got != 0 {
				t.Fatalf("partition 1 committed to %d before its revocation, want its start only", got)
			}
			e.produce(0, event("a", "slow"))
			<-inFlight

			// Partition 1 moves to another member while partition 0's
			// message is in flight. (One message at a time: SQLite has one
			// writer.)
			e.rebalance(map[string][]int{"orders": {0}})
			e.eventually("the revocation of partition 1", func() bool { return len(e.spy.revoked()) == 1 })
			e.eventually("the next generation", func() bool { return e.generation() == first+1 })
			if rv := e.spy.revoked()[0]; rv.partition != 1 || rv.committed != 2 {
				t.Errorf("revocation %+v, want partition 1 committed to 2 when it was acknowledged", rv)
			}
			if has("slow")() {
				t.Error("partition 0's message finished before it was released")
			}
			close(release)
			e.eventually("partition 0's message in flight", has("slow"))
			if interrupted.Load() {
				t.Error("the kept partition's handler saw its context end")
			}

			// Partition 1, owned elsewhere now, is not consumed here;
			// partition 0 goes on.
			e.produce(0, event("e", "5"))
			e.produce(1, event("f", "6"))
			e.eventually("partition 0's next message", has("5"))
			time.Sleep(50 * time.Millisecond)
			if has("6")() {
				t.Error("partition 1 consumed while another member's")
			}

			// Partition 1 comes back, at its committed offset.
			e.rebalance(nil)
			e.eventually("partition 1's message", has("6"))
			r.close(t)
			if p0, p1 := e.committed(0), e.committed(1); p0 != 2 || p1 != 3 {
				t.Errorf("committed %d and %d, want 2 and 3", p0, p1)
			}
			if got := e.effects(); len(got) != 5 {
				t.Errorf("effects %q, want each of the 5 events once", got)
			}
			if n := e.count(hooks.Duplicate) + e.count(hooks.Retry); n != 0 {
				t.Errorf("%d duplicate or retry events: a message was delivered again", n)
			}
			// Run's end revoked each partition once more.
			if a, rv := len(e.partitionEvents(hooks.Assigned, 0)), len(e.partitionEvents(hooks.Revoked, 0)); a != 1 || rv != 1 {
				t.Errorf("partition 0, kept: %d assigned and %d revoked events, want 1 and 1 (Run's end)", a, rv)
			}
			if a, rv := len(e.partitionEvents(hooks.Assigned, 1)), len(e.partitionEvents(hooks.Revoked, 1)); a != 2 || rv != 2 {
				t.Errorf("partition 1, moved and back: %d assigned and %d revoked events, want 2 and 2", a, rv)
			}
			for _, c := range e.spy.commitLog() {
				if c.partition == 0 && c.gen != first {
					t.Errorf("partition 0 committed through generation %d, not %d that started its worker", c.gen, first)
				}
			}
			if stored {
				if row := e.stored(0); row.Next != 2 || row.Generation != first {
					t.Errorf("partition 0's stored row %+v, want next 2 of generation %d", row, first)
				}
				if row := e.stored(1); row.Next != 3 || row.Generation != first+2 {
					t.Errorf("partition 1's stored row %+v, want next 3 of generation %d that gave it back", row, first+2)
				}
			}
			if n := e.spy.openReaders(); n != 0 {
				t.Errorf("%d readers still open", n)
			}
		})
	}
}

// A worker that finds its partition taken over (a newer generation's
// stored offset, and the coordinator refusing this member's commit)
// returns on its own: the member rejoins, the partition is started again
// in a new worker, and the other partition's worker goes on.
func TestMemCooperativeTakenOverRejoins(t *testing.T) {
	e := newMemEnv(t, 2)
	e.mode = memtransport.Cooperative
	e.produce(0, event("a", "1"))
	e.produce(1, event("b", "2"))
	cfg := e.config(applyAll)
	cfg.Offsets.Store = true
	r := e.start(cfg)
	e.committedTo(0, 1)
	e.committedTo(1, 1)
	r.close(t)

	e.setStored(0, 1, 99)
	refused := false
	e.spy.set(func(s *spy) {
		s.commitErr = func(partition int, next int64) error {
			if partition == 0 && !refused {
				refused = true
				return errSpyFenced
			}
			return nil
		}
	})
	before := len(e.partitionEvents(hooks.Assigned, 0))
	r = e.start(cfg)
	defer r.close(t)
	e.eventually("the zombie's stop", func() bool { return strings.Contains(e.logs.String(), "partition taken over by a newer generation") })
	// The zombie stopped before it took the partition (no Assigned event).
	e.eventually("partition 0 started again", func() bool { return len(e.partitionEvents(hooks.Assigned, 0)) == before+1 })
	e.produce(0, event("c", "3"))
	e.produce(1, event("d", "4"))
	e.committedTo(0, 2)
	e.committedTo(1, 2)
	if n := len(e.partitionEvents(hooks.Revoked, 1)); n != 1 {
		t.Errorf("partition 1: %d revoked events, want only the first run's", n)
	}
	if n := len(e.partitionEvents(hooks.Assigned, 1)); n != 2 {
		t.Errorf("partition 1: %d assigned events, want one per run", n)
	}
	if got := e.effects(); len(got) != 4 {
		t.Errorf("effects %q, want 4", got)
	}
}

// A client that starts a partition again while its worker still runs
// (against the transport contract) does not get it processed by two
// workers at once: the new worker waits for the old one to return.
func TestMemPartitionStartedTwiceWaits(t *testing.T) {
	e := newMemEnv(t, 1)
	e.mode = memtransport.Cooperative
	e.spy.set(func(s *spy) { s.relist = true })
	e.produce(0, event("a", "1"))
	r := e.start(e.config(applyAll))
	e.committedTo(0, 1)
	first := e.generation()
	e.rebalance(nil)
	e.eventually("the next generation", func() bool { return e.generation() == first+1 })
	e.eventually("the warning", func() bool { return strings.Contains(e.logs.String(), "previous worker still runs") })
	e.produce(0, event("b", "2"), event("c", "3"))
	e.committedTo(0, 3)
	time.Sleep(50 * time.Millisecond)
	if n := e.count(hooks.Assigned); n != 1 {
		t.Errorf("%d assigned events, want 1: the partition ran in two workers", n)
	}
	for _, c := range e.spy.commitLog() {
		if c.gen != first {
			t.Errorf("a commit through generation %d, whose worker should be waiting", c.gen)
		}
	}
	r.close(t)
	if got := e.effects(); len(got) != 3 || e.count(hooks.Duplicate) != 0 {
		t.Errorf("effects %q with %d duplicates, want 3 and none", got, e.count(hooks.Duplicate))
	}
	if n := e.count(hooks.Assigned); n != 1 {
		t.Errorf("%d assigned events after Run, want 1", n)
	}
}
