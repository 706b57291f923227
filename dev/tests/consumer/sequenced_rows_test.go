package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/watermark"
	"github.com/inboxgo/inbox/storage"
)

// A dead letter carries its sequence headers renamed, so a redrive that
// copies it back onto the source topic as it is (what redrive tools do)
// takes the inbox row path: the original was dead-lettered and the
// watermark moved past it, so on the watermark path the copy would be a
// duplicate and never applied. Real Kafka, every database.
func TestSequencedRedriveByPlainCopyIsAppliedOnce(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t)
			topic := "seq-redrive-" + be.name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			dlq := topic + ".dlq"
			createTopic(t, brokers, topic, 1)
			createTopic(t, brokers, dlq, 1)
			var msgs []kafka.Message
			for i := range 5 {
				msgs = append(msgs, seqMessage(i, 0, 0, int64(i+1), 1))
			}
			produce(t, brokers, topic, msgs...)
			ev := newEvents()
			cfg := baseConfig(t, brokers, topic, "redrive-"+topic, s, ev)
			cfg.Sequenced.Sources = []string{testSource}
			cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, dlq, 2
			var fixed atomic.Bool
			cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
				if string(msg.Key) == "order-2" && !fixed.Load() {
					return errors.New("sku-2 is not sold here")
				}
				return s.reserve(ctx, tx, msg)
			}
			r := start(t, cfg)
			waitUntil(t, 60*time.Second, "4 processed and 1 dead letter", func() bool {
				return ev.count(hooks.Processed) == 4 && ev.count(hooks.DeadLettered) == 1
			})

			dl := readAll(t, brokers, dlq, 1, 1)[0]
			got := map[string]string{}
			for _, h := range dl.Headers {
				got[h.Key] = string(h.Value)
			}
			for _, k := range []string{header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq, header.SeqPartitions} {
				if v, live := got[k]; live {
					t.Errorf("the dead letter carries the live sequence header %s=%q", k, v)
				}
			}
			if got["dlq_"+header.SeqSource] != testSource || got["dlq_"+header.Seq] != "3" || got["dlq_"+header.SeqPartitions] != "1" {
				t.Errorf("the dead letter's renamed sequence headers are not kept for inspection: %v", got)
			}

			// The handler is fixed; the dead letter is copied back as it is,
			// and the stream goes on.
			fixed.Store(true)
			produce(t, brokers, topic, kafka.Message{Partition: 0, Key: dl.Key, Value: dl.Value, Headers: dl.Headers},
				seqMessage(5, 0, 0, 6, 1))
			waitUntil(t, 60*time.Second, "the copy and order-5 decided", func() bool {
				return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 6
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, 6, nil)
			if d := ev.count(hooks.Duplicate); d != 0 {
				t.Errorf("%d duplicates, want none (the redriven copy taken for a duplicate?)", d)
			}
			for _, e := range ev.filter(hooks.Processed) {
				if e.EventID == "evt-order-2" && e.Sequenced {
					t.Errorf("the redriven copy was deduplicated by the watermark, want its inbox row: %+v", e)
				}
			}
			if got := s.watermarksOf(t, topic)[0][testSource+"/1"]; got[0] != 6 {
				t.Errorf("watermark %v, want shard 0 at 6", got)
			}
		})
	}
}

// A trusted source whose shards are not aligned with the topic's
// partitions (no partitions header) can hand its numbers out again after a
// producer's database is restored, and nothing witnesses it: its messages
// take their inbox rows, a redelivery is a duplicate by its row, and a
// reused number with a new event id is applied. A watermark the stream
// kept before is no longer consulted. The consumer says so once, at Warn.
func TestSequencedUnalignedSourceTakesInboxRows(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders")
	s := newSQLiteShop(t)
	ev, rec := newEvents(), newRecorder(t)
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Logger = slog.New(rec)
	cfg.BatchSize, cfg.BatchWait = 5, 200*time.Millisecond
	c, err := newConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A watermark of the stream from before: seq 10 applied in shard 0 of
	// partition 0.
	ws := s.ib.Store().(storage.WatermarkStore)
	err = ws.SaveWatermarks(context.Background(), s.db, []storage.WatermarkWrite{{
		WatermarkKey: storage.WatermarkKey{Scope: "reserve-stock", Source: testSource, Epoch: 1, Topic: "orders", Partition: 0},
		New:          watermark.Encode(watermark.Applied{0: 10})}})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	seq := map[int32]int64{}
	for i := range 8 {
		shard := int32(i % 3) // shards spread over both partitions
		seq[shard]++
		msgs = append(msgs, seqMessage(i, i%2, shard, seq[shard], 0))
	}
	produce(t, brokers, "orders", msgs...)
	produce(t, brokers, "orders", msgs...) // republications
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "16 messages", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 16
	})
	// The producer's database restored: new events get numbers already
	// published (shard 0's 1 and 2, shard 1's 1) with new event ids.
	produce(t, brokers, "orders", seqMessage(8, 0, 0, 1, 0), seqMessage(9, 1, 0, 2, 0), seqMessage(10, 0, 1, 1, 0))
	waitUntil(t, 30*time.Second, "19 messages", func() bool {
		return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) == 19
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 11, nil)
	if d := ev.count(hooks.Duplicate); d != 8 {
		t.Errorf("%d duplicates, want 8 (the republications)", d)
	}
	for _, e := range append(ev.filter(hooks.Processed), ev.filter(hooks.Duplicate)...) {
		if e.Sequenced {
			t.Errorf("an unaligned stream's message deduplicated by a watermark: %+v", e)
		}
	}
	if n := s.inboxRows(t); n != 11 {
		t.Errorf("%d inbox rows, want 11 (one per event)", n)
	}
	if got := s.watermarks(t)[0][testSource+"/1"]; len(got) != 1 || got[0] != 10 {
		t.Errorf("the earlier watermark is %v, want it left as it was ({0: 10})", got)
	}
	warned := rec.count(slog.LevelWarn, "trusted source is not aligned")
	if warned != 1 {
		t.Errorf("%d warnings of the unaligned trusted source, want 1", warned)
	}
	if a, ok := rec.find(slog.LevelWarn, "trusted source is not aligned"); ok && a["source"].String() != testSource {
		t.Errorf("the warning names source %q, want %q", a["source"], testSource)
	}
}

// Sequence headers of a well-formed source id that is not in
// Sequenced.Sources (a typo in the list, or a source not listed yet) take
// the inbox row, and the consumer says so once per source, at Info.
func TestSequencedUntrustedSourceIsLoggedOnce(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 2, "orders")
	s := newSQLiteShop(t)
	const mistyped = "0123456789abcdef0123456789abcdeg"
	from := func(src string, n, partition int) kafka.Message {
		m := seqMessage(n, partition, int32(partition), int64(n/2+1), 2)
		for i := range m.Headers {
			if m.Headers[i].Key == header.SeqSource {
				m.Headers[i].Value = []byte(src)
			}
		}
		return m
	}
	var msgs []kafka.Message
	for i := range 6 {
		msgs = append(msgs, from(mistyped, i, i%2))
	}
	msgs = append(msgs, from("not a source id!", 6, 0), from("not a source id!", 7, 1))
	produce(t, brokers, "orders", msgs...)
	ev, rec := newEvents(), newRecorder(t)
	cfg := sequencedConfig(t, brokers, s, ev)
	cfg.Logger = slog.New(rec)
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "8 processed", func() bool { return ev.count(hooks.Processed) == 8 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	s.checkExactlyOnce(t, 8, nil)
	if n := s.inboxRows(t); n != 8 {
		t.Errorf("%d inbox rows, want 8", n)
	}
	const msg = "not in Sequenced.Sources"
	if n := rec.count(slog.LevelInfo, msg); n != 1 {
		t.Errorf("%d Info records about an untrusted source, want 1 (once per source)", n)
	}
	if a, ok := rec.find(slog.LevelInfo, msg); ok && a["source"].String() != mistyped {
		t.Errorf("the Info names source %q, want %q", a["source"], mistyped)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, r := range *rec.recs {
		if strings.Contains(r.Message, "not a source id") {
			t.Errorf("a malformed source id was logged: %q", r.Message)
		}
		r.Attrs(func(a slog.Attr) bool {
			if strings.Contains(a.Value.String(), "not a source id") {
				t.Errorf("a malformed source id was logged: %s=%q", a.Key, a.Value)
			}
			return true
		})
	}
}

// count returns how many records at level have a message containing substr.
func (r *recorder) count(level slog.Level, substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range *r.recs {
		if rec.Level == level && strings.Contains(rec.Message, substr) {
			n++
		}
	}
	return n
}
