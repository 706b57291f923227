package outboxbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// DrainVariant is a relay setting whose drain AlignedBench measures.
type DrainVariant struct {
	Name string
	// Aligned sets Config.AlignedTopic to the fresh topic: shards by
	// murmur2, pinned partitions and, with sequence headers, the witness.
	Aligned bool
	// NoSequenceHeaders sets Config.NoSequenceHeaders: no stamps, and no
	// witness. outbox.New refuses it with Aligned.
	NoSequenceHeaders bool
	// LocalWitness answers the witness's end-offset requests from the
	// counts the relay's own publishes add (the topic is fresh and nothing
	// else writes to it): the witness's bookkeeping without its
	// ListOffsets round trips.
	LocalWitness bool
}

// DrainVariants are the variants of AlignedBench, the one measured first:
// an aligned outbox whose relay stamps sequence headers and checks the
// partitions (the default), the same with the witness answered locally,
// and, since an aligned outbox needs sequence headers, the same 8 shards
// not aligned, with the stamps and without them.
var DrainVariants = []DrainVariant{
	{Name: "aligned, witness", Aligned: true},
	{Name: "aligned, local witness", Aligned: true, LocalWitness: true},
	{Name: "not aligned, stamped"},
	{Name: "not aligned, no headers", NoSequenceHeaders: true},
}

// AlignedShards is the shard count of AlignedBench's outboxes and the
// partition count of its topics.
const AlignedShards = 8

// Drain fills store over db (a store of o.Partitions shards, fresh) with
// o.Events messages for a fresh topic of o.Partitions partitions through an
// outbox of v, then times one relay (cycles of o.Batch) from its start to
// the acknowledgement of the last message. An aligned relay that stamps
// sequence headers publishes through a KafkaPublisher that counts and
// times the witness's end-offset requests (Witnessed).
func Drain(ctx context.Context, db *gorm.DB, store storage.OutboxStore, brokers []string, v DrainVariant, o Options) (Result, Witnessed, error) {
	topic := fmt.Sprintf("outbox-bench-aligned-%d", time.Now().UnixNano())
	if err := createTopic(ctx, brokers, topic, o.Partitions); err != nil {
		return Result{}, Witnessed{}, err
	}
	cfg := outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoSequenceHeaders: v.NoSequenceHeaders}
	if v.Aligned {
		cfg.AlignedTopic = topic
	}
	ob, err := outbox.New(db, store, cfg)
	if err != nil {
		return Result{}, Witnessed{}, err
	}
	if shards := shardsOf(store); v.Aligned && shards != o.Partitions {
		return Result{}, Witnessed{}, fmt.Errorf("outboxbench: variant %q wants %d shards, the store has %d", v.Name, o.Partitions, shards)
	}
	if err := ob.Migrate(ctx); err != nil {
		return Result{}, Witnessed{}, err
	}
	if _, err := ob.Maintain(ctx); err != nil {
		return Result{}, Witnessed{}, err
	}
	msgs := messages(topic, o)
	// Filled in large transactions: the filling is not timed.
	if err := enqueueAll(ctx, db, ob, store, msgs, o.Writers, 100); err != nil {
		return Result{}, Witnessed{}, err
	}
	w := outbox.NewKafkaWriter(brokers...)
	defer w.Close()
	kp, err := outbox.NewKafkaPublisher(w)
	if err != nil {
		return Result{}, Witnessed{}, err
	}
	var pub outbox.Publisher = kp
	wit := &witnessing{KafkaPublisher: kp, local: v.LocalWitness, ends: map[int]int64{}}
	if v.Aligned && !v.NoSequenceHeaders {
		pub = wit
	}
	c := &counting{done: make(chan struct{}), want: len(msgs)}
	done := c.done
	r, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "bench-aligned", MaxMessages: o.Batch, PollInterval: 5 * time.Millisecond, Hooks: []hooks.Hook{hooks.EventFunc(c.event)}})
	if err != nil {
		return Result{}, Witnessed{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	start := time.Now()
	go func() { ended <- r.Run(runCtx) }()
	select {
	case <-done:
	case err := <-ended:
		return Result{}, Witnessed{}, fmt.Errorf("outboxbench: the relay of %q stopped before the last acknowledgement: %v", v.Name, err)
	case <-ctx.Done():
		return Result{}, Witnessed{}, ctx.Err()
	}
	elapsed := time.Since(start)
	stop()
	if err := <-ended; err != nil && !errors.Is(err, context.Canceled) {
		return Result{}, Witnessed{}, fmt.Errorf("outboxbench: the relay of %q: %w", v.Name, err)
	}
	c.mu.Lock()
	cycles := c.cycles
	c.mu.Unlock()
	wit.mu.Lock()
	defer wit.mu.Unlock()
	if v.LocalWitness && wit.broker {
		return Result{}, Witnessed{}, fmt.Errorf("outboxbench: a publish of %q failed, and its witness asked the broker", v.Name)
	}
	return Result{Mode: v.Name, Events: len(msgs), Elapsed: elapsed}, Witnessed{Cycles: cycles, Requests: wit.requests, Waited: wit.waited}, nil
}

// Witnessed is what a drain's relay did: its cycles that published, and
// the end-offset requests it sent to the broker and the time it waited
// for their answers.
type Witnessed struct {
	Cycles, Requests int
	Waited           time.Duration
}

// witnessing is the KafkaPublisher of an aligned relay that checks the
// partitions. It counts and times the end-offset requests; with local set
// it answers them from the counts of its own acknowledged publishes to the
// fresh topic until a publish fails (then it asks the broker, as a
// KafkaPublisher does).
type witnessing struct {
	*outbox.KafkaPublisher
	local bool

	mu       sync.Mutex
	ends     map[int]int64
	broker   bool // a publish failed: the counts may be short
	requests int
	waited   time.Duration
}

func (p *witnessing) PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error {
	err := p.KafkaPublisher.PublishPinned(ctx, msgs, partitions, count)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.broker = true
		return err
	}
	for _, pt := range partitions {
		p.ends[pt]++
	}
	return nil
}

func (p *witnessing) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	p.mu.Lock()
	if p.local && !p.broker {
		out := make(map[int]int64, len(partitions))
		for _, pt := range partitions {
			out[pt] = p.ends[pt]
		}
		p.mu.Unlock()
		return out, nil
	}
	p.mu.Unlock()
	start := time.Now()
	out, err := p.KafkaPublisher.EndOffsets(ctx, topic, partitions)
	p.mu.Lock()
	p.requests++
	p.waited += time.Since(start)
	p.mu.Unlock()
	return out, err
}

// AlignedBench measures what checking the partitions costs the relay of an
// aligned outbox: in rounds rounds it drains o.Events events (over o.Keys
// keys, cycles of o.Batch) through each DrainVariant, each on a fresh
// store of AlignedShards shards from open (cleaned up after) and a fresh
// topic of as many partitions. The order alternates: forward in even
// rounds, reversed in odd ones. It prints to stderr, per variant, the
// median drain events/s and the median of the per-round ratios of the
// first variant to it, with their spread (min..max), and for the first the
// share of its drain time the relay spent waiting for end offsets (a
// cycle's steps run one after the other), and reports them as metrics.
func AlignedBench(b *testing.B, brokers []string, open func(shards int) (db *gorm.DB, store storage.OutboxStore, cleanup func(), err error), o Options, rounds int) {
	o.Partitions = AlignedShards
	cycles, requests := make([]int, len(DrainVariants)), make([]int, len(DrainVariants))
	waited := make([]time.Duration, len(DrainVariants))
	share := make([][]float64, len(DrainVariants)) // of the drain's time spent waiting for end offsets
	rate := make([][]float64, len(DrainVariants))
	ratio := make([][]float64, len(DrainVariants))
	for round := range rounds {
		order, direction := make([]int, len(DrainVariants)), "forward"
		for i := range order {
			order[i] = i
		}
		if round%2 == 1 {
			slices.Reverse(order)
			direction = "reversed"
		}
		got := make([]float64, len(DrainVariants))
		for _, i := range order {
			db, store, cleanup, err := open(AlignedShards)
			if err != nil {
				if cleanup != nil {
					cleanup()
				}
				b.Fatal(err)
			}
			r, w, err := Drain(b.Context(), db, store, brokers, DrainVariants[i], o)
			cleanup()
			if err != nil {
				b.Fatal(err)
			}
			got[i] = r.EventsPerSec()
			cycles[i] += w.Cycles
			if w.Requests > 0 {
				share[i] = append(share[i], w.Waited.Seconds()/r.Elapsed.Seconds())
			}
			requests[i] += w.Requests
			waited[i] += w.Waited
			fmt.Fprintf(os.Stderr, "round %d: %v; %d cycles, %d end-offset requests to the broker (%v)\n",
				round+1, r, w.Cycles, w.Requests, w.Waited.Round(time.Millisecond))
		}
		for i := range DrainVariants {
			rate[i] = append(rate[i], got[i])
			ratio[i] = append(ratio[i], got[0]/got[i])
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done (%s)\n", round+1, rounds, direction)
	}
	for i, v := range DrainVariants {
		unit := strings.NewReplacer(",", "", " ", "-").Replace(v.Name)
		b.ReportMetric(median(rate[i]), fmt.Sprintf("drain-%s-events/s", unit))
		if i == 0 {
			fmt.Fprintf(os.Stderr, "%-26s %d shards: %7.0f drain events/s (median of %d rounds)\n", v.Name, AlignedShards, median(rate[i]), rounds)
			if cycles[i] > 0 && requests[i] > 0 {
				perReq := waited[i] / time.Duration(requests[i])
				med, lo, hi := spread(share[i])
				fmt.Fprintf(os.Stderr, "%-26s %.1f cycles per round, %.2f end-offset requests per cycle, %v each; %.1f%% of the drain (%.1f..%.1f)\n",
					v.Name, float64(cycles[i])/float64(rounds), float64(requests[i])/float64(cycles[i]), perReq.Round(time.Microsecond), 100*med, 100*lo, 100*hi)
				b.ReportMetric(float64(perReq.Microseconds()), "end-offsets-µs/request")
				b.ReportMetric(100*med, "end-offsets-%-of-drain")
			}
			continue
		}
		med, lo, hi := spread(ratio[i])
		fmt.Fprintf(os.Stderr, "%-26s %d shards: %7.0f drain events/s (median of %d rounds); %s at %.2fx of it (%.2f..%.2f)\n",
			v.Name, AlignedShards, median(rate[i]), rounds, DrainVariants[0].Name, med, lo, hi)
		b.ReportMetric(med, fmt.Sprintf("drain-witness-x-%s", unit))
	}
}

var _ outbox.Witness = (*witnessing)(nil)
