package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/txn"
)

// Options are the settings every variant of one comparison shares.
type Options struct {
	Events    int // events per variant
	Workers   int // concurrent workers (each runs one operation at a time)
	BatchSize int // events per ProcessBatch call in variant (c)
	SKUs      int // rows of the stock table
	Rounds    int // runs per variant; the median by throughput is reported
}

// DefaultOptions are the settings of `make bench` and dev/cmd/inbox-bench.
var DefaultOptions = Options{Events: 20000, Workers: 8, BatchSize: 100, SKUs: 1000, Rounds: 1}

func (o Options) withDefaults() Options {
	if o.Events <= 0 {
		o.Events = DefaultOptions.Events
	}
	if o.Workers <= 0 {
		o.Workers = DefaultOptions.Workers
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultOptions.BatchSize
	}
	if o.SKUs <= 0 {
		o.SKUs = DefaultOptions.SKUs
	}
	if o.Rounds <= 0 {
		o.Rounds = 1
	}
	return o
}

// Op is one timed operation: one event, or one batch.
type Op struct {
	Start time.Duration // since the run started
	Dur   time.Duration
}

// Result is one run of one variant.
type Result struct {
	Backend string
	Variant Variant
	Events  int   // events offered
	Applied int64 // effects applied
	Ops     []Op  `json:"-"`
	Elapsed time.Duration
	Workers int
	Batch   int // events per operation
	// Replay is how long a dedup variant took to run the same events a
	// second time, all of them duplicates (zero for the others): a fast
	// path that makes duplicates slow shows here.
	Replay time.Duration
	// ClientCPU and ServerCPU are the CPU time this process and the
	// database server used during the run (see cpuMeter; zero when not
	// measured).
	ClientCPU, ServerCPU time.Duration
}

// CPUPerEvent is the client's and the server's CPU time per event.
func (r Result) CPUPerEvent() (client, server time.Duration) {
	if r.Events == 0 {
		return 0, 0
	}
	return r.ClientCPU / time.Duration(r.Events), r.ServerCPU / time.Duration(r.Events)
}

// ReplayPerSec is the throughput of the replay (duplicates per second), or
// zero for a variant without dedup.
func (r Result) ReplayPerSec() float64 {
	if r.Replay <= 0 {
		return 0
	}
	return float64(r.Events) / r.Replay.Seconds()
}

// EventsPerSec is the throughput.
func (r Result) EventsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

// Latency returns the q-quantile (0..1) of the operations' durations, of
// those starting in [from, to) if to > 0.
func (r Result) Latency(q float64) time.Duration { return quantile(r.Ops, q, 0, 0) }

func quantile(ops []Op, q float64, from, to time.Duration) time.Duration {
	ds := make([]time.Duration, 0, len(ops))
	for _, o := range ops {
		if to > 0 && (o.Start+o.Dur < from || o.Start >= to) {
			continue
		}
		ds = append(ds, o.Dur)
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// Apply runs v over evs with workers concurrent workers, batch events per
// operation when v is batched, and times it. Like the partitions of a topic
// keyed by sku, each worker owns the events of its skus and applies them in
// order (see Partition): no two workers update the same stock row, so a
// batch never deadlocks with another.
func Apply(ctx context.Context, f *Fixture, v Variant, evs []Event, workers, batch int) (Result, error) {
	if !v.Batched {
		batch = 1
	}
	res := Result{Backend: f.Backend.Name, Variant: v, Events: len(evs), Workers: workers, Batch: batch}
	if err := warm(ctx, f.Backend, workers); err != nil {
		return res, err
	}
	parts := Partition(evs, workers)
	f.wm.mu.Lock()
	f.wm.streams = workers
	f.wm.mu.Unlock()
	var applied atomic.Int64
	ops := make([][]Op, workers)
	errs := make([]error, workers)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	cpu0 := readCPU()
	start := time.Now()
	for w, part := range parts {
		wg.Go(func() {
			for lo := 0; lo < len(part) && ctx.Err() == nil; lo += batch {
				t0 := time.Now()
				n, err := v.apply(ctx, f, part[lo:min(lo+batch, len(part))])
				ops[w] = append(ops[w], Op{Start: t0.Sub(start), Dur: time.Since(t0)})
				applied.Add(int64(n))
				if err != nil {
					errs[w] = fmt.Errorf("bench: %s on %s: %w", v.Key, f.Backend.Name, err)
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	cpu1 := readCPU()
	res.ClientCPU, res.ServerCPU = cpu1.client-cpu0.client, cpu1.server-cpu0.server
	res.Applied = applied.Load()
	res.Ops = slices.Concat(ops...)
	for _, err := range errs {
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// Partition splits evs into n streams by sku, keeping their order.
func Partition(evs []Event, n int) [][]Event {
	parts := make([][]Event, n)
	for _, e := range evs {
		p := int(e.SKU % int64(n))
		parts[p] = append(parts[p], e)
	}
	return parts
}

// warm opens the pool's connections before the clock starts, so no variant
// pays for connecting.
func warm(ctx context.Context, b *Backend, n int) error {
	sqlDB, err := b.DB.DB()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			c, err := sqlDB.Conn(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = c.PingContext(ctx)
			time.Sleep(10 * time.Millisecond) // hold it, so the others open their own
			_ = c.Close()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Compare runs every variant in vs on b with the same options, each on
// fresh tables, and returns their results (the median round of each).
// Rounds alternate the order of the variants, so drift in the machine's
// load does not always favour the same one.
func Compare(ctx context.Context, b *Backend, vs []Variant, o Options) ([]Result, error) {
	o = o.withDefaults()
	evs := Events(o.Events, o.SKUs)
	rounds := make([][]Result, len(vs))
	for r := range o.Rounds {
		order := make([]int, len(vs))
		for i := range order {
			order[i] = i
		}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			res, err := runFresh(ctx, b, vs[i], evs, o)
			if err != nil {
				return nil, err
			}
			rounds[i] = append(rounds[i], res)
		}
	}
	out := make([]Result, len(vs))
	for i, rs := range rounds {
		out[i] = Median(rs)
	}
	return out, nil
}

// Median returns the result with the median throughput.
func Median(rs []Result) Result {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Result) int {
		x, y := a.EventsPerSec(), b.EventsPerSec()
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return rs[len(rs)/2]
}

func runFresh(ctx context.Context, b *Backend, v Variant, evs []Event, o Options) (Result, error) {
	f, err := NewFixture(ctx, b, o.SKUs, inbox.Config{}, 0)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = f.Drop(context.WithoutCancel(ctx)) }()
	if v.Untracked {
		if err := Untrack(b.DB); err != nil {
			return Result{}, err
		}
		defer func() { _ = txn.TrackStatements(b.DB) }()
	}
	res, err := Apply(ctx, f, v, evs, o.Workers, o.BatchSize)
	if err != nil {
		return res, err
	}
	if res.Applied != int64(len(evs)) && !v.Idempotent {
		return res, fmt.Errorf("bench: %s on %s applied %d effects for %d events", v.Key, b.Name, res.Applied, len(evs))
	}
	if v.Dedup {
		replay, err := Apply(ctx, f, v, evs, o.Workers, o.BatchSize)
		if err != nil {
			return res, err
		}
		if replay.Applied != 0 {
			return res, fmt.Errorf("bench: %s on %s applied %d effects on a replay, want none", v.Key, b.Name, replay.Applied)
		}
		res.Replay = replay.Elapsed
	}
	return res, nil
}

// Untrack removes the callbacks txn.TrackStatements registers, by their
// names, until TrackStatements registers them again.
func Untrack(db *gorm.DB) error {
	cb := db.Callback()
	for _, name := range []string{"inbox:before_statement", "inbox:after_statement"} {
		for _, err := range []error{cb.Create().Remove(name), cb.Query().Remove(name), cb.Update().Remove(name),
			cb.Delete().Remove(name), cb.Row().Remove(name), cb.Raw().Remove(name)} {
			if err != nil {
				return fmt.Errorf("bench: remove callback %s: %w", name, err)
			}
		}
	}
	if cb.Raw().Get("inbox:before_statement") != nil {
		return fmt.Errorf("bench: the statement-tracking callbacks are still registered")
	}
	return nil
}
