package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// Relay modes of the latency benchmark.
const (
	// RelayPolling is the relay as it was before wake-ups: a cycle every
	// 100 ms when it finds less than a full batch, nothing else.
	RelayPolling = "polling"
	// RelayWakeups is the relay with wake-ups, made from the enqueuers'
	// Outbox: the in-process signal reaches it.
	RelayWakeups = "wakeups"
	// RelayWakeupsApart is the relay with wake-ups made from an Outbox of
	// its own over the same table, as in another process: only the
	// database's notifications (PostgreSQL) or its polls reach it.
	RelayWakeupsApart = "wakeups-apart"
)

// RelayModes are the relay modes, the reference first. A mode may name the
// Kafka client of its relay and consumers with a suffix (TransportMode):
// "wakeups@franz-go" publishes through franzgo.Publisher and consumes
// through franz-go; without one both are kafka-go.
var RelayModes = []string{RelayPolling, RelayWakeups, RelayWakeupsApart}

// latencyPublisher is what the latency benchmark's relay publishes with:
// an aligned outbox's relay needs the publisher to pin and to witness.
type latencyPublisher interface {
	outbox.PinningPublisher
	outbox.Witness
	outbox.Limited
}

// newLatencyPublisher makes the relay's publisher on the named client, and
// returns what closes it.
func newLatencyPublisher(client string, brokers []string) (latencyPublisher, func(), error) {
	if client == TransportFranzGo {
		p, err := franzgo.NewPublisher(franzgo.Options{Brokers: brokers})
		if err != nil {
			return nil, nil, err
		}
		return p, p.Close, nil
	}
	w := outbox.NewKafkaWriter(brokers...)
	kp, err := outbox.NewKafkaPublisher(w)
	if err != nil {
		_ = w.Close()
		return nil, nil, err
	}
	return kp, func() { _ = w.Close() }, nil
}

// RelayMinPoll, if not zero, is the MinPollInterval of the relays that
// wake up: the shortest time from the start of a cycle that published to
// the start of the next (5 ms by default), which trades the relay's
// statements per second for latency.
var RelayMinPoll time.Duration

// relayConfig is the relay configuration of mode.
func relayConfig(mode, id string) outbox.RelayConfig {
	cfg := outbox.RelayConfig{ID: id, MinPollInterval: RelayMinPoll}
	if mode == RelayPolling {
		cfg.NoWakeups, cfg.PollInterval, cfg.MinPollInterval = true, 100*time.Millisecond, 100*time.Millisecond
	}
	return cfg
}

// Load is the producers' schedule: Rate events per second, or Burst events
// at once every second.
type Load struct {
	Rate, Burst int
	Duration    time.Duration
}

func (l Load) String() string {
	if l.Burst > 0 {
		return fmt.Sprintf("bursts of %d every 1s", l.Burst)
	}
	return fmt.Sprintf("%d/s", l.Rate)
}

func (l Load) events() int {
	secs := int(l.Duration / time.Second)
	if l.Burst > 0 {
		return l.Burst * max(secs, 1)
	}
	return int(float64(l.Rate) * l.Duration.Seconds())
}

// due is when event i is to be enqueued, after the start.
func (l Load) due(i int) time.Duration {
	if l.Burst > 0 {
		return time.Duration(i/l.Burst) * time.Second
	}
	return time.Duration(float64(i) / float64(l.Rate) * float64(time.Second))
}

// Percentiles summarise latencies.
type Percentiles struct {
	N                   int
	P50, P99, P999, Max time.Duration
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return Percentiles{N: len(s), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: s[len(s)-1]}
}

// LatencyResult is one run: one backend, relay mode and load.
type LatencyResult struct {
	Backend, Mode string
	Load          Load
	Events        int
	Late          time.Duration // how far the producers fell behind their schedule at most
	Rate          float64       // the events per second the producers committed, first to last
	// Publish is commit to the broker's acknowledgement of the relay's
	// write; Rows and Sequenced are commit to the consumer's batch handler
	// (the effect, before its commit), deduplicating by inbox rows and by
	// sequence (watermarks).
	Publish, Rows, Sequenced Percentiles
	// Deliver is the broker's acknowledgement of the relay's write to the
	// batch handler (inbox rows): the consumer's share of Rows.
	Deliver Percentiles
	// Cycle is the relay's cycles that claimed something, Write their
	// writes to the broker (part of Cycle).
	Cycle, Write Percentiles
	// Claim is the relay's claims that found rows, Mark its marks of what
	// it published (each part of Cycle).
	Claim, Mark Percentiles
	// Busy is the share of the machine's CPUs busy while the producers
	// ran (everything on the machine: the database, the broker, this
	// process, anything else); 0 where /proc/stat cannot be read.
	Busy float64
	// PoolWaits is how many times a caller of the benchmark's connection
	// pool (producers, relay, consumers) waited for a connection while the
	// producers ran, and PoolWait how long those waits took together
	// (database/sql's DBStats): on a pool of one SQLite connection, the
	// queue every statement of the pipeline stands in.
	PoolWaits int64
	PoolWait  time.Duration
}

// Latency runs load once per relay mode on b: producers enqueue each event
// in a transaction of its own (db.Transaction) into an aligned outbox of
// partitions shards, a relay publishes them to a fresh topic, and two
// consumers (inbox rows; sequenced dedup, the outbox's source trusted)
// apply them with a batch handler of up to batch messages. Each latency is
// measured from the return of the event's commit.
func Latency(ctx context.Context, b *Backend, brokers []string, load Load, modes []string, partitions, batch int) ([]LatencyResult, error) {
	var out []LatencyResult
	for _, mode := range modes {
		r, err := latencyRun(ctx, b, brokers, load, mode, partitions, batch)
		if err != nil {
			return out, fmt.Errorf("bench: latency on %s, %s, %s: %w", b.Name, mode, load, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// latencyOutbox makes a fresh outbox store of shards shards on b and
// returns a function that drops its tables.
func latencyOutbox(ctx context.Context, b *Backend, shards int) (storage.OutboxStore, func(), error) {
	sfx := randomSuffix()
	table := "lat_ob_" + sfx
	db := b.DB.WithContext(context.WithoutCancel(ctx))
	switch b.Dialect {
	case Postgres:
		schema := "lat_" + sfx
		s, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Table: table, Shards: shards})
		return s, func() { db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`) }, err
	case MySQL:
		s, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Shards: shards})
		return s, func() {
			for _, t := range []string{table, table + "_shards", table + "_relay", table + "_source"} {
				db.Exec("DROP TABLE IF EXISTS `" + t + "`")
			}
		}, err
	default:
		s, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: table, Shards: shards})
		return s, func() {}, err
	}
}

// timedPublisher notes when the broker acknowledged each message.
type timedPublisher struct {
	latencyPublisher
	at func(msgs []kafka.Message, t time.Time, took time.Duration)
}

func (p timedPublisher) PublishPinned(ctx context.Context, msgs []kafka.Message, parts []int, n int) error {
	start := time.Now()
	err := p.latencyPublisher.PublishPinned(ctx, msgs, parts, n)
	if err == nil {
		now := time.Now()
		p.at(msgs, now, now.Sub(start))
	}
	return err
}

// durations collects durations from several goroutines.
type durations struct {
	mu sync.Mutex
	d  []time.Duration
}

func (d *durations) add(v time.Duration) {
	d.mu.Lock()
	d.d = append(d.d, v)
	d.mu.Unlock()
}

func (d *durations) percentiles() Percentiles {
	d.mu.Lock()
	defer d.mu.Unlock()
	return percentiles(d.d)
}

// stamps are the times of each event, in nanoseconds since start (0: not yet).
type stamps []atomic.Int64

func (s stamps) set(i int, start time.Time, t time.Time) {
	if i >= 0 && i < len(s) {
		s[i].CompareAndSwap(0, max(int64(t.Sub(start)), 1))
	}
}

func (s stamps) count() int {
	n := 0
	for i := range s {
		if s[i].Load() != 0 {
			n++
		}
	}
	return n
}

func since(commit, later stamps) Percentiles {
	d := make([]time.Duration, 0, len(commit))
	for i := range commit {
		c, l := commit[i].Load(), later[i].Load()
		if c != 0 && l != 0 {
			d = append(d, max(time.Duration(l-c), 0))
		}
	}
	return percentiles(d)
}

func latencyRun(ctx context.Context, b *Backend, brokers []string, load Load, mode string, partitions, batch int) (LatencyResult, error) {
	res := LatencyResult{Backend: b.Name, Mode: mode, Load: load}
	mode, client, _ := strings.Cut(mode, "@")
	newTransport, known := Transports[cmp.Or(client, TransportKafkaGo)]
	if !known {
		return res, fmt.Errorf("unknown Kafka client %q", client)
	}
	topic := "inbox-lat-" + randomSuffix()
	if err := createTopic(ctx, brokers, topic, partitions); err != nil {
		return res, err
	}
	// Deferred first, so run after the relay and consumers stopped.
	defer func() { _ = deleteTopic(context.WithoutCancel(ctx), brokers, topic) }()
	store, drop, err := latencyOutbox(ctx, b, partitions)
	if err != nil {
		return res, err
	}
	defer drop()
	var times relayTimes
	store = times.timed(store)
	var fixtures []*Fixture
	defer func() {
		for _, f := range fixtures {
			_ = f.Drop(context.WithoutCancel(ctx))
		}
	}()
	cfg := outbox.Config{AlignedTopic: topic, Logger: discardLogger}
	ob, err := outbox.New(b.DB, store, cfg)
	if err != nil {
		return res, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return res, err
	}
	if _, err := ob.Maintain(ctx); err != nil {
		return res, err
	}
	relayOb := ob
	if mode != RelayWakeups {
		if relayOb, err = outbox.New(b.DB, store, cfg); err != nil {
			return res, err
		}
	}
	source, _, err := store.(storage.Sequenced).Source(ctx, b.DB.WithContext(ctx))
	if err != nil {
		return res, err
	}

	// Event 0 is the warm-up: every part runs before the timed events.
	n := 1 + load.events()
	res.Events = n - 1
	commit, published, rows, seq := make(stamps, n), make(stamps, n), make(stamps, n), make(stamps, n)
	start := time.Now()
	indexOf := func(v []byte) int {
		i, err := strconv.Atoi(string(v))
		if err != nil {
			return -1
		}
		return i
	}

	kp, closePublisher, err := newLatencyPublisher(client, brokers)
	if err != nil {
		return res, err
	}
	defer closePublisher()
	var writes, cycles durations
	pub := timedPublisher{latencyPublisher: kp, at: func(msgs []kafka.Message, t time.Time, took time.Duration) {
		writes.add(took)
		for _, m := range msgs {
			published.set(indexOf(m.Value), start, t)
		}
	}}
	rcfg := relayConfig(mode, "lat-"+mode)
	rcfg.Hooks = []hooks.Hook{hooks.EventFunc(func(e hooks.Event) {
		if e.Kind == hooks.RelayCycle && e.Err == nil {
			cycles.add(e.Duration)
		}
	})}
	relay, err := relayOb.NewRelay(pub, rcfg)
	if err != nil {
		return res, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := relay.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("relay: %w", err)
		}
	}()
	defer wg.Wait()
	defer cancel()

	for _, path := range []struct {
		name  string
		at    stamps
		trust bool
	}{{"rows", rows, false}, {"sequenced", seq, true}} {
		f, err := NewFixture(ctx, b, 100, inbox.Config{}, 0)
		if err != nil {
			return res, err
		}
		fixtures = append(fixtures, f)
		at := path.at
		ccfg := consumer.Config{
			Brokers:  brokers,
			GroupID:  topic + "-" + path.name,
			Topics:   []string{topic},
			Inbox:    f.Inbox,
			Consumer: ConsumerName,
			BatchHandler: func(ctx context.Context, tx *gorm.DB, ms []consumer.Message) error {
				now := time.Now()
				skus := make([]int64, len(ms))
				for i, m := range ms {
					k := indexOf(m.Value)
					skus[i] = int64(max(k, 0) % f.SKUs)
					at.set(k, start, now)
				}
				return f.setEffect(tx, skus)
			},
			BatchSize: batch,
			Logger:    discardLogger,
		}
		if path.trust {
			ccfg.Sequenced.Sources = []string{source}
		}
		if newTransport != nil {
			if ccfg.Kafka.Transport, err = newTransport(brokers); err != nil {
				return res, err
			}
		}
		c, err := consumer.New(ccfg)
		if err != nil {
			return res, err
		}
		if err := c.Migrate(ctx); err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("consumer %s: %w", path.name, err)
			}
		}()
	}

	enqueue := func(i int) error {
		err := b.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: []byte(strconv.Itoa(i % 100)), Value: []byte(strconv.Itoa(i)),
				ID: "lat-" + strconv.Itoa(i)})
		})
		if err == nil {
			commit.set(i, start, time.Now())
		}
		return err
	}
	wait := func(done func() bool, limit time.Duration) error {
		deadline := time.Now().Add(limit)
		for !done() {
			select {
			case err := <-errs:
				return err
			case <-time.After(time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d published, %d applied through rows, %d sequenced, of %d, after %v",
					published.count(), rows.count(), seq.count(), n, limit)
			}
		}
		return nil
	}
	if err := enqueue(0); err != nil {
		return res, err
	}
	if err := wait(func() bool { return rows[0].Load() != 0 && seq[0].Load() != 0 }, 2*time.Minute); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}

	// The schedule: producers take the next event and enqueue it when it
	// is due, at once if late.
	const producers = 8
	var next atomic.Int64
	next.Store(1)
	var late atomic.Int64
	busy0, total0 := machineTicks()
	pool, err := b.DB.DB()
	if err != nil {
		return res, err
	}
	pool0 := pool.Stats()
	t0 := time.Now()
	var pwg sync.WaitGroup
	perr := make(chan error, producers)
	for range producers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				due := t0.Add(load.due(i - 1))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				} else if -d > time.Duration(late.Load()) {
					late.Store(int64(-d))
				}
				if err := enqueue(i); err != nil {
					perr <- err
					return
				}
			}
		}()
	}
	pwg.Wait()
	pool1 := pool.Stats()
	res.PoolWaits, res.PoolWait = pool1.WaitCount-pool0.WaitCount, pool1.WaitDuration-pool0.WaitDuration
	busy1, total1 := machineTicks()
	res.Busy = busyShare(busy0, total0, busy1, total1)
	select {
	case err := <-perr:
		return res, fmt.Errorf("enqueue: %w", err)
	default:
	}
	res.Late = time.Duration(late.Load())
	if err := wait(func() bool { return rows.count() == n && seq.count() == n }, 2*time.Minute); err != nil {
		return res, err
	}
	commit[0].Store(0) // the warm-up is not counted
	var lo, hi int64
	for i := 1; i < n; i++ {
		c := commit[i].Load()
		if lo == 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	if hi > lo {
		res.Rate = float64(n-2) / time.Duration(hi-lo).Seconds()
	}
	res.Publish, res.Rows, res.Sequenced = since(commit, published), since(commit, rows), since(commit, seq)
	res.Deliver = since(published, rows)
	res.Cycle, res.Write = cycles.percentiles(), writes.percentiles()
	res.Claim, res.Mark = times.claim.percentiles(), times.mark.percentiles()
	return res, nil
}

// IdleResult is what an idle relay sends to its database.
type IdleResult struct {
	Backend, Mode string
	PerSecond     float64
}

// IdleStatements runs a relay of mode over an empty outbox on b for
// settle, then counts the statements it sends during window (every
// statement GORM runs on b.DB: nothing else may use it meanwhile).
func IdleStatements(ctx context.Context, b *Backend, mode string, settle, window time.Duration) (IdleResult, error) {
	res := IdleResult{Backend: b.Name, Mode: mode}
	count, err := countStatements(b.DB)
	if err != nil {
		return res, err
	}
	store, drop, err := latencyOutbox(ctx, b, 8)
	if err != nil {
		return res, err
	}
	defer drop()
	ob, err := outbox.New(b.DB, store, outbox.Config{Logger: discardLogger})
	if err != nil {
		return res, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return res, err
	}
	relay, err := ob.NewRelay(noPublisher{}, relayConfig(mode, "idle-"+mode))
	if err != nil {
		return res, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	select {
	case <-time.After(settle):
	case err := <-done:
		cancel()
		return res, err
	}
	before := count.Load()
	time.Sleep(window)
	res.PerSecond = float64(count.Load()-before) / window.Seconds()
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return res, err
	}
	return res, nil
}

type noPublisher struct{}

func (noPublisher) Publish(context.Context, []kafka.Message) error {
	return errors.New("bench: the idle relay found a message")
}

var (
	countersMu sync.Mutex
	counters   = map[*gorm.Config]*atomic.Int64{}
)

// countStatements counts the statements GORM runs on db's configuration
// from now on (registered once per configuration).
func countStatements(db *gorm.DB) (*atomic.Int64, error) {
	countersMu.Lock()
	defer countersMu.Unlock()
	if c, ok := counters[db.Config]; ok {
		return c, nil
	}
	c := &atomic.Int64{}
	inc := func(*gorm.DB) { c.Add(1) }
	cb := db.Callback()
	for _, err := range []error{
		cb.Create().After("gorm:create").Register("bench:count", inc),
		cb.Query().After("gorm:query").Register("bench:count", inc),
		cb.Update().After("gorm:update").Register("bench:count", inc),
		cb.Delete().After("gorm:delete").Register("bench:count", inc),
		cb.Row().After("gorm:row").Register("bench:count", inc),
		cb.Raw().After("gorm:raw").Register("bench:count", inc),
	} {
		if err != nil {
			return nil, err
		}
	}
	counters[db.Config] = c
	return c, nil
}
