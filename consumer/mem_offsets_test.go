package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/storage"
)

func applyAll(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) }

func (e *memEnv) stored(p int) storage.OffsetRow {
	e.t.Helper()
	rows, err := e.store.Offsets(context.Background(), e.db, DefaultOffsetsTable, "inventory", "orders", int32(p))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(rows) == 0 {
		return storage.OffsetRow{Next: -1}
	}
	return rows[0]
}

func (e *memEnv) setStored(p int, next int64, gen int32) {
	e.t.Helper()
	if err := e.db.Exec(`UPDATE `+DefaultOffsetsTable+` SET next_offset = ?, generation = ? WHERE topic = ? AND partition = ?`,
		next, gen, "orders", p).Error; err != nil {
		e.t.Fatal(err)
	}
}

// With Offsets.Store the position is stored with the effects, the group's
// offset follows it, and on assignment the stored offset wins over the
// group's, ahead or behind.
func TestMemStoreOffsets(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("c", "3"))
	cfg := e.config(applyAll)
	cfg.Offsets.Store = true
	r := e.start(cfg)
	e.committedTo(0, 3)
	if row := e.stored(0); row.Next != 3 || row.Generation != e.generation() || row.Last == 0 {
		t.Errorf("stored %+v, want next 3 of generation %d with the fingerprint of offset 2", row, e.generation())
	}
	r.close(t)

	// The group's offset was reset behind: the stored offset wins, nothing
	// is delivered again.
	e.setCommitted(0, 0)
	r = e.start(cfg)
	e.committedTo(0, 3)
	e.produce(0, event("d", "4"))
	e.committedTo(0, 4)
	r.close(t)
	if d := e.count(hooks.Duplicate); d != 0 {
		t.Errorf("%d duplicates: the group's offset won over the stored one", d)
	}
	if !strings.Contains(e.logs.String(), "starting at the stored offset") {
		t.Error("the start at the stored offset is not logged")
	}

	// The database lost commits (a failover): the stored offset, behind the
	// group's, wins; the messages in between come again as duplicates.
	e.setStored(0, 2, e.generation())
	r = e.start(cfg)
	e.eventually("the redelivered messages", func() bool { return e.count(hooks.Duplicate) == 2 })
	r.close(t)
	if got := e.effects(); len(got) != 4 {
		t.Errorf("effects %q, want 4", got)
	}
	if !strings.Contains(e.logs.String(), "behind the group's committed one") {
		t.Error("the start behind the group's offset is not logged")
	}
}

// A stored offset that goes back while the partition runs (a failover of
// the database) makes the worker resume from it.
func TestMemStoredOffsetMovedBack(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("c", "3"))
	cfg := e.config(applyAll)
	cfg.Offsets.Store = true
	ctx := testhooks.With(context.Background(), &testhooks.Knobs{PosCheckInterval: 10 * time.Millisecond})
	r := e.startCtx(ctx, cfg)
	defer r.close(t)
	e.committedTo(0, 3)
	e.eventually("the stored offset", func() bool { return e.stored(0).Next == 3 })
	e.setStored(0, 1, e.generation())
	e.eventually("the messages after the stored offset again", func() bool { return e.count(hooks.Duplicate) == 2 })
	if e.count(hooks.Repositioned) == 0 {
		t.Error("no repositioned event")
	}
	if got := e.effects(); len(got) != 3 {
		t.Errorf("effects %q, want 3", got)
	}
}

// A stored offset written by a newer generation than this member's, which
// the coordinator confirms as current, comes from a recreated group: it is
// taken over. If the coordinator says this member's generation is over,
// the worker stops without writing.
func TestMemStoredOffsetOfANewerGeneration(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"))
	cfg := e.config(applyAll)
	cfg.Offsets.Store = true
	r := e.start(cfg)
	e.committedTo(0, 1)
	r.close(t)

	e.setStored(0, 1, 99)
	r = e.start(cfg)
	e.produce(0, event("b", "2"))
	e.committedTo(0, 2)
	if row := e.stored(0); row.Next != 2 || row.Generation >= 99 {
		t.Errorf("stored %+v, want next 2 under this member's generation", row)
	}
	if !strings.Contains(e.logs.String(), "the row is taken over") {
		t.Error("the takeover is not logged")
	}
	r.close(t)

	// This member's generation is over: the coordinator refuses its commit.
	e.setStored(0, 2, 99)
	refused := 0
	e.spy.set(func(s *spy) {
		s.commitErr = func(int, int64) error {
			if refused < 1 {
				refused++
				return errSpyFenced
			}
			return nil
		}
	})
	r = e.start(cfg)
	defer r.close(t)
	e.eventually("the zombie's stop", func() bool { return strings.Contains(e.logs.String(), "partition taken over by a newer generation") })
}

// A topic deleted and created again under a stored offset: the message
// before the stored offset is not the one processed there, and the
// partition stops.
func TestMemTopicRecreated(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("c", "3"), event("d", "4"))
	cfg := e.config(applyAll)
	cfg.Offsets.Store = true
	r := e.start(cfg)
	e.committedTo(0, 4)
	r.close(t)
	e.recreate("orders", 1)
	e.produce(0, event("x", "x"), event("y", "y"), event("z", "z"), event("w", "w"), event("v", "v"))
	r = e.start(cfg)
	e.eventually("the stop", func() bool { return len(r.c.Stopped()) == 1 })
	if s := r.c.Stopped()[0]; s.Reason != ReasonTopicRecreated || s.Offset != 4 {
		t.Errorf("stopped %+v, want %s at 4", s, ReasonTopicRecreated)
	}
	r.close(t)
	if got := e.effects(); len(got) != 4 {
		t.Errorf("effects %q: the recreated topic's messages were processed", got)
	}
}

// A committed offset past the log end (the topic recreated under the
// group's offset) stops the partition; it is never clamped.
func TestMemOffsetBeyondLogEnd(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"))
	e.setCommitted(0, 10)
	r := e.start(e.config(applyAll))
	e.eventually("the stop", func() bool { return len(r.c.Stopped()) == 1 })
	s := r.c.Stopped()[0]
	if s.Reason != ReasonOffsetBeyondLogEnd || s.Offset != 10 || !errors.Is(s, ErrOffsetBeyondLogEnd) {
		t.Errorf("stopped %+v", s)
	}
	if n := len(e.effects()); n != 0 {
		t.Errorf("%d effects", n)
	}
}

// A partition whose log end falls below the next offset while it runs
// (recreated under a running consumer) stops too.
func TestMemLogEndFallsBehind(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"))
	ctx := testhooks.With(context.Background(), &testhooks.Knobs{LogCheckInterval: 10 * time.Millisecond})
	r := e.startCtx(ctx, e.config(applyAll))
	defer r.close(t)
	e.committedTo(0, 2)
	e.recreate("orders", 1)
	e.eventually("the stop", func() bool { return len(r.c.Stopped()) == 1 })
	if s := r.c.Stopped()[0]; s.Reason != ReasonOffsetBeyondLogEnd || s.Offset != 2 {
		t.Errorf("stopped %+v", s)
	}
}

// Kafka.StartOffset LastOffset skips what the partition held before the group's
// first start, and commits that start at once.
func TestMemStartAtLogEnd(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("old1", "old"), event("old2", "old"))
	cfg := e.config(applyAll)
	cfg.Kafka.StartOffset = kafka.LastOffset
	e.start(cfg)
	e.committedTo(0, 2)
	e.produce(0, event("new", "new"))
	e.committedTo(0, 3)
	if got := e.effects(); len(got) != 1 || got[0] != "new" {
		t.Errorf("effects %q, want only the new message", got)
	}
}

// A committed offset below the log start (retention deleted the messages)
// starts at the log start.
func TestMemCommittedBelowLogStart(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"), event("b", "2"), event("c", "3"))
	if err := e.cluster.DeleteRecords("orders", 0, 2); err != nil {
		t.Fatal(err)
	}
	e.setCommitted(0, 0)
	e.start(e.config(applyAll))
	e.committedTo(0, 3)
	if got := e.effects(); len(got) != 1 || got[0] != "3" {
		t.Errorf("effects %q, want the message the log kept", got)
	}
}

// A crash after the database commit and before the offset commit: the
// next run delivers the message again, and the inbox takes it as a
// duplicate.
func TestMemCrashBeforeOffsetCommit(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0, event("a", "1"))
	knobs := &testhooks.Knobs{AfterDB: func(topic string, partition int, next int64, processed int) error { return testhooks.ErrCrash }}
	r := e.startCtx(testhooks.With(context.Background(), knobs), e.config(applyAll))
	var err error
	select {
	case err = <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no crash")
	}
	if !errors.Is(err, testhooks.ErrCrash) {
		t.Fatalf("Run returned %v, want the crash", err)
	}
	if got := e.committed(0); got > 0 {
		t.Fatalf("committed %d before the crash", got)
	}
	e.start(e.config(applyAll))
	e.committedTo(0, 1)
	if len(e.effects()) != 1 || e.count(hooks.Duplicate) != 1 {
		t.Errorf("effects %q, %d duplicates; want 1 and 1", e.effects(), e.count(hooks.Duplicate))
	}
}
