package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/transport/memtransport"
)

func TestOffsetTrackerOutOfOrder(t *testing.T) {
	tr := newOffsetTracker(10)
	if next, ok := tr.committable(); !ok || next != 10 {
		t.Fatalf("initial committable = %d, %v; want 10", next, ok)
	}
	// Offsets 10..14 and, after a compaction gap, 17 and 18.
	for _, off := range []int64{10, 11, 12, 13, 14, 17, 18} {
		if err := tr.fetched(off); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		done int64
		want int64
	}{
		{12, 10}, // 10 and 11 still running
		{14, 10},
		{11, 10},
		{10, 13}, // 10..12 contiguous; 13 holds back 14
		{18, 13},
		{13, 15}, // 13, 14 done: next is 15 (gap up to 17)
		{17, 19},
	}
	for _, s := range steps {
		if err := tr.markDone(s.done); err != nil {
			t.Fatal(err)
		}
		if next, _ := tr.committable(); next != s.want {
			t.Fatalf("after %d done: committable %d, want %d", s.done, next, s.want)
		}
	}
	if tr.inFlight() != 0 {
		t.Fatalf("in flight %d, want 0", tr.inFlight())
	}
	if err := tr.markDone(17); err == nil {
		t.Fatal("completing an offset twice was accepted")
	}
	if err := tr.fetched(18); err == nil {
		t.Fatal("fetching below the committable offset was accepted")
	}
}

func TestOffsetTrackerSentinelStart(t *testing.T) {
	tr := newOffsetTracker(kafka.FirstOffset)
	if _, ok := tr.committable(); ok {
		t.Fatal("a sentinel start must not be committable")
	}
	for _, off := range []int64{5, 6} {
		if err := tr.fetched(off); err != nil {
			t.Fatal(err)
		}
	}
	if next, ok := tr.committable(); !ok || next != 5 {
		t.Fatalf("committable = %d, %v; want 5", next, ok)
	}
	_ = tr.markDone(6)
	if next, _ := tr.committable(); next != 5 {
		t.Fatalf("committable %d with 5 unfinished, want 5", next)
	}
	_ = tr.markDone(5)
	if next, _ := tr.committable(); next != 7 {
		t.Fatalf("committable %d, want 7", next)
	}
}

func hdrs(kv ...string) []kafka.Header {
	var hs []kafka.Header
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

func TestHeaderExtractor(t *testing.T) {
	at := "2026-11-29T10:00:00.5+01:00"
	want := time.Date(2026, 11, 29, 9, 0, 0, 5e8, time.UTC)
	cases := []struct {
		name    string
		headers []kafka.Header
		id      string
		err     error
	}{
		{"event headers", hdrs("event_id", "e1", "event_time", at), "e1", nil},
		{"cloudevents binary", hdrs("ce_id", "c1", "ce_time", at, "ce_type", "OrderCreated"), "c1", nil},
		{"event_id wins over ce_id", hdrs("ce_id", "c1", "event_id", "e1", "ce_time", at), "e1", nil},
		{"repeated same value", hdrs("event_id", "e1", "event_id", "e1", "event_time", at), "e1", nil},
		{"repeated different values", hdrs("event_id", "e1", "event_id", "e2", "event_time", at), "", ErrNoEventID},
		{"no id", hdrs("event_time", at), "", ErrNoEventID},
		{"empty id", hdrs("event_id", "", "event_time", at), "", ErrNoEventID},
		{"no time", hdrs("event_id", "e1"), "", ErrNoEventTime},
		{"bad time", hdrs("event_id", "e1", "event_time", "yesterday"), "", ErrNoEventTime},
		{"no headers", nil, "", ErrNoEventID},
	}
	ex := HeaderExtractor(nil, nil)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, got, err := extract(ex, &kafka.Message{Headers: c.headers})
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			if err != nil || id != c.id || !got.Equal(want) {
				t.Fatalf("got %q %v %v, want %q %v", id, got, err, c.id, want)
			}
		})
	}
}

func TestCustomAndFallbackExtractors(t *testing.T) {
	m := &kafka.Message{Topic: "orders", Partition: 3, Offset: 88121, Time: time.Unix(1700000000, 0)}
	id, at, err := extract(ProvenanceExtractor(), m)
	if err != nil || id != "orders/3/88121" || !at.Equal(m.Time) {
		t.Fatalf("provenance: %q %v %v", id, at, err)
	}
	if _, _, err := extract(ProvenanceExtractor(), &kafka.Message{Topic: "t"}); !errors.Is(err, ErrNoEventTime) {
		t.Fatalf("provenance without timestamp: %v", err)
	}
	panicky := func(*kafka.Message) (string, time.Time, error) { panic("boom") }
	if _, _, err := extract(panicky, m); !errors.Is(err, ErrNoEventID) {
		t.Fatalf("panicking extractor: %v", err)
	}
	plainErr := func(*kafka.Message) (string, time.Time, error) { return "", time.Time{}, errors.New("bad json") }
	if _, _, err := extract(plainErr, m); !errors.Is(err, ErrNoEventID) {
		t.Fatalf("extractor error not classified as a missing id: %v", err)
	}
	zeroTime := func(*kafka.Message) (string, time.Time, error) { return "x", time.Time{}, nil }
	if _, _, err := extract(zeroTime, m); !errors.Is(err, ErrNoEventTime) {
		t.Fatalf("zero time: %v", err)
	}
}

func TestDeadLetterHeaders(t *testing.T) {
	orig := &Message{
		Message: kafka.Message{Topic: "orders", Partition: 2, Offset: 41, Key: []byte("k"), Value: []byte("v"),
			Headers: hdrs("event_id", "e1", "trace", "t1"), Time: time.Unix(1700000000, 0)},
		EventID: "e1", EventTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	now := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	dl := deadLetter("orders.dlq", orig, ReasonHandlerError, 5, errors.New("sku unknown"), "inventory", "reserve-stock", now)
	if dl.Topic != "orders.dlq" || string(dl.Key) != "k" || string(dl.Value) != "v" || !dl.Time.Equal(orig.Time) {
		t.Fatalf("dead letter lost the original: %+v", dl)
	}
	if len(dl.Headers) < 2 || dl.Headers[0].Key != "event_id" || dl.Headers[1].Key != "trace" {
		t.Fatalf("original headers not kept first: %v", dl.Headers)
	}
	want := map[string]string{
		header.DLQError: "sku unknown", header.DLQReason: ReasonHandlerError, header.DLQTopic: "orders",
		header.DLQPartition: "2", header.DLQOffset: "41", header.DLQGroup: "inventory", header.DLQConsumer: "reserve-stock",
		header.DLQAttempts: "5", header.DLQTime: "2026-11-30T01:02:03Z", header.DLQEventID: "e1",
		header.DLQEventTime: "2026-01-02T03:04:05Z",
	}
	got := map[string]string{}
	for _, h := range dl.Headers[2:] {
		got[h.Key] = string(h.Value)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
	// The original's header slice is not aliased.
	if len(orig.Headers) != 2 {
		t.Fatal("deadLetter modified the original headers")
	}
}

// A dead letter carries no live sequence headers: they are renamed, their
// values kept, so that a copy of it put back on the topic takes its inbox
// row.
func TestDeadLetterRenamesSequenceHeaders(t *testing.T) {
	live := []string{header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq, header.SeqPartitions,
		header.CloudEventsSeqSource, header.CloudEventsSeqEpoch, header.CloudEventsSeqShard, header.CloudEventsSequence, header.CloudEventsSeqPartitions}
	var kv []string
	for i, k := range live {
		kv = append(kv, k, "v"+strconv.Itoa(i))
	}
	orig := &Message{Message: kafka.Message{Topic: "orders", Headers: hdrs(append(kv, "event_id", "e1")...)}, EventID: "e1"}
	dl := deadLetter("orders.dlq", orig, ReasonHandlerError, 5, errors.New("x"), "g", "c", time.Now())
	got := map[string]string{}
	for _, h := range dl.Headers {
		got[h.Key] = string(h.Value)
	}
	for i, k := range live {
		if v, ok := got[k]; ok {
			t.Errorf("the dead letter carries the live sequence header %s=%q", k, v)
		}
		if v := got["dlq_"+k]; v != "v"+strconv.Itoa(i) {
			t.Errorf("header dlq_%s = %q, want %q", k, v, "v"+strconv.Itoa(i))
		}
	}
	if got["event_id"] != "e1" {
		t.Errorf("event_id = %q, want it kept", got["event_id"])
	}
	if p, _, err := readSequence(&dl, map[string]bool{"v0": true, "v5": true}); p != nil || err != nil {
		t.Errorf("the dead letter read as a sequenced message: %+v, %v", p, err)
	}
	if orig.Headers[0].Key != header.SeqSource {
		t.Fatal("deadLetter modified the original headers")
	}
}

func TestConfigValidation(t *testing.T) {
	ib := &inbox.Inbox{}
	ok := Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"}, Inbox: ib, Consumer: "c",
		Handler: func(context.Context, *gorm.DB, Message) error { return nil }}
	if _, err := New(ok); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	// Brokers are the default client's: a Transport needs none.
	withTransport := ok
	withTransport.Brokers, withTransport.Kafka.Transport = nil, memtransport.NewCluster().Client(memtransport.Eager)
	if c, err := New(withTransport); err != nil {
		t.Fatalf("a config with a Transport and no Brokers rejected: %v", err)
	} else if c.client != withTransport.Kafka.Transport {
		t.Errorf("the consumer's client is %T, not the Transport given", c.client)
	}
	cases := map[string]func(*Config){
		"no brokers":            func(c *Config) { c.Brokers = nil },
		"no group":              func(c *Config) { c.GroupID = "" },
		"no topics":             func(c *Config) { c.Topics = nil },
		"no handler":            func(c *Config) { c.Handler = nil },
		"no inbox":              func(c *Config) { c.Inbox = nil },
		"no consumer name":      func(c *Config) { c.Consumer = "" },
		"dead letter, no topic": func(c *Config) { c.Failure.Policy = DeadLetter },
		"dlq is a source topic": func(c *Config) { c.Failure.Policy = DeadLetter; c.Failure.DeadLetterTopic = "t" },
		"unknown policy":        func(c *Config) { c.Failure.Policy = 7 },
		"bad start offset":      func(c *Config) { c.Kafka.StartOffset = 42 },
		"bad offsets table":     func(c *Config) { c.Offsets.Table = "x; DROP TABLE y" },
		"negative batch":        func(c *Config) { c.BatchSize = -1 },
		"idempotent, no db":     func(c *Config) { c.Inbox = nil; c.NaturallyIdempotent = true },
		"idempotent, no classifier": func(c *Config) {
			c.Inbox, c.DB, c.NaturallyIdempotent = nil, &gorm.DB{}, true
		},
		"topic listed twice": func(c *Config) { c.Topics = []string{"t", "u", "t"} },
		"stall bound below the database timeout": func(c *Config) {
			c.Timeouts.Database, c.Timeouts.ProcessingStall = time.Minute, 30*time.Second
		},
		"stall bound below the default database timeout": func(c *Config) { c.Timeouts.ProcessingStall = 10 * time.Second },
		"stall bound below the handler timeout": func(c *Config) {
			c.Timeouts.Handler, c.Timeouts.ProcessingStall = 5*time.Minute, 4*time.Minute
		},
		"dlq writer has a topic": func(c *Config) {
			c.Failure.Policy, c.Failure.DeadLetterTopic = DeadLetter, "t.dlq"
			c.Failure.DeadLetterWriter = &kafka.Writer{Addr: kafka.TCP("127.0.0.1:9092"), Topic: "t.dlq"}
		},
	}
	for name, mutate := range cases {
		cfg := ok
		mutate(&cfg)
		_, err := New(cfg)
		if !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		} else if !strings.Contains(err.Error(), "consumer:") && name != "bad offsets table" {
			t.Errorf("%s: unclear error %v", name, err)
		}
	}
}

// A hook that implements no hook interface would do nothing: New refuses
// it, naming its type.
func TestConfigRefusesNonHooks(t *testing.T) {
	ok := Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"}, Inbox: &inbox.Inbox{}, Consumer: "c",
		Handler: func(context.Context, *gorm.DB, Message) error { return nil }}
	for _, h := range []hooks.Hook{"not a hook", 42, func(context.Context, *Message) context.Context { return nil }} {
		cfg := ok
		cfg.Hooks = []hooks.Hook{ContextFunc(func(ctx context.Context, _ *Message) context.Context { return ctx }), h}
		_, err := New(cfg)
		if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), fmt.Sprintf("consumer.Config.Hooks[1] is a %T", h)) {
			t.Errorf("%#v: New = %v, want ErrInvalidConfig naming the hook", h, err)
		}
	}
}

// An empty topic name is one problem, reported once: without a dead-letter
// topic it is not "also the dead-letter topic".
func TestConfigEmptyTopic(t *testing.T) {
	cfg := Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t", "", ""}, Inbox: &inbox.Inbox{}, Consumer: "c",
		Handler: func(context.Context, *gorm.DB, Message) error { return nil }}
	_, err := New(cfg)
	if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "empty topic name") {
		t.Fatalf("New = %v, want ErrInvalidConfig for the empty topic name", err)
	}
	if strings.Count(err.Error(), "topic") != 1 {
		t.Errorf("New = %q, want the empty topic name alone, once", err)
	}
}

// The database's bounds: Timeouts.Database defaults to 30 s; the stall bound
// defaults to 2 minutes, or to what a batch of slow handlers may take; a
// negative value turns either off.
func TestDatabaseBoundsDefaults(t *testing.T) {
	ib := &inbox.Inbox{}
	base := Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"}, Inbox: ib, Consumer: "c",
		Handler: func(context.Context, *gorm.DB, Message) error { return nil }}
	for _, tc := range []struct {
		name             string
		mutate           func(*Config)
		dbTimeout, stall time.Duration
		bound            bool
	}{
		{"defaults", func(*Config) {}, defaultDatabaseTimeout, defaultMaxProcessingStall, true},
		{"slow batches", func(c *Config) { c.BatchSize, c.Timeouts.Handler = 10, 30*time.Second }, defaultDatabaseTimeout, 6 * time.Minute, true},
		{"explicit", func(c *Config) { c.Timeouts.Database, c.Timeouts.ProcessingStall = 2*time.Second, 8*time.Second }, 2 * time.Second, 8 * time.Second, true},
		{"off", func(c *Config) { c.Timeouts.Database, c.Timeouts.ProcessingStall = -1, -1 }, -1, -1, false},
	} {
		cfg := base
		tc.mutate(&cfg)
		c, err := New(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.cfg.Timeouts.Database != tc.dbTimeout || c.cfg.Timeouts.ProcessingStall != tc.stall {
			t.Errorf("%s: DatabaseTimeout %v, MaxProcessingStall %v; want %v, %v", tc.name, c.cfg.Timeouts.Database, c.cfg.Timeouts.ProcessingStall, tc.dbTimeout, tc.stall)
		}
		if got := c.bound() > 0; got != tc.bound {
			t.Errorf("%s: bounded %v, want %v", tc.name, got, tc.bound)
		}
	}
}

// The watchdog picks the worker that waited longest for the database, only
// once it waited longer than the bound; a worker whose database answered
// is not stalled.
func TestStalledWorker(t *testing.T) {
	c := &Consumer{workers: map[*worker]struct{}{}, holders: map[topicPartition]*worker{}}
	idle, slow, stuck := &worker{part: &part{partition: 0}, done: make(chan struct{})}, &worker{part: &part{partition: 1}, done: make(chan struct{})}, &worker{part: &part{partition: 2}, done: make(chan struct{})}
	for _, w := range []*worker{idle, slow, stuck} {
		c.addWorker(w)
	}
	now := time.Now()
	slow.waitingSince.Store(now.Add(-2 * time.Second).UnixNano())
	stuck.waitingSince.Store(now.Add(-time.Minute).UnixNano())
	if w, _ := c.stalled(2 * time.Minute); w != nil {
		t.Fatalf("partition %d reported stalled below the bound", w.partition)
	}
	if w, d := c.stalled(30 * time.Second); w != stuck || d < time.Minute {
		t.Fatalf("stalled() = %v, %v; want partition 2 after a minute", w, d)
	}
	stuck.endDB()
	if w, _ := c.stalled(time.Second); w != slow {
		t.Fatalf("stalled() = %v, want partition 1", w)
	}
	slow.beginDB() // already waiting: the clock keeps its start
	if d := slow.stalledFor(time.Now()); d < 2*time.Second {
		t.Fatalf("beginDB restarted a running clock: %v", d)
	}
	c.removeWorker(slow)
	if w, _ := c.stalled(time.Second); w != nil {
		t.Fatalf("a removed worker is still watched: %d", w.partition)
	}
}

// The tracker against a plain model, over many fetches and completions in
// random order, so that its slices are reset, compacted and grown.
func TestOffsetTrackerModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tr := newOffsetTracker(0)
	var fetched []int64 // in order
	done := map[int64]bool{}
	next, off := int64(0), int64(0)
	for step := range 20000 {
		if rng.IntN(3) > 0 && len(fetched)-len(done) < 300 {
			off += 1 + int64(rng.IntN(2)) // gaps, as compaction leaves
			if err := tr.fetched(off); err != nil {
				t.Fatal(err)
			}
			fetched = append(fetched, off)
		} else {
			var open []int64
			for _, o := range fetched {
				if !done[o] {
					open = append(open, o)
				}
			}
			if len(open) == 0 {
				continue
			}
			o := open[rng.IntN(min(len(open), 8))] // mostly the oldest
			if err := tr.markDone(o); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			done[o] = true
			for len(fetched) > 0 && done[fetched[0]] {
				next = fetched[0] + 1
				delete(done, fetched[0])
				fetched = fetched[1:]
			}
		}
		if got, _ := tr.committable(); got != next {
			t.Fatalf("step %d: committable %d, want %d", step, got, next)
		}
		if tr.inFlight() != len(fetched) {
			t.Fatalf("step %d: in flight %d, want %d", step, tr.inFlight(), len(fetched))
		}
	}
}
