// Package outboxbench measures the outbox relay against producing the same
// events straight to Kafka, on any outbox Store. The adapters' benchmarks
// call it; the numbers go to docs/BENCHMARKS.md.
package outboxbench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// Options of a run.
type Options struct {
	Events     int // events per mode
	Keys       int // distinct keys
	ValueBytes int
	Partitions int // of each fresh topic
	Relays     int // relays draining at once
	Writers    int // enqueuing goroutines in the end-to-end mode
	PerTx      int // messages per enqueuing transaction
	Batch      int // messages per relay cycle and per direct write
}

// Defaults returns the options docs/BENCHMARKS.md reports.
func Defaults() Options {
	return Options{Events: 20000, Keys: 1000, ValueBytes: 200, Partitions: 8, Relays: 1, Writers: 4, PerTx: 1, Batch: 500}
}

// Metrics name Relay's results, in order, for b.ReportMetric.
var Metrics = []string{"enqueue-events/s", "drain-events/s", "e2e-events/s"}

// Result is one mode.
type Result struct {
	Mode    string
	Events  int
	Elapsed time.Duration
}

// EventsPerSec is the throughput.
func (r Result) EventsPerSec() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

func (r Result) String() string {
	return fmt.Sprintf("%-28s %6d events in %8v: %8.0f events/s", r.Mode, r.Events, r.Elapsed.Round(time.Millisecond), r.EventsPerSec())
}

func messages(topic string, o Options) []outbox.Message {
	value := make([]byte, o.ValueBytes)
	for i := range value {
		value[i] = 'x'
	}
	msgs := make([]outbox.Message, o.Events)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", i%o.Keys), Value: value}
	}
	return msgs
}

// Direct produces the events straight to a fresh topic with the relay's
// writer settings, Batch messages per synchronous write: the reference.
func Direct(ctx context.Context, brokers []string, o Options) (Result, error) {
	topic := fmt.Sprintf("outbox-bench-direct-%d", time.Now().UnixNano())
	if err := createTopic(ctx, brokers, topic, o.Partitions); err != nil {
		return Result{}, err
	}
	w := outbox.NewKafkaWriter(brokers...)
	defer w.Close()
	msgs := messages(topic, o)
	kms := make([]kafka.Message, len(msgs))
	at := time.Now().UTC().Format(time.RFC3339Nano)
	for i, m := range msgs {
		// The same headers the outbox adds.
		kms[i] = kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: []kafka.Header{
			{Key: header.EventID, Value: []byte(outbox.NewEventID(time.Now()))}, {Key: header.EventTime, Value: []byte(at)}}}
	}
	start := time.Now()
	for lo := 0; lo < len(kms); lo += o.Batch {
		if err := w.WriteMessages(ctx, kms[lo:min(lo+o.Batch, len(kms))]...); err != nil {
			return Result{}, err
		}
	}
	return Result{Mode: "direct to Kafka", Events: len(kms), Elapsed: time.Since(start)}, nil
}

// createTopic creates topic and waits until every partition has a leader:
// a write right after the creation can otherwise fail with "unknown topic
// or partition" on a busy broker, and neither side's timing should include
// the wait.
func createTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
		return err
	}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				ready = ready && p.Error == nil && p.Leader.Host != ""
			}
			if ready {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s not ready after 30 s (last error %v)", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// counting counts what the relays acknowledged.
type counting struct {
	mu     sync.Mutex
	n      int
	cycles int // that published something
	done   chan struct{}
	want   int
}

func (c *counting) event(ev hooks.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += ev.Relay.Published
	if ev.Relay.Published > 0 {
		c.cycles++
	}
	if c.n >= c.want && c.done != nil {
		close(c.done)
		c.done = nil
	}
}

// Relay measures two modes on store over db, each on a fresh topic: "relay
// drain" enqueues every event first (PerTx per transaction) and times the
// relays from start to the last acknowledgement; "enqueue to ack" runs
// Writers enqueuing goroutines and the relays together and times from the
// first enqueue to the last acknowledgement.
func Relay(ctx context.Context, db *gorm.DB, store storage.OutboxStore, brokers []string, o Options) ([]Result, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ob, err := outbox.New(db, store, outbox.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := ob.Maintain(ctx); err != nil {
		return nil, err
	}
	var results []Result
	for _, mode := range []string{"relay drain", "enqueue to ack"} {
		topic := fmt.Sprintf("outbox-bench-%d", time.Now().UnixNano())
		if err := createTopic(ctx, brokers, topic, o.Partitions); err != nil {
			return nil, err
		}
		msgs := messages(topic, o)
		enqueueAll := func(writers int) error { return enqueueAll(ctx, db, ob, store, msgs, writers, o.PerTx) }
		if mode == "relay drain" {
			start := time.Now()
			if err := enqueueAll(o.Writers); err != nil {
				return nil, err
			}
			results = append(results, Result{Mode: fmt.Sprintf("enqueue only (%d writers, %d/tx)", o.Writers, o.PerTx), Events: len(msgs), Elapsed: time.Since(start)})
		}
		c := &counting{done: make(chan struct{}), want: len(msgs)}
		done := c.done
		runCtx, stop := context.WithCancel(ctx)
		var relays sync.WaitGroup
		var writers []*kafka.Writer
		start := time.Now()
		for i := range o.Relays {
			w := outbox.NewKafkaWriter(brokers...)
			writers = append(writers, w)
			pub, err := outbox.NewKafkaPublisher(w)
			if err != nil {
				stop()
				return nil, err
			}
			r, err := ob.NewRelay(pub, outbox.RelayConfig{ID: fmt.Sprintf("bench-%d", i), MaxMessages: o.Batch, PollInterval: 5 * time.Millisecond, Hooks: []hooks.Hook{hooks.EventFunc(c.event)}})
			if err != nil {
				stop()
				return nil, err
			}
			relays.Go(func() { _ = r.Run(runCtx) })
		}
		var enqErr error
		if mode == "enqueue to ack" {
			enqErr = enqueueAll(o.Writers)
		}
		select {
		case <-done:
		case <-ctx.Done():
		}
		elapsed := time.Since(start)
		stop()
		relays.Wait()
		for _, w := range writers {
			_ = w.Close()
		}
		if enqErr != nil {
			return nil, enqErr
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		results = append(results, Result{Mode: fmt.Sprintf("%s (%d relay)", mode, o.Relays), Events: len(msgs), Elapsed: elapsed})
	}
	return results, nil
}

// enqueueAll enqueues msgs through ob from writers goroutines, perTx
// messages per transaction; writer w takes the transactions w, w+writers,
// ... in order.
func enqueueAll(ctx context.Context, db *gorm.DB, ob *outbox.Outbox, store storage.OutboxStore, msgs []outbox.Message, writers, perTx int) error {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for lo := w * perTx; lo < len(msgs); lo += writers * perTx {
				batch := msgs[lo:min(lo+perTx, len(msgs))]
				// A transient failure (SQLite's busy writer under
				// load) is retried, as an application does.
				for attempt := 1; ; attempt++ {
					err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return ob.Enqueue(ctx, tx, batch...) })
					if err == nil {
						break
					}
					if !store.IsRetryable(err) || attempt == 20 {
						errs <- err
						return
					}
					time.Sleep(time.Duration(attempt) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Bench measures, in Rounds rounds (INBOX_BENCH_ROUNDS, default 5), direct
// producing and the relay at each cycle size of INBOX_OUTBOX_BATCHES
// (default "500,1000"), every one on a fresh topic and, for the relay, a
// fresh store from open (cleaned up after). The order alternates: forward in
// even rounds, reversed in odd ones, so that neither side always runs on a
// warmer (or busier) box. Figures go to stderr (a benchmark's b.Log is
// truncated). Each relay mode's events/s is divided by the same
// round's direct figure; it reports, per mode, the median events/s and the
// median ratio with its spread (min..max) over the rounds. INBOX_OUTBOX_EVENTS
// (default 20000) sets the events per mode.
//
// Direct writes in batches of the largest cycle size measured (at most the
// writer's limit), so that the reference is the best the same writer does.
//
// INBOX_OUTBOX_SUITES (default "relay,aligned") picks what runs: "relay"
// is the above, "aligned" is AlignedBench with the same events and rounds,
// run first. open(shards) returns a store of that many shards, of the
// store's default for 0.
func Bench(b *testing.B, brokers []string, open func(shards int) (db *gorm.DB, store storage.OutboxStore, cleanup func(), err error)) {
	o := Defaults()
	o.Events = envInt("INBOX_OUTBOX_EVENTS", o.Events)
	rounds := envInt("INBOX_BENCH_ROUNDS", 5)
	suites := map[string]bool{}
	for _, f := range strings.Split(cmp.Or(os.Getenv("INBOX_OUTBOX_SUITES"), "relay,aligned"), ",") {
		f = strings.TrimSpace(f)
		if f != "relay" && f != "aligned" {
			b.Fatalf("INBOX_OUTBOX_SUITES %q: want relay, aligned or both", f)
		}
		suites[f] = true
	}
	var batches []int
	for _, f := range strings.Split(cmp.Or(os.Getenv("INBOX_OUTBOX_BATCHES"), "500,1000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if max := outbox.NewKafkaWriter().BatchSize; err != nil || n < 1 || n > max {
			b.Fatalf("INBOX_OUTBOX_BATCHES %q: want cycle sizes 1..%d (the relay's writer's batch)", f, max)
		}
		batches = append(batches, n)
	}
	for b.Loop() {
		if suites["aligned"] {
			AlignedBench(b, brokers, open, o, rounds)
		}
		if !suites["relay"] {
			continue
		}
		// series[name] holds one figure per round: events/s, or the ratio.
		rate, ratio, vs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		var names []string
		note := func(name string, v, ref float64) {
			if _, ok := rate[name]; !ok {
				names = append(names, name)
			}
			rate[name] = append(rate[name], v)
			ratio[name] = append(ratio[name], v/ref)
		}
		for round := range rounds {
			steps := make([]int, 0, len(batches)+1) // -1: direct; else an index into batches
			steps = append(steps, -1)
			for i := range batches {
				steps = append(steps, i)
			}
			if round%2 == 1 {
				slices.Reverse(steps)
			}
			var direct float64
			relays := map[int][]Result{}
			for _, step := range steps {
				if step < 0 {
					do := o
					do.Batch = slices.Max(batches)
					r, err := Direct(b.Context(), brokers, do)
					if err != nil {
						b.Fatal(err)
					}
					direct = r.EventsPerSec()
					continue
				}
				db, store, cleanup, err := open(0)
				if err != nil {
					if cleanup != nil {
						cleanup()
					}
					b.Fatal(err)
				}
				ro := o
				ro.Batch = batches[step]
				res, err := Relay(b.Context(), db, store, brokers, ro)
				cleanup()
				if err != nil {
					b.Fatal(err)
				}
				relays[step] = res
			}
			note("direct", direct, direct)
			for i, batch := range batches {
				for j, r := range relays[i] {
					note(fmt.Sprintf("%s, cycles of %d", r.Mode, batch), r.EventsPerSec(), direct)
					if i > 0 {
						// The same mode at the first cycle size, same round.
						vs[fmt.Sprintf("%s, cycles of %d vs %d", r.Mode, batch, batches[0])] = append(
							vs[fmt.Sprintf("%s, cycles of %d vs %d", r.Mode, batch, batches[0])], r.EventsPerSec()/relays[0][j].EventsPerSec())
					}
					fmt.Fprintf(os.Stderr, "round %d: %v (%.2fx direct %.0f/s), cycles of %d\n", round+1, r, r.EventsPerSec()/direct, direct, batch)
				}
			}
			fmt.Fprintf(os.Stderr, "round %d/%d done (order %v; -1 is direct)\n", round+1, rounds, steps)
		}
		for _, name := range names {
			med, lo, hi := spread(ratio[name])
			fmt.Fprintf(os.Stderr, "%-58s %8.0f events/s (median of %d rounds); %.2fx direct (%.2f..%.2f)\n", name, median(rate[name]), rounds, med, lo, hi)
		}
		for _, name := range slices.Sorted(maps.Keys(vs)) {
			med, lo, hi := spread(vs[name])
			fmt.Fprintf(os.Stderr, "%-58s %.2fx (%.2f..%.2f) over %d rounds\n", name, med, lo, hi, rounds)
		}
		for i, batch := range batches {
			for j, metric := range Metrics {
				// Results come in the order of Metrics: enqueue only, drain, enqueue to ack.
				name := names[1+i*len(Metrics)+j]
				med, _, _ := spread(ratio[name])
				b.ReportMetric(median(rate[name]), fmt.Sprintf("%s@%d", metric, batch))
				b.ReportMetric(med, fmt.Sprintf("%s-x-direct@%d", strings.TrimSuffix(metric, "-events/s"), batch))
			}
		}
		b.ReportMetric(median(rate["direct"]), "direct-events/s")
	}
}

func median(v []float64) float64 {
	m, _, _ := spread(v)
	return m
}

// spread returns the median, min and max of v.
func spread(v []float64) (med, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med, s[0], s[len(s)-1]
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
