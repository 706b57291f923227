package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
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
)

// DefaultKafkaEvents is how many events the end-to-end benchmark produces.
const DefaultKafkaEvents = 20000

// kafkaTimeout bounds one end-to-end mode.
const kafkaTimeout = 10 * time.Minute

// End-to-end modes.
const (
	KafkaPlain        = "no-inbox"           // the consumer applies the effect in its own transaction, no dedup
	KafkaInbox        = "inbox"              // through the inbox, one transaction per message
	KafkaBatch        = "inbox-batch"        // through Inbox.ProcessBatch, Options.BatchSize messages per transaction
	KafkaPlainBatched = "no-inbox-batched"   // a BatchHandler with one set-based UPDATE per batch, no dedup
	KafkaBatchHandler = "inbox-batchhandler" // through Inbox.ProcessBatchFunc: the same BatchHandler with the inbox
	// KafkaSequencedBatchHandler is KafkaBatchHandler with the events'
	// source trusted (consumer.Config.Sequenced.Sources): deduplicated by a
	// watermark per partition, no inbox row.
	KafkaSequencedBatchHandler = "sequenced-batchhandler"
	// KafkaSequenced is KafkaInbox with sequenced dedup: one message per
	// transaction, a watermark instead of the inbox row.
	KafkaSequenced = "sequenced"
	// KafkaHandlerDefault is KafkaInbox with the consumer's default
	// settings: a per-message Handler, and BatchSize left unset.
	KafkaHandlerDefault = "handler-default"
)

// BenchSource is the outbox source id the benchmark's events carry in their
// sequence headers, aligned: shard = partition, numbered from 1 per
// partition in offset order, as an aligned relay publishes them.
const BenchSource = "bench-source"

// KafkaModes are the end-to-end modes, each batched one after its
// reference.
var KafkaModes = []string{KafkaPlain, KafkaInbox, KafkaBatch, KafkaPlainBatched, KafkaBatchHandler}

// KafkaResult is one end-to-end mode: N events from a Kafka topic into the
// database through consumer.Consumer.
type KafkaResult struct {
	Mode    string
	Events  int
	Join    time.Duration // from Run until the first effect committed (group join, first fetch)
	Elapsed time.Duration // from the first effect to the last
	Ratio   float64       // throughput / the no-inbox mode's
	Produce time.Duration // producing the topic (same topic for every mode)
	// CPU is the CPU time this process spent consuming (the consumer or the
	// library-free pipeline, from the start of the group's join until the
	// last effect; the Kafka client and the database driver included, the
	// servers not): on a shared, busy machine it varies far less than
	// throughput.
	CPU time.Duration
}

// CPUPerEvent is the mode's CPU time per event.
func (r KafkaResult) CPUPerEvent() time.Duration {
	if r.Events <= 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Events)
}

// EventsPerSec is the steady throughput, first to last effect.
func (r KafkaResult) EventsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events-1) / r.Elapsed.Seconds()
}

// Kafka produces n events to a fresh topic with o.Workers partitions (keyed
// by sku, like Partition), then consumes the whole topic with
// consumer.Consumer into fresh tables of b, once per mode, each as a new
// consumer group from the first offset, and checks that every effect was
// applied exactly once.
func Kafka(ctx context.Context, b *Backend, brokers []string, n int, o Options) ([]KafkaResult, error) {
	o = o.withDefaults()
	topic := "inbox-bench-" + randomSuffix()
	if err := createTopic(ctx, brokers, topic, o.Workers); err != nil {
		return nil, err
	}
	evs := Events(n, o.SKUs)
	produce, err := produceEvents(ctx, brokers, topic, o.Workers, evs)
	if err != nil {
		return nil, err
	}
	var out []KafkaResult
	for _, mode := range KafkaModes {
		r, err := consumeAll(ctx, b, brokers, topic, mode, n, o, "")
		if err != nil {
			return out, err
		}
		r.Produce = produce
		out = append(out, r)
	}
	for i := range out {
		ref := out[0]
		if out[i].Mode == KafkaBatchHandler {
			ref = out[3] // the same batched pipeline without the inbox
		}
		out[i].Ratio = out[i].EventsPerSec() / ref.EventsPerSec()
	}
	return out, nil
}

// KafkaPaired produces n events to a fresh topic once, then consumes it
// with each of modes (the first the reference) in every round, alternating
// their order from round to round, each time as a new consumer group into
// fresh tables. ratios[i][r] is modes[i]'s throughput over the reference's
// in round r.
func KafkaPaired(ctx context.Context, b *Backend, brokers []string, n int, o Options, modes []string, rounds int) (results [][]KafkaResult, ratios [][]float64, err error) {
	o = o.withDefaults()
	topic := "inbox-bench-" + randomSuffix()
	if err := createTopic(ctx, brokers, topic, o.Workers); err != nil {
		return nil, nil, err
	}
	produce, err := produceEvents(ctx, brokers, topic, o.Workers, Events(n, o.SKUs))
	if err != nil {
		return nil, nil, err
	}
	results = make([][]KafkaResult, len(modes))
	ratios = make([][]float64, len(modes))
	for r := range rounds {
		round := make([]KafkaResult, len(modes))
		for k := range modes {
			i := k
			if r%2 == 1 {
				i = len(modes) - 1 - k
			}
			res, err := consumeAll(ctx, b, brokers, topic, modes[i], n, o, fmt.Sprintf("-r%d", r))
			if err != nil {
				return results, ratios, err
			}
			res.Produce = produce
			round[i] = res
		}
		for i := range modes {
			round[i].Ratio = round[i].EventsPerSec() / round[0].EventsPerSec()
			results[i] = append(results[i], round[i])
			ratios[i] = append(ratios[i], round[i].Ratio)
		}
	}
	return results, ratios, nil
}

func createTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return fmt.Errorf("bench: dial kafka: %w", err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("bench: kafka controller: %w", err)
	}
	cc, err := kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		return fmt.Errorf("bench: dial kafka controller: %w", err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}); err != nil {
		return fmt.Errorf("bench: create topic %s: %w", topic, err)
	}
	// Wait until every partition has a leader: a busy broker takes seconds.
	deadline := time.Now().Add(time.Minute)
	for {
		ps, err := conn.ReadPartitions(topic)
		ready := err == nil && len(ps) == partitions
		for _, p := range ps {
			ready = ready && p.Leader.ID >= 0 && p.Leader.Host != ""
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: topic %s has no leaders after a minute (%d partitions seen): %v", topic, len(ps), err)
		}
		if err := backoff.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// deleteTopic deletes topic, so that a long benchmark does not leave the
// broker with a topic per run.
func deleteTopic(ctx context.Context, brokers []string, topic string) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("bench: delete topic %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil {
		return fmt.Errorf("bench: delete topic %s: %w", topic, err)
	}
	return nil
}

// produceEvents writes evs to topic's partitions, the partition of an event
// its sku modulo partitions, with the event headers and the sequence
// headers of BenchSource (which only the sequenced modes read).
func produceEvents(ctx context.Context, brokers []string, topic string, partitions int, evs []Event) (time.Duration, error) {
	w := &kafka.Writer{
		Addr:  kafka.TCP(brokers...),
		Topic: topic,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, ps ...int) int {
			sku, _ := strconv.ParseInt(string(m.Key), 10, 64)
			return ps[int(sku%int64(len(ps)))]
		}),
		RequiredAcks: kafka.RequireAll,
		BatchSize:    1000,
		BatchTimeout: 5 * time.Millisecond,
	}
	defer w.Close()
	start := time.Now()
	const chunk = 5000
	seqs := make([]int64, partitions)
	parts := []byte(strconv.Itoa(partitions))
	for lo := 0; lo < len(evs); lo += chunk {
		msgs := make([]kafka.Message, 0, chunk)
		for _, e := range evs[lo:min(lo+chunk, len(evs))] {
			p := int(e.SKU % int64(partitions))
			seqs[p]++
			msgs = append(msgs, kafka.Message{
				Key:   []byte(strconv.FormatInt(e.SKU, 10)),
				Value: []byte(strconv.FormatInt(e.Seq, 10)),
				Headers: []kafka.Header{
					{Key: header.EventID, Value: []byte(e.ID)},
					{Key: header.EventTime, Value: []byte(e.Time.UTC().Format(time.RFC3339Nano))},
					{Key: header.SeqSource, Value: []byte(BenchSource)},
					{Key: header.SeqEpoch, Value: []byte("1")},
					{Key: header.SeqShard, Value: []byte(strconv.Itoa(p))},
					{Key: header.Seq, Value: []byte(strconv.FormatInt(seqs[p], 10))},
					{Key: header.SeqPartitions, Value: parts},
				},
			})
		}
		// Retry while the new topic's leaders are being elected.
		for attempt := 1; ; attempt++ {
			err := w.WriteMessages(ctx, msgs...)
			if err == nil {
				break
			}
			if attempt == 120 || ctx.Err() != nil {
				return 0, fmt.Errorf("bench: produce to %s: %w", topic, err)
			}
			if err := backoff.Sleep(ctx, 250*time.Millisecond); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}

// consumeAll consumes the topic's n events with mode (on the transport a
// TransportMode names), as the consumer group named after the topic, the
// mode and groupSuffix.
func consumeAll(ctx context.Context, b *Backend, brokers []string, topic, mode string, n int, o Options, groupSuffix string) (KafkaResult, error) {
	res := KafkaResult{Mode: mode, Events: n}
	groupID := topic + "-" + mode + groupSuffix
	mode, newClient, err := splitTransport(mode)
	if err != nil {
		return res, err
	}
	f, err := NewFixture(ctx, b, o.SKUs, inbox.Config{}, 0)
	if err != nil {
		return res, err
	}
	defer func() { _ = f.Drop(context.WithoutCancel(ctx)) }()
	if mode == KafkaLibraryFree || mode == KafkaClassicInbox {
		start, cpu := time.Now(), processCPU()
		first, last, err := consumeLibraryFree(ctx, f, brokers, topic, groupID, n, o.BatchSize, mode == KafkaClassicInbox)
		if err != nil {
			return res, err
		}
		res.CPU = processCPU() - cpu
		res.Join, res.Elapsed = first.Sub(start), last.Sub(first)
		return res, checkReserved(ctx, f, mode, n)
	}
	var (
		processed   atomic.Int64
		mu          sync.Mutex
		first, last time.Time
		done        = make(chan struct{})
		doneOnce    sync.Once
	)
	cfg := consumer.Config{
		Brokers: brokers,
		GroupID: groupID,
		Topics:  []string{topic},
		Handler: func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
			sku, err := strconv.ParseInt(string(m.Key), 10, 64)
			if err != nil {
				return err
			}
			return f.effect(tx, sku)
		},
		BatchSize: 1,
		Logger:    discardLogger,
		Hooks: []hooks.Hook{hooks.EventFunc(func(e hooks.Event) {
			if e.Kind != hooks.Processed {
				return
			}
			now := time.Now()
			mu.Lock()
			if first.IsZero() {
				first = now
			}
			last = now
			mu.Unlock()
			if processed.Add(1) == int64(n) {
				doneOnce.Do(func() { close(done) })
			}
		})},
	}
	switch mode {
	case KafkaPlain:
		// The baseline: the same consumer loop and transaction per message,
		// without an inbox row (the flag skips the inbox; the effect is an
		// increment, so this is exactly the non-idempotent baseline).
		cfg.NaturallyIdempotent, cfg.DB, cfg.Classifier = true, b.DB, f.Store
	case KafkaInbox:
		cfg.Inbox, cfg.Consumer = f.Inbox, ConsumerName
	case KafkaHandlerDefault:
		cfg.Inbox, cfg.Consumer, cfg.BatchSize = f.Inbox, ConsumerName, 0
	case KafkaSequenced:
		cfg.Inbox, cfg.Consumer, cfg.Sequenced.Sources = f.Inbox, ConsumerName, []string{BenchSource}
	case KafkaBatch:
		cfg.Inbox, cfg.Consumer, cfg.BatchSize = f.Inbox, ConsumerName, o.BatchSize
	case KafkaPlainBatched, KafkaBatchHandler, KafkaSequencedBatchHandler:
		cfg.Handler, cfg.BatchHandler, cfg.BatchSize = nil, func(ctx context.Context, tx *gorm.DB, ms []consumer.Message) error {
			skus := make([]int64, len(ms))
			for i, m := range ms {
				sku, err := strconv.ParseInt(string(m.Key), 10, 64)
				if err != nil {
					return err
				}
				skus[i] = sku
			}
			return f.setEffect(tx, skus)
		}, o.BatchSize
		switch mode {
		case KafkaPlainBatched:
			cfg.NaturallyIdempotent, cfg.DB, cfg.Classifier = true, b.DB, f.Store
		case KafkaSequencedBatchHandler:
			cfg.Inbox, cfg.Consumer, cfg.Sequenced.Sources = f.Inbox, ConsumerName, []string{BenchSource}
		default:
			cfg.Inbox, cfg.Consumer = f.Inbox, ConsumerName
		}
	}
	if newClient != nil {
		if cfg.Kafka.Transport, err = newClient(brokers); err != nil {
			return res, err
		}
	}
	c, err := consumer.New(cfg)
	if err != nil {
		if cfg.Kafka.Transport != nil {
			cfg.Kafka.Transport.Close()
		}
		return res, err
	}
	if err := c.Migrate(ctx); err != nil {
		_ = c.Close()
		return res, err
	}
	runCtx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	defer cancel()
	start, cpu := time.Now(), processCPU()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx) }()
	select {
	case <-done:
		res.CPU = processCPU() - cpu
	case err := <-runErr:
		return res, fmt.Errorf("bench: consumer (%s) on %s stopped after %d of %d events: %w", mode, b.Name, processed.Load(), n, err)
	case <-runCtx.Done():
		_ = c.Close()
		return res, fmt.Errorf("bench: consumer (%s) on %s: %d of %d events after %v: %w", mode, b.Name, processed.Load(), n, kafkaTimeout, runCtx.Err())
	}
	if err := c.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return res, err
	}
	mu.Lock()
	res.Join, res.Elapsed = first.Sub(start), last.Sub(first)
	mu.Unlock()
	if err := checkReserved(ctx, f, mode, n); err != nil {
		return res, err
	}
	if len(cfg.Sequenced.Sources) > 0 {
		// The point of the mode: no inbox row at all.
		rows, err := f.InboxRows(ctx)
		if err != nil {
			return res, err
		}
		if rows != 0 {
			return res, fmt.Errorf("bench: consumer (%s) on %s wrote %d inbox rows for sequenced events", mode, b.Name, rows)
		}
	}
	return res, nil
}

// checkReserved checks that mode applied each of the n events once.
func checkReserved(ctx context.Context, f *Fixture, mode string, n int) error {
	reserved, err := f.Reserved(ctx)
	if err != nil {
		return err
	}
	if reserved != int64(n) {
		return fmt.Errorf("bench: consumer (%s) on %s applied %d effects for %d events", mode, f.Backend.Name, reserved, n)
	}
	return nil
}
