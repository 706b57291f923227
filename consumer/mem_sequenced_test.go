package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
)

func (e *memEnv) sequencedConfig(h Handler) Config {
	cfg := e.config(h)
	cfg.Sequenced.Sources = []string{"orders-outbox"}
	return cfg
}

func (e *memEnv) watermarkRows() []storage.WatermarkRow {
	e.t.Helper()
	rows, err := e.store.Watermarks(context.Background(), e.db, "reserve-stock", "orders", -1)
	if err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// Messages of a trusted sequenced source are deduplicated by their
// stream's watermark, without inbox rows: a number already applied is a
// duplicate, whatever its event id.
func TestMemSequencedDedup(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0,
		sequenced("s1", "orders-outbox", 0, 1, 1),
		sequenced("s2", "orders-outbox", 0, 2, 1),
		sequenced("s3", "orders-outbox", 0, 3, 1),
		sequenced("s2-again", "orders-outbox", 0, 2, 1),
	)
	e.start(e.sequencedConfig(applyAll))
	e.committedTo(0, 4)
	if got := e.effects(); !slices.Equal(got, []string{"s1", "s2", "s3"}) {
		t.Errorf("effects %q", got)
	}
	if n := e.rows("inbox_messages", ""); n != 0 {
		t.Errorf("%d inbox rows for sequenced messages, want 0", n)
	}
	if rows := e.watermarkRows(); len(rows) != 1 || rows[0].Source != "orders-outbox" || rows[0].Epoch != 1 {
		t.Errorf("watermark rows %+v, want the stream's one", rows)
	}
	dups := e.eventsOf(hooks.Duplicate)
	if len(dups) != 1 || dups[0].EventID != "s2-again" || !dups[0].Sequenced {
		t.Errorf("duplicate events %+v, want s2-again, deduplicated by the watermark", dups)
	}
}

// The same with a batch handler and batches: numbers already applied are
// left out, and the watermark moves with each batch.
func TestMemSequencedBatches(t *testing.T) {
	e := newMemEnv(t, 2)
	for p := range int64(2) {
		var msgs []kafka.Message
		for i := range int64(6) {
			msgs = append(msgs, sequenced(fmt.Sprintf("b%d-%d", p, i), "orders-outbox", p, i+1, 2))
		}
		e.produce(int(p), msgs...)
	}
	cfg := e.sequencedConfig(nil)
	cfg.BatchSize = 5
	cfg.BatchWait = 50 * time.Millisecond
	cfg.BatchHandler = func(ctx context.Context, tx *gorm.DB, ms []Message) error {
		for _, m := range ms {
			if err := apply(tx, m); err != nil {
				return err
			}
		}
		return nil
	}
	r := e.start(cfg)
	e.committedTo(0, 6)
	e.committedTo(1, 6)
	r.close(t)
	if n := e.rows("inbox_messages", ""); n != 0 {
		t.Errorf("%d inbox rows, want 0", n)
	}
	// Everything again, from the start: all duplicates.
	e.setCommitted(0, 0)
	e.setCommitted(1, 0)
	e.start(cfg)
	e.committedTo(0, 6)
	e.committedTo(1, 6)
	if got := e.effects(); len(got) != 12 {
		t.Errorf("%d effects, want 12", len(got))
	}
	if d := e.count(hooks.Duplicate); d != 12 {
		t.Errorf("%d duplicates, want 12", d)
	}
}

// A message of an aligned stream after a gap in its numbers stops the
// partition before it; with Sequenced.AcceptGaps it is processed, and the
// gap logged.
func TestMemSequenceGap(t *testing.T) {
	for _, accept := range []bool{false, true} {
		t.Run(map[bool]string{false: "stop", true: "accept"}[accept], func(t *testing.T) {
			e := newMemEnv(t, 1)
			e.produce(0,
				sequenced("g1", "orders-outbox", 0, 1, 1),
				sequenced("g2", "orders-outbox", 0, 2, 1),
				sequenced("g4", "orders-outbox", 0, 4, 1),
			)
			cfg := e.sequencedConfig(applyAll)
			cfg.Sequenced.AcceptGaps = accept
			r := e.start(cfg)
			if accept {
				e.committedTo(0, 3)
				if !strings.Contains(e.logs.String(), "a sequenced stream has a gap") {
					t.Error("the accepted gap is not logged")
				}
				return
			}
			e.eventually("the stop", func() bool { return len(r.c.Stopped()) == 1 })
			s := r.c.Stopped()[0]
			if s.Reason != ReasonSequenceGap || s.Offset != 2 || !strings.Contains(s.Error(), "expected 3") {
				t.Errorf("stopped %+v", s)
			}
			e.committedTo(0, 2)
			if got := e.effects(); !slices.Equal(got, []string{"g1", "g2"}) {
				t.Errorf("effects %q", got)
			}
		})
	}
}

// When a message of a stream fails in a batch, the later messages of its
// shard are held back until it is resolved: the stream's order holds.
func TestMemSequencedHeldBack(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0,
		sequenced("h1", "orders-outbox", 0, 1, 1),
		sequenced("h2", "orders-outbox", 0, 2, 1),
		sequenced("h3", "orders-outbox", 0, 3, 1),
		event("o1", "o1"),
		sequenced("h4", "orders-outbox", 0, 4, 1),
	)
	var failed atomic.Int32
	cfg := e.sequencedConfig(func(ctx context.Context, tx *gorm.DB, m Message) error {
		if m.EventID == "h2" && failed.Add(1) == 1 {
			return errBoom
		}
		return apply(tx, m)
	})
	cfg.BatchSize = 5
	cfg.BatchWait = 50 * time.Millisecond
	cfg.Failure.MaxAttempts = 3
	e.start(cfg)
	e.committedTo(0, 5)
	got := e.effects()
	var shard0 []string
	for _, v := range got {
		if v != "o1" {
			shard0 = append(shard0, v)
		}
	}
	if !slices.Equal(shard0, []string{"h1", "h2", "h3", "h4"}) || len(got) != 5 {
		t.Errorf("effects %q: shard 0 out of order or incomplete", got)
	}
	if n := e.rows("inbox_messages", ""); n != 1 {
		t.Errorf("%d inbox rows, want o1's", n)
	}
}

// A source that is not trusted, or a trusted one whose shards are not
// aligned with the partitions, takes inbox rows like any message, and the
// consumer says so once per source.
func TestMemUntrustedSourceTakesRows(t *testing.T) {
	e := newMemEnv(t, 1)
	e.produce(0,
		sequenced("u1", "elsewhere", 0, 1, 1), sequenced("u2", "elsewhere", 0, 2, 1),
		sequenced("n1", "orders-outbox", 3, 1, 0), sequenced("n2", "orders-outbox", 3, 2, 0))
	e.start(e.sequencedConfig(applyAll))
	e.committedTo(0, 4)
	if n := e.rows("inbox_messages", ""); n != 4 {
		t.Errorf("%d inbox rows, want 4", n)
	}
	if n := strings.Count(e.logs.String(), "source=elsewhere"); n != 1 {
		t.Errorf("the untrusted source is logged %d times, want once", n)
	}
	if n := strings.Count(e.logs.String(), "trusted source is not aligned"); n != 1 {
		t.Errorf("the unaligned source is logged %d times, want once", n)
	}
}

// A trusted source's message with a malformed sequence goes to the policy
// as invalid.
func TestMemBadSequenceIsDeadLettered(t *testing.T) {
	e := newMemEnv(t, 1)
	e.createTopic("orders.dlq", 1)
	bad := sequenced("bad", "orders-outbox", 0, 1, 1)
	for i := range bad.Headers {
		if bad.Headers[i].Key == "inbox_seq" {
			bad.Headers[i].Value = []byte("01")
		}
	}
	e.produce(0, bad, sequenced("ok", "orders-outbox", 0, 1, 1))
	cfg := e.sequencedConfig(applyAll)
	cfg.Failure.Policy = DeadLetter
	cfg.Failure.DeadLetterTopic = "orders.dlq"
	e.start(cfg)
	e.committedTo(0, 2)
	dead := e.deadLetters()
	if len(dead) != 1 || headerOf(dead[0], "dlq_reason") != ReasonInvalid {
		t.Fatalf("dead letters %v", dead)
	}
	if !strings.Contains(headerOf(dead[0], "dlq_error"), "not a decimal") {
		t.Errorf("dead letter error %q", headerOf(dead[0], "dlq_error"))
	}
}

// A sequenced message dead-lettered moves its stream's watermark past it
// (and, with Offsets.Store, the stored offset): delivered again, it is a
// duplicate, not a second dead letter.
func TestMemSequencedDeadLetterMovesTheWatermark(t *testing.T) {
	e := newMemEnv(t, 1)
	e.createTopic("orders.dlq", 1)
	e.produce(0,
		sequenced("q1", "orders-outbox", 0, 1, 1),
		sequenced("q2", "orders-outbox", 0, 2, 1),
		sequenced("q3", "orders-outbox", 0, 3, 1),
	)
	cfg := e.sequencedConfig(func(ctx context.Context, tx *gorm.DB, m Message) error {
		if m.EventID == "q2" {
			return errBoom
		}
		return apply(tx, m)
	})
	cfg.Failure.Policy = DeadLetter
	cfg.Failure.DeadLetterTopic = "orders.dlq"
	cfg.Failure.MaxAttempts = 2
	cfg.Offsets.Store = true
	r := e.start(cfg)
	e.committedTo(0, 3)
	r.close(t)
	if row := e.stored(0); row.Next != 3 {
		t.Errorf("stored %+v, want 3", row)
	}
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}

	// Everything again, from the start.
	e.setCommitted(0, 0)
	if err := e.db.Exec(`DELETE FROM ` + DefaultOffsetsTable).Error; err != nil {
		t.Fatal(err)
	}
	e.start(cfg)
	e.eventually("the duplicates", func() bool { return e.count(hooks.Duplicate) == 3 })
	if n := len(e.deadLetters()); n != 1 {
		t.Errorf("%d dead letters after the redelivery, want still 1", n)
	}
	if got := e.effects(); !slices.Equal(got, []string{"q1", "q3"}) {
		t.Errorf("effects %q", got)
	}
}
