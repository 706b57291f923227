package consumer_test

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/watermark"
	inboxotel "github.com/inboxgo/inbox/otel"
	"github.com/inboxgo/inbox/storage"
)

const testSource = "0123456789abcdef0123456789abcdef"

// seqMessage is order n as the relay of source testSource publishes it in
// epoch 1: shard and seq are its place in the outbox. aligned, if positive,
// is the partition count the source's shards are aligned with (then shard
// must be partition).
func seqMessage(n, partition int, shard int32, seq int64, aligned int) kafka.Message {
	return seqMessageIn(n, partition, 1, shard, seq, aligned)
}

func seqMessageIn(n, partition int, epoch int64, shard int32, seq int64, aligned int) kafka.Message {
	m := orderMessage(n, partition)
	m.Headers = append(m.Headers,
		kafka.Header{Key: header.SeqSource, Value: []byte(testSource)},
		kafka.Header{Key: header.SeqEpoch, Value: []byte(strconv.FormatInt(epoch, 10))},
		kafka.Header{Key: header.SeqShard, Value: []byte(strconv.Itoa(int(shard)))},
		kafka.Header{Key: header.Seq, Value: []byte(strconv.FormatInt(seq, 10))},
	)
	if aligned > 0 {
		m.Headers = append(m.Headers, kafka.Header{Key: header.SeqPartitions, Value: []byte(strconv.Itoa(aligned))})
	}
	return m
}

func sequencedConfig(t *testing.T, brokers []string, s *shop, ev *events) consumer.Config {
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Sequenced.Sources = []string{testSource}
	return cfg
}

// inboxRows counts the rows of the shop's inbox table.
func (s *shop) inboxRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.db.Raw(`SELECT COUNT(*) FROM ` + cmp.Or(s.inboxTable, "inbox_messages")).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// watermarks returns the committed watermarks of the reserve-stock
// consumer on orders, by partition and source.
func (s *shop) watermarks(t *testing.T) map[int32]map[string]watermark.Applied {
	t.Helper()
	return s.watermarksOf(t, "orders")
}

// watermarksOf returns the committed watermarks of the reserve-stock
// consumer on topic, by partition and source.
func (s *shop) watermarksOf(t *testing.T, topic string) map[int32]map[string]watermark.Applied {
	t.Helper()
	ws := s.ib.Store().(storage.WatermarkStore)
	rows, err := ws.Watermarks(context.Background(), s.db, "reserve-stock", topic, -1)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]map[string]watermark.Applied{}
	for _, r := range rows {
		a, err := watermark.Decode(r.Applied)
		if err != nil {
			t.Fatal(err)
		}
		if out[r.Partition] == nil {
			out[r.Partition] = map[string]watermark.Applied{}
		}
		out[r.Partition][r.Source+"/"+strconv.FormatInt(r.Epoch, 10)] = a
	}
	return out
}

// setWatermark moves the reserve-stock consumer's watermark of testSource
// epoch 1 on orders partition 0 from "from" to "to" behind the consumer's
// back, with the compare-and-set a member's transaction makes, and with
// apply's writes (nil: none) in the same transaction.
func (s *shop) setWatermark(t *testing.T, from, to watermark.Applied, apply func(tx *gorm.DB) error) {
	t.Helper()
	ws := s.ib.Store().(storage.WatermarkStore)
	key := storage.WatermarkKey{Scope: "reserve-stock", Source: testSource, Epoch: 1, Topic: "orders", Partition: 0}
	err := s.db.Transaction(func(tx *gorm.DB) error {
		if apply != nil {
			if err := apply(tx); err != nil {
				return err
			}
		}
		return ws.SaveWatermarks(context.Background(), tx, []storage.WatermarkWrite{{WatermarkKey: key,
			Old: watermark.Encode(from), New: watermark.Encode(to)}})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Messages of a trusted source are deduplicated by the watermark alone (no
// inbox row), those without sequence headers by their row, in the same
// batches; redeliveries of both are caught.
func TestSequencedDedupNeedsNoInboxRows(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders")
	s := newSQLiteShop(t)
	var msgs []kafka.Message
	seq := map[int32]int64{}
	for i := range 40 {
		p := i % 2
		if i%5 == 4 {
			msgs = append(msgs, orderMessage(i, p)) // no sequence headers
			continue
		}
		shard := int32(p) // aligned: the shard is the partition
		seq[shard]++
		msgs = append(msgs, seqMessage(i, p, shard, seq[shard], 2))
	}
	// Republications: every message again, same headers, later offsets.
	msgs = append(msgs, msgs[:40]...)
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.BatchSize, cfg.BatchWait = 10, 200*time.Millisecond
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "80 messages", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 80
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 40, nil)
	if d := ev.count(hooks.Duplicate); d != 40 {
		t.Errorf("%d duplicates, want 40", d)
	}
	sequenced := 0
	for _, e := range append(ev.filter(hooks.Processed), ev.filter(hooks.Duplicate)...) {
		if e.Sequenced {
			sequenced++
		}
	}
	if sequenced != 64 {
		t.Errorf("%d outcomes reported as deduplicated by a watermark, want 64 (16 went through rows)", sequenced)
	}
	if n := s.inboxRows(t); n != 8 {
		t.Errorf("%d inbox rows, want 8 (one per message without sequence headers)", n)
	}
	wm := s.watermarks(t)
	for p := int32(0); p < 2; p++ {
		if a := wm[p][testSource+"/1"]; len(a) != 1 || a[p] != 16 {
			t.Errorf("partition %d watermark %v, want its shard at 16", p, a)
		}
	}
}

// A message that fails inside its batch holds back the later messages of
// its shard: were they committed, the watermark would pass it, and its
// retry would be taken for a duplicate and never applied. The messages of
// the batch that take their inbox rows commit.
func TestSequencedFailureHoldsBackItsShard(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	var msgs []kafka.Message
	for i := range 12 {
		// Shard 0 (aligned) and messages without sequence headers
		// interleaved.
		if i%2 == 1 {
			msgs = append(msgs, orderMessage(i, 0))
			continue
		}
		msgs = append(msgs, seqMessage(i, 0, 0, int64(i/2+1), 1))
	}
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.BatchSize, cfg.BatchWait = 12, 2*time.Second
	var mu sync.Mutex
	failures := 0
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-4" { // shard 0, seq 3
			mu.Lock()
			defer mu.Unlock()
			if failures < 2 {
				failures++
				return errors.New("stock service briefly unavailable")
			}
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "12 processed", func() bool { return ev.count(hooks.Processed) == 12 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 12, nil)
	if d := ev.count(hooks.Duplicate); d != 0 {
		t.Errorf("%d duplicates, want none", d)
	}
	// Only order-4's attempts were retries; the held-back messages of
	// shard 0 (orders 6, 8, 10) were not charged.
	for _, e := range ev.filter(hooks.Retry) {
		if e.Scope == hooks.RetryMessage && e.EventID != "evt-order-4" {
			t.Errorf("a held-back message was charged a retry: %+v", e)
		}
	}
	if got := s.watermarks(t)[0][testSource+"/1"]; got[0] != 6 {
		t.Errorf("watermark %v, want shard 0 at 6", got)
	}
	if n := s.inboxRows(t); n != 6 {
		t.Errorf("%d inbox rows, want 6 (the messages without sequence headers)", n)
	}
}

// On an aligned stream a gap (a message lost upstream) stops the partition
// at the message after it, naming the stream and the missing numbers.
func TestSequencedGapStopsThePartition(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders",
		seqMessage(0, 0, 0, 1, 1), seqMessage(1, 0, 0, 2, 1), // then 3 and 4 are lost
		seqMessage(2, 0, 0, 5, 1), seqMessage(3, 0, 0, 6, 1))
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
	time.Sleep(300 * time.Millisecond)
	err := r.stop(t)
	var pse *consumer.PartitionStoppedError
	if !errors.As(err, &pse) || pse.Reason != consumer.ReasonSequenceGap || pse.Offset != 2 {
		t.Fatalf("Run returned %v, want the partition stopped at offset 2 for a sequence gap", err)
	}
	if msg := pse.Error(); !strings.Contains(msg, testSource) || !strings.Contains(msg, "3..4") {
		t.Errorf("the gap's error %q does not name the source and the missing numbers 3..4", msg)
	}
	s.checkExactlyOnce(t, 2, nil)
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 2 {
		t.Errorf("committed %v, want 2 (held at the gap)", got)
	}

	// Sequenced.AcceptGaps goes on past it.
	ev = newEvents()
	cfg = sequencedConfig(t, brokers, s, ev)
	cfg.Sequenced.AcceptGaps = true
	r = start(t, cfg)
	waitUntil(t, 30*time.Second, "the rest", func() bool { return ev.count(hooks.Processed) == 2 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 4, nil)
}

// With Offsets.Store a gap is checked against the stored offset first (a
// failover that took the watermark back resumes the partition instead):
// one the database did not make, its stored offset where this member left
// it, still stops the partition.
func TestSequencedGapStopsThePartitionWithStoredOffsets(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders", seqMessage(0, 0, 0, 1, 1), seqMessage(1, 0, 0, 2, 1))
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Offsets.Store = true
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "2 processed", func() bool { return ev.count(hooks.Processed) == 2 })
	produce(t, brokers, "orders", seqMessage(2, 0, 0, 5, 1), seqMessage(3, 0, 0, 6, 1)) // 3 and 4 lost
	waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
	err := r.stop(t)
	var pse *consumer.PartitionStoppedError
	if !errors.As(err, &pse) || pse.Reason != consumer.ReasonSequenceGap || pse.Offset != 2 {
		t.Fatalf("Run returned %v, want the partition stopped at offset 2 for a sequence gap", err)
	}
	s.checkExactlyOnce(t, 2, nil)
	if got := ev.count(hooks.Repositioned); got != 0 {
		t.Errorf("%d repositionings, want none", got)
	}
}

// A dead-lettered message of an aligned stream moves its watermark: the
// next message, in a batch of its own, is not a gap.
func TestSequencedDeadLetterIsNotAGap(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, seqMessage(i, 0, 0, int64(i+1), 1))
	}
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 2
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-2" {
			return errors.New("sku-2 is not sold here")
		}
		return s.reserve(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "4 processed and 1 dead letter", func() bool {
		return ev.count(hooks.Processed) == 4 && ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v (a dead letter taken for a gap?)", err)
	}
	s.checkExactlyOnce(t, 5, map[int]bool{2: true})
	if got := s.watermarks(t)[0][testSource+"/1"]; got[0] != 5 {
		t.Errorf("watermark %v, want shard 0 at 5", got)
	}
}

// A watermark another member moved behind the consumer's back (a zombie's
// or a new owner's commit) is caught by the compare-and-set: the consumer
// reads it again, and the messages the other member applied are
// duplicates.
func TestSequencedWatermarkMovedByAnotherMember(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders", seqMessage(0, 0, 0, 1, 1), seqMessage(1, 0, 0, 2, 1))
	ev := newEvents()
	r := start(t, sequencedConfig(t, brokers, s, ev))
	waitUntil(t, 30*time.Second, "2 processed", func() bool { return ev.count(hooks.Processed) == 2 })

	// Another member applies orders 2 and 3 (seq 3 and 4) and moves the
	// watermark, as its transaction would.
	s.setWatermark(t, watermark.Applied{0: 2}, watermark.Applied{0: 4}, func(tx *gorm.DB) error {
		for i := 2; i <= 3; i++ {
			if err := s.reserve(context.Background(), tx, consumer.Message{Message: orderMessage(i, 0)}); err != nil {
				return err
			}
		}
		return nil
	})
	produce(t, brokers, "orders", seqMessage(2, 0, 0, 3, 1), seqMessage(3, 0, 0, 4, 1), seqMessage(4, 0, 0, 5, 1))
	waitUntil(t, 30*time.Second, "3 more", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 5
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 5, nil)
	if d := ev.count(hooks.Duplicate); d != 2 {
		t.Errorf("%d duplicates, want 2 (the other member's)", d)
	}
}

// A stream switched from inbox rows to sequenced dedup: within
// Sequenced.RowsUntil a sequenced message also consults its row, so a copy
// of a message applied through its row before the switch is a duplicate.
func TestSequencedSwitchFromRowsConsultsThem(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	var msgs []kafka.Message
	for i := range 6 {
		msgs = append(msgs, seqMessage(i, 0, 0, int64(i+1), 1))
	}
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	// Before the switch: the source is not trusted, every message takes its
	// row.
	r := start(t, baseConfig(t, brokers, "orders", "inventory", s, ev))
	waitUntil(t, 30*time.Second, "6 processed", func() bool { return ev.count(hooks.Processed) == 6 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// The relay republishes them (a lease taken over) after the switch.
	produce(t, brokers, "orders", msgs...)
	ev = newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Sequenced.RowsUntil = time.Now().Add(30 * 24 * time.Hour)
	r = start(t, cfg)
	waitUntil(t, 30*time.Second, "6 more", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 6
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 6, nil)
	if got := s.watermarks(t)[0][testSource+"/1"]; got[0] != 6 {
		t.Errorf("watermark %v, want shard 0 at 6 (the rows' duplicates advance it too)", got)
	}
}

// A new epoch (the producer's database restored) numbers its events from
// where the restore left off: they are new events, applied, never taken for
// the old epoch's.
func TestSequencedNewEpochIsANewStream(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders",
		seqMessageIn(0, 0, 1, 0, 1, 1), seqMessageIn(1, 0, 1, 0, 2, 1), seqMessageIn(2, 0, 1, 0, 3, 1),
		// Restored to before seq 2; epoch 2 hands out 2 and 3 again.
		seqMessageIn(3, 0, 2, 0, 2, 1), seqMessageIn(4, 0, 2, 0, 3, 1),
		// A late copy of an epoch 1 message.
		seqMessageIn(1, 0, 1, 0, 2, 1))
	ev := newEvents()
	r := start(t, sequencedConfig(t, brokers, s, ev))
	waitUntil(t, 30*time.Second, "6 messages", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 6
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 5, nil)
}

// A trusted source's message with unusable sequence headers is invalid:
// the failure policy gets it, nothing is guessed.
func TestSequencedBadHeadersAreInvalid(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	noSeq := seqMessage(0, 0, 0, 1, 0)
	noSeq.Headers = noSeq.Headers[:len(noSeq.Headers)-1]
	badSeq := seqMessage(1, 0, 0, 1, 0)
	badSeq.Headers[len(badSeq.Headers)-1].Value = []byte("01")
	misplaced := seqMessage(2, 0, 1, 1, 2) // aligned shard 1 on partition 0
	produce(t, brokers, "orders", noSeq, badSeq, misplaced)
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic = consumer.DeadLetter, "orders.dlq"
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "3 dead letters", func() bool { return ev.count(hooks.DeadLettered) == 3 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 0, nil)
}

// Sequenced dedup end to end on a real broker and every database: row and
// watermark paths in the same batches, republications, a message that fails
// twice inside its batch (its shard held back), stored offsets.
func TestSequencedEndToEnd(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t)
			topic := "seq-e2e-" + be.name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			createTopic(t, brokers, topic, 2)
			const n = 60
			var msgs []kafka.Message
			seq := map[int32]int64{}
			for i := range n {
				p := i % 2
				if i%6 == 5 {
					msgs = append(msgs, orderMessage(i, p))
					continue
				}
				shard := int32(p) // aligned
				seq[shard]++
				msgs = append(msgs, seqMessage(i, p, shard, seq[shard], 2))
			}
			msgs = append(msgs, msgs[10:40]...)
			produce(t, brokers, topic, msgs...)
			ev := newEvents()
			cfg := baseConfig(t, brokers, topic, "seq-"+topic, s, ev)
			cfg.Sequenced.Sources = []string{testSource}
			cfg.Offsets.Store, cfg.Offsets.Table = true, "inbox_offsets"+s.suffix
			cfg.BatchSize, cfg.BatchWait = 20, 300*time.Millisecond
			var mu sync.Mutex
			failures := 0
			cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
				if string(msg.Key) == "order-13" {
					mu.Lock()
					defer mu.Unlock()
					if failures < 2 {
						failures++
						return errors.New("briefly unavailable")
					}
				}
				return s.reserve(ctx, tx, msg)
			}
			r := start(t, cfg)
			waitUntil(t, 60*time.Second, "every message", func() bool {
				return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == n+30
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, n, nil)
			if rows := s.inboxRows(t); rows != n/6 {
				t.Errorf("%d inbox rows, want %d (the messages without sequence headers)", rows, n/6)
			}
		})
	}
}

// The consumer's database failed over to a replica that lacked the last
// commits: the watermark went back. The compare-and-set fails, and on an
// aligned stream the consumer, reading it again, finds the numbers in
// between missing before the next message: it stops loudly instead of
// moving the watermark past them.
func TestSequencedWatermarkWentBackIsAGap(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders", seqMessage(0, 0, 0, 1, 1), seqMessage(1, 0, 0, 2, 1), seqMessage(2, 0, 0, 3, 1))
	ev := newEvents()
	r := start(t, sequencedConfig(t, brokers, s, ev))
	waitUntil(t, 30*time.Second, "3 processed", func() bool { return ev.count(hooks.Processed) == 3 })

	// The failover: the database holds the watermark of seq 1 again.
	s.setWatermark(t, watermark.Applied{0: 3}, watermark.Applied{0: 1}, nil)
	produce(t, brokers, "orders", seqMessage(3, 0, 0, 4, 1))
	waitUntil(t, 30*time.Second, "the partition to stop", func() bool { return ev.count(hooks.PartitionStopped) == 1 })
	err := r.stop(t)
	var pse *consumer.PartitionStoppedError
	if !errors.As(err, &pse) || pse.Reason != consumer.ReasonSequenceGap || pse.Offset != 3 || !strings.Contains(pse.Error(), "2..3") {
		t.Fatalf("Run returned %v, want the partition stopped at offset 3 for the gap 2..3", err)
	}
	s.checkExactlyOnce(t, 3, nil)
}

// Copies of messages already applied, in batches of their own (a relay's
// republication, a replay), run no transaction on the watermark path and
// claim their rows on the row path: either way the stored offset follows
// the group's past them, so that the partition's next owner starts where
// the group committed, without the Warn of a failover that lost commits.
func TestDuplicatesMoveTheStoredOffset(t *testing.T) {
	t.Parallel()
	for name, msg := range map[string]func(i int) kafka.Message{
		"watermark": func(i int) kafka.Message { return seqMessage(i, 0, 0, int64(i+1), 1) },
		"row":       func(i int) kafka.Message { return orderMessage(i, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			var msgs []kafka.Message
			for i := range 4 {
				msgs = append(msgs, msg(i))
			}
			produce(t, brokers, "orders", msgs...)
			ev := newEvents()
			cfg := sequencedConfig(t, brokers, s, ev)
			cfg.Offsets.Store = true
			cfg.BatchSize, cfg.BatchWait = 2, 200*time.Millisecond
			r := start(t, cfg)
			waitUntil(t, 30*time.Second, "4 processed", func() bool { return ev.count(hooks.Processed) == 4 })
			produce(t, brokers, "orders", msgs...)
			waitUntil(t, 30*time.Second, "4 duplicates", func() bool { return ev.count(hooks.Duplicate) == 4 })
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, 4, nil)
			s.checkStoredAtGroup(t, brokers, 8)

			// The next owner.
			ev2, rec := newEvents(), newRecorder(t)
			cfg.Hooks, cfg.Logger = []hooks.Hook{hooks.EventFunc(ev2.on)}, slog.New(rec)
			r2 := start(t, cfg)
			waitUntil(t, 30*time.Second, "the partition to be assigned", func() bool { return ev2.count(hooks.Assigned) == 1 })
			if err := r2.stop(t); err != nil {
				t.Fatal(err)
			}
			if at := ev2.filter(hooks.Assigned)[0].Offset; at != 8 {
				t.Errorf("the next owner started at %d, want 8", at)
			}
			if _, warned := rec.find(slog.LevelWarn, "behind the group's committed one"); warned {
				t.Error("the next owner warned of a stored offset behind the group's, with no failover")
			}
		})
	}
}

// The process span of each message says how it was deduplicated, as the
// inbox.messages metric does: inbox.dedup "watermark" for a sequenced
// message, applied or a copy the watermark covers (the inbox decides the
// copy without a transaction, but the message still has its span), "row"
// for a message without sequence headers; none on an attempt that failed.
func TestSequencedSpansCarryTheDedupPath(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	otelHook, err := inboxotel.New(inboxotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(s.db, s.ib.Store(), inbox.Config{Logger: testLogger(t), RetentionDays: 30, Hooks: []hooks.Hook{otelHook}})
	if err != nil {
		t.Fatal(err)
	}
	// Orders 0 and 1 sequenced, 2 on its row; then a copy of each.
	msgs := []kafka.Message{seqMessage(0, 0, 0, 1, 1), seqMessage(1, 0, 0, 2, 1), orderMessage(2, 0)}
	produce(t, brokers, "orders", msgs...)
	ev := newEvents()
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Inbox = ib
	cfg.Hooks = append(cfg.Hooks, otelHook)
	cfg.Handler = s.failingOnce("order-1")
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "3 processed", func() bool { return ev.count(hooks.Processed) == 3 })
	produce(t, brokers, "orders", msgs...)
	waitUntil(t, 30*time.Second, "3 duplicates", func() bool { return ev.count(hooks.Duplicate) == 3 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 3, nil)

	got := map[string]int{} // "order outcome dedup" -> spans
	for _, sp := range spans.Ended() {
		if !strings.HasPrefix(sp.Name(), "process") {
			continue
		}
		var order, outcome, dedup string
		for _, kv := range sp.Attributes() {
			switch kv.Key {
			case "messaging.message.id":
				order = strings.TrimPrefix(kv.Value.AsString(), "evt-")
			case "inbox.outcome":
				outcome = kv.Value.AsString()
			case "inbox.dedup":
				dedup = kv.Value.AsString()
			}
		}
		got[order+" "+outcome+" "+dedup]++
	}
	want := map[string]int{
		"order-0 processed watermark": 1, "order-0 duplicate watermark": 1,
		"order-1 failed ": 1, "order-1 processed watermark": 1, "order-1 duplicate watermark": 1,
		"order-2 processed row": 1, "order-2 duplicate row": 1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("process spans by order, outcome and inbox.dedup:\n got %v\nwant %v", got, want)
	}

	// inbox.processing.duration is recorded by the span, with its attributes.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	durations := map[string]uint64{} // "outcome dedup" -> recorded times
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if m.Name != "inbox.processing.duration" || !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				outcome, _ := dp.Attributes.Value("inbox.outcome")
				dedup, _ := dp.Attributes.Value("inbox.dedup")
				durations[outcome.AsString()+" "+dedup.AsString()] += dp.Count
			}
		}
	}
	wantDurations := map[string]uint64{"processed watermark": 2, "duplicate watermark": 2, "failed ": 1, "processed row": 1, "duplicate row": 1}
	if !maps.Equal(durations, wantDurations) {
		t.Errorf("inbox.processing.duration by outcome and inbox.dedup:\n got %v\nwant %v", durations, wantDurations)
	}
}

// While the write of the stored offset before a Kafka commit fails, the
// group commits only what is stored, so that the partition's next owner
// never finds the group ahead of the database; once the database answers,
// both move on.
func TestDuplicatesCommitOnlyWhatIsStored(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	var failing atomic.Bool
	err := s.db.Callback().Update().Before("gorm:update").Register("fail-offsets", func(db *gorm.DB) {
		if failing.Load() && db.Statement.Table == consumer.DefaultOffsetsTable {
			_ = db.AddError(errors.New("database briefly unavailable"))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	for i := range 4 {
		msgs = append(msgs, seqMessage(i, 0, 0, int64(i+1), 1))
	}
	produce(t, brokers, "orders", msgs...)
	ev, rec := newEvents(), newRecorder(t)
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Offsets.Store, cfg.Logger = true, slog.New(rec)
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "4 processed", func() bool { return ev.count(hooks.Processed) == 4 })
	waitUntil(t, 30*time.Second, "the group's commit of 4", func() bool { return committed(t, brokers, "inventory", "orders", 1)[0] == 4 })

	failing.Store(true)
	produce(t, brokers, "orders", msgs...)
	waitUntil(t, 30*time.Second, "4 duplicates", func() bool { return ev.count(hooks.Duplicate) == 4 })
	waitUntil(t, 30*time.Second, "a failed write of the stored offset, or a commit past it", func() bool {
		_, ok := rec.find(slog.LevelWarn, "cannot store the partition's offset before committing it")
		return ok || committed(t, brokers, "inventory", "orders", 1)[0] != 4
	})
	s.checkStoredAtGroup(t, brokers, 4)

	failing.Store(false)
	waitUntil(t, 30*time.Second, "the stored offset and the group's at 8", func() bool {
		return committed(t, brokers, "inventory", "orders", 1)[0] == 8 && storedOffset(t, s, "inventory", "orders", 0) == 8
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 4, nil)
}

// A number of an aligned stream taken by two events (a cloned producer
// database's relay racing the original's) is the first copy's: the second
// event is skipped with an ERROR that names both, in the same batch as the
// first copy or in a later one, and is applied once when its relay
// publishes it again under a new epoch.
func TestSequencedNumberTakenTwiceFirstCopyWins(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{10, 1} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			produce(t, brokers, "orders",
				seqMessage(0, 0, 0, 1, 1),
				seqMessage(1, 0, 0, 2, 1),
				seqMessage(2, 0, 0, 2, 1), // number 2 again, another event
				seqMessage(1, 0, 0, 2, 1), // a plain republication of the first copy
				seqMessage(3, 0, 0, 3, 1),
			)
			ev, rec := newEvents(), newRecorder(t)
			cfg := sequencedConfig(t, brokers, s, ev)
			cfg.Logger = slog.New(rec)
			cfg.BatchSize, cfg.BatchWait = batch, 200*time.Millisecond
			r := start(t, cfg)
			waitUntil(t, 30*time.Second, "5 messages", func() bool {
				return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 5
			})
			// The loser's relay publishes it again, in a new epoch.
			produce(t, brokers, "orders", seqMessageIn(2, 0, 2, 0, 1, 1))
			waitUntil(t, 30*time.Second, "6 messages", func() bool {
				return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 6
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, 4, nil)
			if d := ev.count(hooks.Duplicate); d != 2 {
				t.Errorf("%d duplicates, want 2", d)
			}
			const msg = "number of a sequenced stream names two events"
			if n := rec.count(slog.LevelError, msg); n != 1 {
				t.Fatalf("%d ERROR records about a number taken twice, want 1", n)
			}
			a, _ := rec.find(slog.LevelError, msg)
			if a["event_id"].String() != "evt-order-2" || a["first_event_id"].String() != "evt-order-1" || a["seq"].String() != "2" {
				t.Errorf("the ERROR names %v, want event evt-order-2 losing number 2 to evt-order-1", a)
			}
		})
	}
}
