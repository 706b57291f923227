package outboxbench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// EnqueueVariant is an outbox setting whose enqueuing cost EnqueueBench
// measures.
type EnqueueVariant struct {
	Name    string
	Shards  int
	Aligned bool // Config.AlignedTopic set: shards by murmur2 of the key
}

// EnqueueVariants are the variants of EnqueueBench, the reference first:
// the default outbox, an aligned one with the shards of an 8-partition
// topic, and an aligned one with the default's shard count (what the hash
// alone costs).
var EnqueueVariants = []EnqueueVariant{
	{Name: "default, 64 shards", Shards: 64},
	{Name: "aligned, 8 shards", Shards: 8, Aligned: true},
	{Name: "aligned, 64 shards", Shards: 64, Aligned: true},
}

// Enqueue times o.Writers goroutines enqueuing o.Events messages over
// o.Keys keys taken at random, o.PerTx per transaction, into store over db, an outbox of v
// (store must have v.Shards shards). It needs no broker.
func Enqueue(ctx context.Context, db *gorm.DB, store storage.OutboxStore, v EnqueueVariant, o Options) (Result, error) {
	const topic = "outbox-bench-enqueue"
	cfg := outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if v.Aligned {
		cfg.AlignedTopic = topic
	}
	ob, err := outbox.New(db, store, cfg)
	if err != nil {
		return Result{}, err
	}
	if shards := shardsOf(store); v.Aligned && shards != v.Shards {
		return Result{}, fmt.Errorf("outboxbench: variant %q wants %d shards, the store has %d", v.Name, v.Shards, shards)
	}
	if err := ob.Migrate(ctx); err != nil {
		return Result{}, err
	}
	if _, err := ob.Maintain(ctx); err != nil {
		return Result{}, err
	}
	msgs := messages(topic, o)
	// Keys at random (the same sequence for every variant): consecutive
	// keys such as key-120..key-129 land on neighbouring FNV shards, which
	// would spare the default outbox the collisions an application's keys
	// cause.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range msgs {
		msgs[i].Key = fmt.Appendf(nil, "key-%d", rng.IntN(o.Keys))
	}
	start := time.Now()
	if err := enqueueAll(ctx, db, ob, store, msgs, o.Writers, o.PerTx); err != nil {
		return Result{}, err
	}
	return Result{Mode: fmt.Sprintf("%s, %d/tx", v.Name, o.PerTx), Events: len(msgs), Elapsed: time.Since(start)}, nil
}

// EnqueueBench measures what aligned shards cost the enqueuers: in
// INBOX_BENCH_ROUNDS rounds (default 5) it runs every EnqueueVariant at
// each size of INBOX_OUTBOX_PER_TX (messages per transaction, default
// "1,10"), INBOX_BENCH_EVENTS events (default 8000, over 1000 keys) from 8
// goroutines, each on a fresh store from open (cleaned up after). The order
// alternates: forward in even rounds, reversed in odd ones. Each variant's
// events/s is divided by the same round's reference (EnqueueVariants[0]) at
// the same size; it prints to stderr, per variant and size, the median
// events/s and the median ratio with its spread (min..max).
func EnqueueBench(b *testing.B, open func(shards int) (db *gorm.DB, store storage.OutboxStore, cleanup func(), err error)) {
	o := Defaults()
	o.Events = envInt("INBOX_BENCH_EVENTS", 8000)
	o.Writers = 8
	rounds := envInt("INBOX_BENCH_ROUNDS", 5)
	var sizes []int
	for _, f := range strings.Split(cmp.Or(os.Getenv("INBOX_OUTBOX_PER_TX"), "1,10"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("INBOX_OUTBOX_PER_TX %q: want messages per transaction, 1 or more", f)
		}
		sizes = append(sizes, n)
	}
	type step struct{ variant, size int }
	var steps []step
	for _, size := range sizes {
		for v := range EnqueueVariants {
			steps = append(steps, step{v, size})
		}
	}
	for b.Loop() {
		rate := map[step][]float64{}
		ratio := map[step][]float64{}
		for round := range rounds {
			order, direction := slices.Clone(steps), "forward"
			if round%2 == 1 {
				slices.Reverse(order)
				direction = "reversed"
			}
			got := map[step]float64{}
			for _, st := range order {
				v := EnqueueVariants[st.variant]
				db, store, cleanup, err := open(v.Shards)
				if err != nil {
					if cleanup != nil {
						cleanup()
					}
					b.Fatal(err)
				}
				eo := o
				eo.PerTx = st.size
				r, err := Enqueue(b.Context(), db, store, v, eo)
				cleanup()
				if err != nil {
					b.Fatal(err)
				}
				got[st] = r.EventsPerSec()
				fmt.Fprintf(os.Stderr, "round %d: %v\n", round+1, r)
			}
			for _, st := range steps {
				rate[st] = append(rate[st], got[st])
				ratio[st] = append(ratio[st], got[st]/got[step{0, st.size}])
			}
			fmt.Fprintf(os.Stderr, "round %d/%d done (%s)\n", round+1, rounds, direction)
		}
		for _, st := range steps {
			v := EnqueueVariants[st.variant]
			med, lo, hi := spread(ratio[st])
			fmt.Fprintf(os.Stderr, "%-24s %3d/tx, %d writers: %7.0f events/s (median of %d rounds); %.2fx %s (%.2f..%.2f)\n",
				v.Name, st.size, o.Writers, median(rate[st]), rounds, med, EnqueueVariants[0].Name, lo, hi)
			unit := strings.NewReplacer(",", "", " ", "-").Replace(v.Name)
			b.ReportMetric(median(rate[st]), fmt.Sprintf("%s-events/s@%d", unit, st.size))
			if st.variant > 0 {
				b.ReportMetric(med, fmt.Sprintf("%s-x-ref@%d", unit, st.size))
			}
		}
	}
}

// shardsOf is store's shard count, 0 if it has none.
func shardsOf(store storage.OutboxStore) int {
	if s, ok := store.(storage.Sharded); ok {
		return s.Shards()
	}
	return 0
}
