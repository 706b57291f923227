package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/transport"
)

// RollingConfig is one rolling restart of a consumer group under a steady
// load: Members consumers over a topic of Partitions partitions, each
// replaced in turn (closed, then a new member started), Settle apart.
type RollingConfig struct {
	Members, Partitions int
	// Rate is the events produced per second, throughout.
	Rate int
	// Settle is how long the group runs before the first restart and
	// after each new member has every partition it will get.
	Settle time.Duration
	// Transport makes each member's Kafka client (consumer.Config.Kafka.Transport);
	// nil is the consumer's default, kafka-go. Name names it in the result.
	Transport func(brokers []string) (transport.Client, error)
	Name      string
}

// RollingResult is what a rolling restart did to the partitions' progress.
type RollingResult struct {
	Transport string
	// Steps is the number of members replaced, Events the events
	// produced (each applied once: RollingRestart checks it).
	Steps, Events int
	// KeptPause is the longest a partition whose owner stayed the same
	// through a step went without an effect during that step; Kept is how
	// many (partition, step) pairs that was. MovedPause is the same for
	// the partitions that moved to another member.
	KeptPause, MovedPause time.Duration
	Kept, Moved           int
	// SteadyPause is the longest a partition went without an effect in a
	// stretch of Settle with no restart: the load's own gaps, the floor of
	// the two pauses above.
	SteadyPause time.Duration
}

// effectAt is one committed effect: which member applied which partition's
// message when.
type effectAt struct {
	member    int
	partition int
	at        time.Time
}

// RollingRestart runs cfg on b against the brokers and returns the pauses
// it saw. It fails if an event was lost or effectAt twice.
func RollingRestart(ctx context.Context, b *Backend, brokers []string, cfg RollingConfig) (RollingResult, error) {
	res := RollingResult{Transport: cmpName(cfg.Name), Steps: cfg.Members}
	const skus = 1000
	f, err := NewFixture(ctx, b, skus, inbox.Config{}, 0)
	if err != nil {
		return res, err
	}
	defer func() { _ = f.Drop(context.WithoutCancel(ctx)) }()
	topic := "bench-rolling-" + f.Suffix
	if err := createTopic(ctx, brokers, topic, cfg.Partitions); err != nil {
		return res, err
	}

	var (
		mu      sync.Mutex
		effects []effectAt
	)
	newMember := func(id int) (*consumer.Consumer, error) {
		c := consumer.Config{
			Brokers:  brokers,
			GroupID:  topic,
			Topics:   []string{topic},
			Inbox:    f.Inbox,
			Consumer: ConsumerName,
			Handler: func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
				sku, err := strconv.ParseInt(string(m.Key), 10, 64)
				if err != nil {
					return err
				}
				return f.effect(tx, sku)
			},
			// A rolling deploy's members leave and join at once: a short
			// session lets a member that died be noticed, as in production
			// settings tuned for deploys.
			Kafka: consumer.KafkaConfig{
				SessionTimeout:    6 * time.Second,
				HeartbeatInterval: time.Second,
				RebalanceTimeout:  10 * time.Second,
			},
			Logger: discardLogger,
			Hooks: []hooks.Hook{hooks.EventFunc(func(e hooks.Event) {
				if e.Kind != hooks.Processed {
					return
				}
				now := time.Now()
				mu.Lock()
				effects = append(effects, effectAt{member: id, partition: e.Partition, at: now})
				mu.Unlock()
			})},
		}
		if cfg.Transport != nil {
			tr, err := cfg.Transport(brokers)
			if err != nil {
				return nil, err
			}
			c.Kafka.Transport = tr
		}
		return consumer.New(c)
	}

	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	go func() { prodErr <- produceAtRate(prodCtx, brokers, topic, cfg.Partitions, skus, cfg.Rate, &produced) }()

	type running struct {
		c    *consumer.Consumer
		done chan error
	}
	start := func(id int) (running, error) {
		c, err := newMember(id)
		if err != nil {
			return running{}, err
		}
		if err := c.Migrate(ctx); err != nil {
			return running{}, err
		}
		r := running{c: c, done: make(chan error, 1)}
		go func() { r.done <- c.Run(ctx) }()
		return r, nil
	}
	stop := func(r running) error {
		if err := r.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	members := make([]running, cfg.Members)
	defer func() {
		for _, r := range members {
			if r.c != nil {
				_ = stop(r)
			}
		}
	}()
	for i := range members {
		if members[i], err = start(i); err != nil {
			return res, err
		}
	}
	// owners returns each partition's member in the effects after since.
	owners := func(since time.Time) map[int]int {
		mu.Lock()
		defer mu.Unlock()
		o := map[int]int{}
		for _, e := range effects {
			if !e.at.Before(since) {
				o[e.partition] = e.member
			}
		}
		return o
	}
	// stopped returns the error of a member whose Run returned, or of the
	// producer.
	stopped := func() error {
		select {
		case err := <-prodErr:
			return fmt.Errorf("bench: rolling restart on %s: producing: %w", b.Name, err)
		default:
		}
		for i, r := range members {
			select {
			case err := <-r.done:
				return fmt.Errorf("bench: rolling restart on %s: member %d stopped: %w", b.Name, i, err)
			default:
			}
		}
		return nil
	}
	// settled waits until every partition had an effect after since, and
	// then Settle more.
	settled := func(since time.Time) error {
		deadline := time.Now().Add(2 * time.Minute)
		for len(owners(since)) < cfg.Partitions {
			if err := stopped(); err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("bench: rolling restart on %s: %d of %d partitions progressed in 2 minutes", b.Name, len(owners(since)), cfg.Partitions)
			}
			if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
		return backoff.Sleep(ctx, cfg.Settle)
	}
	if err := settled(time.Now()); err != nil {
		return res, err
	}
	// The reference: the longest gap of a partition in a stretch of the
	// same length without any restart.
	steadyEnd := time.Now()
	if err := backoff.Sleep(ctx, cfg.Settle); err != nil {
		return res, err
	}
	for p := range cfg.Partitions {
		res.SteadyPause = max(res.SteadyPause, longestGap(effectsOf(&mu, effects, p), steadyEnd, time.Now()))
	}
	next := cfg.Members
	for step := range cfg.Members {
		before := owners(time.Now().Add(-cfg.Settle / 2))
		stepStart := time.Now()
		if err := stop(members[step]); err != nil {
			return res, err
		}
		if members[step], err = start(next); err != nil {
			return res, err
		}
		next++
		// The step lasts until the new member effectAt something and every
		// partition progressed since, then Settle.
		for {
			o := owners(stepStart)
			if slices.Contains(slices.Collect(maps.Values(o)), next-1) {
				break
			}
			if err := stopped(); err != nil {
				return res, err
			}
			if time.Since(stepStart) > 2*time.Minute {
				return res, fmt.Errorf("bench: rolling restart on %s: the new member effectAt nothing in 2 minutes", b.Name)
			}
			if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil {
				return res, err
			}
		}
		if err := settled(time.Now()); err != nil {
			return res, err
		}
		stepEnd := time.Now()
		after := owners(stepEnd.Add(-cfg.Settle / 2))
		for p := range cfg.Partitions {
			pause := longestGap(effectsOf(&mu, effects, p), stepStart, stepEnd)
			if before[p] == after[p] {
				res.Kept++
				res.KeptPause = max(res.KeptPause, pause)
			} else {
				res.Moved++
				res.MovedPause = max(res.MovedPause, pause)
			}
		}
	}
	stopProducing()
	if err := <-prodErr; err != nil && !errors.Is(err, context.Canceled) {
		return res, err
	}
	res.Events = int(produced.Load())
	deadline := time.Now().Add(2 * time.Minute)
	for {
		reserved, err := f.Reserved(ctx)
		if err != nil {
			return res, err
		}
		if reserved == int64(res.Events) {
			break
		}
		if reserved > int64(res.Events) || time.Now().After(deadline) {
			return res, fmt.Errorf("bench: rolling restart on %s: %d effects for %d events produced", b.Name, reserved, res.Events)
		}
		if err := backoff.Sleep(ctx, 100*time.Millisecond); err != nil {
			return res, err
		}
	}
	return res, nil
}

func cmpName(name string) string {
	if name == "" {
		return "kafka-go"
	}
	return name
}

// effectsOf returns the times partition p had an effect, in order.
func effectsOf(mu *sync.Mutex, effects []effectAt, p int) []time.Time {
	mu.Lock()
	defer mu.Unlock()
	var ts []time.Time
	for _, e := range effects {
		if e.partition == p {
			ts = append(ts, e.at)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// longestGap is the longest time in [from, to] without an effect in ts,
// counting from the last effect before from.
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	prev := from
	for _, t := range ts {
		if t.Before(from) {
			prev = t
		}
	}
	var gap time.Duration
	for _, t := range ts {
		if t.Before(from) {
			continue
		}
		if t.After(to) {
			break
		}
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	return max(gap, to.Sub(prev))
}

// produceAtRate writes events to topic at rate per second, keyed by a sku
// (partition: sku modulo partitions), until ctx ends, counting them in
// produced once the broker acknowledged them.
func produceAtRate(ctx context.Context, brokers []string, topic string, partitions, skus, rate int, produced *atomic.Int64) error {
	w := &kafka.Writer{
		Addr:  kafka.TCP(brokers...),
		Topic: topic,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, ps ...int) int {
			sku, _ := strconv.ParseInt(string(m.Key), 10, 64)
			return ps[int(sku%int64(len(ps)))]
		}),
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	day := Today()
	began := time.Now()
	var seq int64
	for {
		// What is due by now, so that a slow acknowledgement is caught up
		// with by the next write.
		due := int64(time.Since(began).Seconds() * float64(rate))
		if due <= seq {
			if err := backoff.Sleep(ctx, 5*time.Millisecond); err != nil {
				return err
			}
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msgs := make([]kafka.Message, min(due-seq, 1000))
		for i := range msgs {
			e := NewEvent(seq, skus, day)
			seq++
			msgs[i] = kafka.Message{
				Key:   []byte(strconv.FormatInt(e.SKU, 10)),
				Value: []byte(strconv.FormatInt(e.Seq, 10)),
				Headers: []kafka.Header{
					{Key: header.EventID, Value: []byte(e.ID)},
					{Key: header.EventTime, Value: []byte(e.Time.UTC().Format(time.RFC3339Nano))},
				},
			}
		}
		// A write the broker did not acknowledge is tried again with the
		// same events: a copy that did land is absorbed by the inbox.
		// A new topic's leaders take a while to reach every broker's
		// metadata: a minute of failures is given up on, not fewer.
		failingSince := time.Time{}
		for attempt := 1; ; attempt++ {
			err := w.WriteMessages(context.WithoutCancel(ctx), msgs...)
			if err == nil {
				break
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) > time.Minute {
				return fmt.Errorf("bench: produce to %s: %w", topic, err)
			}
			if err := backoff.Sleep(context.WithoutCancel(ctx), backoff.Wait(50*time.Millisecond, time.Second, attempt)); err != nil {
				return err
			}
		}
		produced.Add(int64(len(msgs)))
	}
}
