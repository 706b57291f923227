package franzgo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxgo/inbox/outbox"
)

// The limits of one Publish call, as outbox.NewKafkaWriter's writer has
// them: a relay cycle is at most this much.
const (
	publishMessages = 1000
	publishBytes    = 1 << 20
	// batchSlack is what a record batch adds to its records on the wire
	// (its header and length), with room to spare: a partition's share
	// of a call fits one batch.
	batchSlack = 64 << 10
	// publishLinger holds a partition's records back for a call's later
	// records while franz-go partitions them as the topic's metadata
	// arrives (the first publish to a topic), so that the call is one
	// batch per partition. A call to a known topic does not wait for it.
	publishLinger = 50 * time.Millisecond
	// publishTimeout bounds a call whose context has no deadline.
	publishTimeout = 30 * time.Second
	// readBytes bounds one fetch of ReadPartition.
	readBytes = 8 << 20
	// partitionsMaxAge bounds the age of the count Partitions answers
	// with. An aligned relay asks before each cycle's publish: asking the
	// cluster each time was a Metadata request per cycle, as many as the
	// produce requests under a stream of commits. A change of the count
	// still shows within it (kafka-go's writer: within its MetadataTTL, 6s
	// by default), and the producer refuses a pinned record as soon as its
	// own metadata shows another count.
	partitionsMaxAge = time.Second
)

// Publisher is an outbox relay's publisher over franz-go's idempotent
// producer: an outbox.Publisher, outbox.Limited, outbox.PinningPublisher
// (for an aligned outbox) and outbox.Witness (for an aligned outbox that
// stamps sequence headers), the franz-go counterpart of
// outbox.KafkaPublisher over outbox.NewKafkaWriter's writer, with the same
// guarantees:
//
//   - Acknowledged by all in-sync replicas; Publish returns once every
//     message is acknowledged or failed (kafka.WriteErrors, one entry per
//     message, when some failed).
//   - A message with a key goes to the partition the Java client (and
//     outbox.Balancer's default, kafka.Murmur2Balancer) gives it:
//     toPositive(murmur2(key)) modulo the partition count, so switching a
//     relay between the two publishers moves no key. A message without a
//     key goes to a sticky partition (kafka-go's writer picks one at
//     random per message), except in an aligned outbox, whose relay pins
//     it like the others.
//   - Per partition, messages are appended in the order given, across
//     retries, and none after one that failed: the idempotent producer
//     numbers each partition's batches, the broker appends them in that
//     order only, and franz-go fails every later batch of a partition once
//     one fails. A call holds at most 1,000 messages of 1 MiB (Limits),
//     and is sent as one batch per partition.
//
// Like outbox.KafkaPublisher, PublishPinned reports the offsets the
// broker gave its messages (from the produce responses), so an aligned
// relay that nobody raced reads no end offsets after its publish.
//
// A publish cut short by its context (the relay's lease deadline) may
// still have been appended; the relay sends it again, and the downstream
// inbox drops the copies, as after a kafka-go writer's timeout. Calls of
// several relays through one Publisher are safe.
type Publisher struct {
	cl  *kgo.Client
	log *slog.Logger

	mu sync.Mutex
	// seen is each topic's partition count as Partitions last read it.
	seen map[string]partitionCount
}

// partitionCount is a topic's partition count and when it was asked for.
type partitionCount struct {
	n     int
	asked time.Time
}

// NewPublisher returns a Publisher over a franz-go client of its own,
// connected as opts says (the same Options as New). It makes the client
// rather than taking one: acks, the idempotent producer, the partitioner
// and the batch size are settings of a whole franz-go client, which the
// relay's guarantees stand on and which a client given by the caller
// could not be checked for. Options.ClientOptions apply, except that
// NewPublisher sets these again after them: acks from all in-sync
// replicas, its partitioner, its batch size, and one produce request in
// flight per broker when the caller disabled the idempotent producer
// (kgo.DisableIdempotentWrite, for a principal the cluster refuses
// idempotent writes; order is then kept by that single request, and a
// retry may append a copy).
//
// It connects lazily. Close it after the relay stopped.
func NewPublisher(opts Options) (*Publisher, error) {
	log, err := opts.check()
	if err != nil {
		return nil, err
	}
	o := append(opts.common(log),
		kgo.ProducerLinger(publishLinger),
		// The relay bounds a publish by its lease: a record in flight
		// fails when the call's context ends, rather than holding Publish
		// until the broker answers.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.MetadataMinAge(time.Second),
	)
	o = append(o, opts.ClientOptions...)
	o = append(o,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(pinningPartitioner{}),
		kgo.ProducerBatchMaxBytes(publishBytes+batchSlack),
		kgo.MaxProduceRequestsInflightPerBroker(1),
	)
	cl, err := kgo.NewClient(o...)
	if err != nil {
		return nil, fmt.Errorf("franzgo: franz-go rejected the options: %w", err)
	}
	return &Publisher{cl: cl, log: log, seen: map[string]partitionCount{}}, nil
}

// Close flushes what is buffered and closes the client.
func (p *Publisher) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		p.log.Warn("franzgo: flushing the outbox publisher failed", "error", err)
	}
	p.cl.Close()
}

// Limits returns 1,000 messages and 1 MiB, outbox.NewKafkaWriter's.
func (p *Publisher) Limits() (maxMessages, maxBytes int) {
	return publishMessages, publishBytes
}

// Publish writes msgs, each to the partition of its key, and waits for
// the acknowledgement.
func (p *Publisher) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := fits(msgs); err != nil {
		return err
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		if m.Topic == "" {
			return errors.New("franzgo: a message to publish names no topic")
		}
		recs[i] = recordOf(m)
	}
	return p.produce(ctx, recs)
}

// Partitions returns the partition count of topic, read from the cluster's
// metadata within the last second: a change of the count shows within a
// second. A count other than the one it read before makes the producer
// refresh its own metadata, which PublishPinned's placement checks
// against.
func (p *Publisher) Partitions(ctx context.Context, topic string) (int, error) {
	p.mu.Lock()
	last, ok := p.seen[topic]
	p.mu.Unlock()
	if ok && time.Since(last.asked) < partitionsMaxAge {
		return last.n, nil
	}
	asked := time.Now()
	md, err := p.metadata(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("franzgo: partitions of topic %q: %w", topic, err)
	}
	n := len(md.Partitions)
	p.mu.Lock()
	prev, ok := p.seen[topic]
	p.seen[topic] = partitionCount{n: n, asked: asked}
	p.mu.Unlock()
	if ok && prev.n != n {
		p.cl.ForceMetadataRefresh()
	}
	return n, nil
}

// PublishPinned writes msgs, msgs[i] to partition partitions[i] of its
// topic, and waits for the acknowledgement. It refuses every message when
// Partitions last read another count than count for a topic of the call,
// and the producer refuses a message, and every later one of the call,
// when its own metadata shows the topic with another count (see
// outbox.PinningPublisher); the error then wraps outbox.ErrPartitionCount.
func (p *Publisher) PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error {
	if len(partitions) != len(msgs) || count < 1 {
		return fmt.Errorf("franzgo: PublishPinned got %d messages, %d partitions, a count of %d", len(msgs), len(partitions), count)
	}
	if err := fits(msgs); err != nil {
		return err
	}
	call := &pinCall{count: count}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		if m.Topic == "" {
			return errors.New("franzgo: a message to publish names no topic")
		}
		if partitions[i] < 0 || partitions[i] >= count {
			return fmt.Errorf("franzgo: PublishPinned: partition %d of a topic of %d", partitions[i], count)
		}
		p.mu.Lock()
		seen, ok := p.seen[m.Topic]
		p.mu.Unlock()
		if ok && seen.n != count && !call.refused {
			call.refused, call.other, call.topic, call.seen = true, true, m.Topic, seen.n
		}
		recs[i] = recordOf(m)
		recs[i].Context = context.WithValue(ctx, pinKey{}, &pin{partition: int32(partitions[i]), call: call})
	}
	if call.refused {
		each := make(kafka.WriteErrors, len(msgs))
		for i := range each {
			each[i] = call.errRefused()
		}
		return errors.Join(call.mismatch(), each)
	}
	err := p.produce(ctx, recs)
	var each kafka.WriteErrors
	errors.As(err, &each)
	for i, r := range recs {
		// franz-go sets a produced record's Offset from its batch's base
		// offset in the broker's answer (-1 when that is unknown).
		produced := err == nil || (len(each) == len(recs) && each[i] == nil)
		if produced && r.Offset >= 0 && r.Partition == int32(partitions[i]) {
			msgs[i].Partition, msgs[i].Offset = partitions[i], r.Offset
		}
	}
	if mismatch := call.mismatch(); mismatch != nil {
		return errors.Join(mismatch, err)
	}
	return err
}

// produce sends recs and waits for every one's outcome.
func (p *Publisher) produce(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, publishTimeout)
		defer cancel()
	}
	index := make(map[*kgo.Record]int, len(recs))
	for i, r := range recs {
		index[r] = i
	}
	each := make(kafka.WriteErrors, len(recs))
	failed := 0
	for _, res := range p.cl.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			each[index[res.Record]] = kafkaError(res.Err)
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return each
}

// EndOffsets returns the partitions' end offsets, read from their leaders.
func (p *Publisher) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	return listOffsets(ctx, p.cl, topic, partitions, -1)
}

// ReadPartition fetches the partition's messages from from to end, from its
// leader. The messages carry their topic, partition, offset, key, value,
// time and headers.
func (p *Publisher) ReadPartition(ctx context.Context, topic string, partition int, from, end int64, fn func(kafka.Message) error) (int64, error) {
	starts, err := listOffsets(ctx, p.cl, topic, []int{partition}, -2)
	if err != nil {
		return 0, err
	}
	first := max(from, starts[partition])
	if first >= end {
		return first, nil
	}
	md, err := p.metadata(ctx, topic)
	if err != nil {
		return first, err
	}
	var leader int32 = -1
	for _, mp := range md.Partitions {
		if mp.Partition == int32(partition) {
			if err := kerr.ErrorForCode(mp.ErrorCode); err != nil && !errors.Is(err, kerr.ReplicaNotAvailable) {
				return first, fmt.Errorf("franzgo: partition %d of %q: %w", partition, topic, kafkaError(err))
			}
			leader = mp.Leader
		}
	}
	if leader < 0 {
		return first, fmt.Errorf("franzgo: partition %d of %q has no leader", partition, topic)
	}
	broker := p.cl.Broker(int(leader))
	next := first
	for next < end {
		req := kmsg.NewPtrFetchRequest()
		req.MaxWaitMillis = 500
		req.MinBytes = 1
		req.MaxBytes = readBytes
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, md.TopicID
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = int32(partition)
		rp.FetchOffset = next
		rp.PartitionMaxBytes = readBytes
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, broker)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			return first, fmt.Errorf("fetch at offset %d: %w", next, kafkaError(err))
		}
		var got *kmsg.FetchResponseTopicPartition
		for i := range resp.Topics {
			for j := range resp.Topics[i].Partitions {
				if resp.Topics[i].Partitions[j].Partition == int32(partition) {
					got = &resp.Topics[i].Partitions[j]
				}
			}
		}
		if got == nil {
			return first, fmt.Errorf("fetch at offset %d: no partition %d in the broker's answer", next, partition)
		}
		fp, processed := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: next, Topic: topic, Partition: int32(partition)},
			got, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return first, fmt.Errorf("fetch at offset %d: %w", next, kafkaError(fp.Err))
		}
		before := next
		for _, rec := range fp.Records {
			if rec.Offset < next {
				continue
			}
			if rec.Offset >= end {
				next = end
				break
			}
			if err := fn(messageOf(rec, fp.HighWatermark)); err != nil {
				return first, err
			}
			next = rec.Offset + 1
		}
		if next == before {
			// Nothing at next: a batch of transaction markers, or offsets
			// compaction emptied. The records processed end at processed.
			switch {
			case processed > next:
				next = min(processed, end)
			case fp.HighWatermark <= next:
				return first, fmt.Errorf("no message at offset %d below the end %d (high watermark %d)", next, end, fp.HighWatermark)
			default:
				next++
			}
		}
	}
	return first, nil
}

// metadata returns the broker's metadata of topic, without creating it.
func (p *Publisher) metadata(ctx context.Context, topic string) (kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return kmsg.MetadataResponseTopic{}, err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return kmsg.MetadataResponseTopic{}, kafkaError(err)
		}
		return t, nil
	}
	return kmsg.MetadataResponseTopic{}, kafka.UnknownTopicOrPartition
}

// fits refuses msgs if they exceed Limits, counted as the outbox counts a
// message against a kafka-go writer's BatchBytes.
func fits(msgs []kafka.Message) error {
	total := 0
	for _, m := range msgs {
		total += 40 + len(m.Key) + len(m.Value)
		for _, h := range m.Headers {
			total += 12 + len(h.Key) + len(h.Value)
		}
	}
	if len(msgs) > publishMessages || (total > publishBytes && len(msgs) > 1) {
		return fmt.Errorf("franzgo: %d messages of %d bytes exceed a publish (%d messages, %d bytes): they could be split into batches that fail apart",
			len(msgs), total, publishMessages, publishBytes)
	}
	return nil
}

// pinningPartitioner places a record PublishPinned pinned (its Context
// carries a pin) on its partition, and any other as the Java client does:
// murmur2 of the key, a sticky partition without one.
type pinningPartitioner struct{}

func (pinningPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return &pinningTopicPartitioner{keys: kgo.StickyKeyPartitioner(nil).ForTopic(topic)}
}

type pinningTopicPartitioner struct{ keys kgo.TopicPartitioner }

type pinKey struct{}

func pinOf(r *kgo.Record) *pin {
	if r.Context == nil {
		return nil
	}
	p, _ := r.Context.Value(pinKey{}).(*pin)
	return p
}

// RequiresConsistency is true for a pinned record: franz-go then offers
// every partition, a leaderless one too, by its number.
func (t *pinningTopicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return pinOf(r) != nil || t.keys.RequiresConsistency(r)
}

func (t *pinningTopicPartitioner) Partition(r *kgo.Record, n int) int {
	if p := pinOf(r); p != nil {
		return p.place(r.Topic, n)
	}
	return t.keys.Partition(r, n)
}

// OnNewBatch passes KIP-480's sticky switch on to the key partitioner.
func (t *pinningTopicPartitioner) OnNewBatch() {
	if nb, ok := t.keys.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}

// pin is a pinned record's partition and its call.
type pin struct {
	partition int32
	call      *pinCall
}

// pinCall is what the pins of one PublishPinned call share.
type pinCall struct {
	count int

	mu      sync.Mutex
	refused bool
	other   bool   // a message was refused for another partition count:
	topic   string // its topic
	seen    int    // and that count
}

// noPartition is what place returns for a record it must not place:
// franz-go fails such a record ("invalid record partitioning choice")
// before it is buffered.
const noPartition = -1

// place returns the pinned partition while the producer's metadata shows
// as many partitions as the call was given. franz-go partitions a call's
// records in order, and once one was refused every later one is too, so
// that no message overtakes an earlier one of its partition that failed.
func (p *pin) place(topic string, n int) int {
	c := p.call
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused {
		return noPartition
	}
	if n != c.count {
		c.refused, c.other, c.topic, c.seen = true, true, topic, n
		return noPartition
	}
	return int(p.partition)
}

// mismatch returns the error for a call refused for another partition
// count, or nil.
func (c *pinCall) mismatch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.other {
		return nil
	}
	return &outbox.PartitionCountError{Topic: c.topic, Partitions: c.seen, Shards: c.count}
}

// errRefused is a refused message's entry of the call's kafka.WriteErrors.
func (c *pinCall) errRefused() error {
	return fmt.Errorf("franzgo: not published: %q has %d partitions, the call was pinned for %d", c.topic, c.seen, c.count)
}

var (
	_ outbox.PinningPublisher = (*Publisher)(nil)
	_ outbox.Limited          = (*Publisher)(nil)
	_ outbox.Witness          = (*Publisher)(nil)
)
