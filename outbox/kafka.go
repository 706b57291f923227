package outbox

import (
	"context"
	"fmt"
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
	DefaultBatchMessages = 1000
	DefaultBatchBytes    = maxMessageBytes
)

// NewKafkaWriter returns a kafka-go Writer fit for a relay: acknowledged by
// all in-sync replicas, synchronous, partitioning by key as the Java client
// does (murmur2), and with batches large enough that one relay cycle is one
// batch per partition. Close it after the relay stopped.
func NewKafkaWriter(brokers ...string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    DefaultBatchMessages,
		BatchBytes:   DefaultBatchBytes,
		// A synchronous write waits this long for its batch to fill; the
		// relay hands over a whole cycle at once, so waiting gains nothing.
		BatchTimeout: time.Millisecond,
		WriteTimeout: 10 * time.Second,
	}
}

// KafkaPublisher publishes through a kafka-go Writer.
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
	switch w.Balancer.(type) {
	case nil, *kafka.RoundRobin, *kafka.LeastBytes:
		problems = append(problems, "Balancer must pick the partition by key (kafka.Murmur2Balancer, kafka.Hash, kafka.CRC32Balancer)")
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
	maxMessages, maxBytes := p.Limits()
	total := 0
	for i := range msgs {
		total += messageBytes(msgs[i].Key, msgs[i].Value, msgs[i].Headers)
	}
	if len(msgs) > maxMessages || (total > maxBytes && len(msgs) > 1) {
		return fmt.Errorf("outbox: %d messages of %d bytes exceed the writer's batch (%d messages, %d bytes): they could be split into batches that fail apart",
			len(msgs), total, maxMessages, maxBytes)
	}
	return p.w.WriteMessages(ctx, msgs...)
}
