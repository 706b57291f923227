package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/inbox"
)

// Publisher sends messages and returns once the broker acknowledged all of
// them (nil), or with an error. The error is a kafka.WriteErrors with one
// entry per message when only some failed. Messages of one topic and key
// must be written in the order given, and must not be split into separately
// acknowledged parts of which a later one can succeed after an earlier one
// failed: one call is one batch per topic partition.
type Publisher interface {
	Publish(ctx context.Context, msgs []kafka.Message) error
}

// Limited is an optional Publisher capability: a call holds at most
// maxMessages messages of at most maxBytes in all, counted as kafka-go's
// Writer counts them against its BatchBytes (a little generously: each
// message's key, value and headers plus some framing). The relay claims no
// more than that per cycle; maxBytes must be at least 1 MiB (1 << 20,
// kafka-go's default BatchBytes), the largest message Enqueue accepts.
type Limited interface {
	Limits() (maxMessages, maxBytes int)
}

// Defaults of the writer NewKafkaWriter makes.
const (
	defaultBatchMessages = 1000
	defaultBatchBytes    = maxMessageBytes
)

// NewKafkaWriter returns a kafka-go Writer fit for a relay: acknowledged by
// all in-sync replicas, synchronous, partitioning by key as the Java client
// does (murmur2; an aligned outbox's relay pins the partitions through the
// [Balancer]), and with batches large enough that one relay cycle is one
// batch per partition (up to 1,000 messages and 1 MiB). Its Completion notes where the broker put an aligned
// relay's messages, which spares the relay a request for the end offsets
// after each publish; a writer without it (another Completion) works, with
// that request. Close it after the relay stopped.
func NewKafkaWriter(brokers ...string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    defaultBatchMessages,
		BatchBytes:   defaultBatchBytes,
		// A synchronous write waits this long for its batch to fill; the
		// relay hands over a whole cycle at once, so waiting gains nothing
		// (0 would be kafka-go's default of a second). The wait cannot split
		// a call: kafka-go adds all of a call's messages for a partition to
		// its batch before the batch's timer can send it.
		BatchTimeout: time.Microsecond,
		WriteTimeout: 10 * time.Second,
		// The offsets the broker gave a relay's messages spare the aligned
		// relay a request for the end offsets after its publish.
		Completion: notePlacements,
	}
}

// notePlacements is the Completion of NewKafkaWriter's writer: it notes the
// offset of each pinned message of a batch the broker acknowledged. kafka-go
// sets a message's Offset to its batch's base offset, from the produce
// response, plus its index in the batch.
func notePlacements(msgs []kafka.Message, err error) {
	if err != nil {
		return
	}
	for _, m := range msgs {
		if p, ok := m.WriterData.(*pin); ok && p.at != nil && m.Partition == p.partition {
			p.at.Store(m.Offset)
		}
	}
}

// KafkaPublisher publishes through a kafka-go Writer. It is a
// PinningPublisher, for an aligned outbox's relay, when the writer's
// Balancer is a [Balancer] (NewKafkaWriter's).
type KafkaPublisher struct{ w *kafka.Writer }

// NewKafkaPublisher checks that w keeps the relay's guarantees and returns
// a Publisher over it: acknowledgement by all in-sync replicas (a message
// acknowledged by the leader alone can be lost, and the relay marks it
// published), synchronous writes, a key balancer (round robin would spread
// one key over partitions), and no fixed Topic (messages name theirs).
func NewKafkaPublisher(w *kafka.Writer) (*KafkaPublisher, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil kafka writer", inbox.ErrInvalidConfig)
	}
	var problems []string
	if w.RequiredAcks != kafka.RequireAll {
		problems = append(problems, "RequiredAcks must be kafka.RequireAll")
	}
	if w.Async {
		problems = append(problems, "Async must be false: the relay marks messages published only once the broker acknowledged them")
	}
	if w.Topic != "" {
		problems = append(problems, "Topic must be empty: each message names its topic")
	}
	switch keysOf(w.Balancer).(type) {
	case nil, *kafka.RoundRobin, *kafka.LeastBytes:
		problems = append(problems, "Balancer must pick the partition by key (outbox.Balancer, kafka.Murmur2Balancer, kafka.Hash, kafka.CRC32Balancer)")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: kafka writer: %v", inbox.ErrInvalidConfig, problems)
	}
	return &KafkaPublisher{w: w}, nil
}

// Limits returns the writer's batch limits: a relay cycle within them is
// one batch per partition.
func (p *KafkaPublisher) Limits() (maxMessages, maxBytes int) {
	maxMessages, maxBytes = p.w.BatchSize, int(p.w.BatchBytes)
	if maxMessages <= 0 {
		maxMessages = 100 // kafka-go's default
	}
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	return maxMessages, maxBytes
}

// Publish writes msgs and waits for the acknowledgement.
func (p *KafkaPublisher) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := p.fits(msgs); err != nil {
		return err
	}
	return p.w.WriteMessages(ctx, msgs...)
}

// fits refuses msgs if the writer could split them into batches that fail
// apart.
func (p *KafkaPublisher) fits(msgs []kafka.Message) error {
	maxMessages, maxBytes := p.Limits()
	total := 0
	for i := range msgs {
		total += messageBytes(msgs[i].Key, msgs[i].Value, msgs[i].Headers)
	}
	if len(msgs) > maxMessages || (total > maxBytes && len(msgs) > 1) {
		return fmt.Errorf("outbox: %d messages of %d bytes exceed the writer's batch (%d messages, %d bytes): they could be split into batches that fail apart",
			len(msgs), total, maxMessages, maxBytes)
	}
	return nil
}

// Partitions returns the partition count of topic from the writer's
// Transport, the metadata cache the writer balances by: a change of the
// count shows within the Transport's MetadataTTL (kafka-go's default 6s).
func (p *KafkaPublisher) Partitions(ctx context.Context, topic string) (int, error) {
	client := &kafka.Client{Addr: p.w.Addr, Transport: p.w.Transport}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("outbox: partitions of topic %q: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return 0, fmt.Errorf("outbox: partitions of topic %q: %w", topic, t.Error)
		}
		return len(t.Partitions), nil
	}
	return 0, fmt.Errorf("outbox: partitions of topic %q: %w", topic, kafka.UnknownTopicOrPartition)
}

// PublishPinned writes msgs, msgs[i] to partition partitions[i] of its
// topic, and waits for the acknowledgement. The writer's Balancer places
// each message, and refuses it while the writer's metadata shows its topic
// with another count than count (see [PinningPublisher]).
func (p *KafkaPublisher) PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error {
	if err := p.canPin(); err != nil {
		return err
	}
	if len(partitions) != len(msgs) || count < 1 {
		return fmt.Errorf("outbox: PublishPinned got %d messages, %d partitions, a count of %d", len(msgs), len(partitions), count)
	}
	if err := p.fits(msgs); err != nil {
		return err
	}
	call := &pinCall{count: count}
	// The writer's Completion notes where each message went from a
	// goroutine of its own: atomics, copied into msgs once the write is
	// over.
	offsets := make([]atomic.Int64, len(msgs))
	for i := range offsets {
		offsets[i].Store(-1)
	}
	pinned := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		if partitions[i] < 0 || partitions[i] >= count {
			return fmt.Errorf("outbox: PublishPinned: partition %d of a topic of %d", partitions[i], count)
		}
		m.WriterData = &pin{partition: partitions[i], call: call, at: &offsets[i]}
		pinned[i] = m
	}
	err := p.w.WriteMessages(ctx, pinned...)
	for i := range msgs {
		if at := offsets[i].Load(); at >= 0 {
			msgs[i].Partition, msgs[i].Offset = partitions[i], at
		}
	}
	if mismatch := call.mismatch(); mismatch != nil {
		return errors.Join(mismatch, err)
	}
	return err
}

// canPin returns an error unless the writer's Balancer places pinned
// messages.
func (p *KafkaPublisher) canPin() error {
	if pins(p.w.Balancer) {
		return nil
	}
	return fmt.Errorf("%w: an aligned outbox's relay needs a kafka writer whose Balancer is an outbox.Balancer (NewKafkaWriter's), got %T", inbox.ErrInvalidConfig, p.w.Balancer)
}
