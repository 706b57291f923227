package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"
)

// murmur2 is the Java client's Utils.murmur2 (seed 0x9747b28c), the hash of
// Kafka's default partitioner and of kafka.Murmur2Balancer.
func murmur2(data []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// partitionHash is an aligned outbox's KeyHash: toPositive(murmur2(key)),
// so that KeyHash modulo the partition count is the partition Kafka's
// default partitioner (and kafka.Murmur2Balancer) gives the key. A message
// without a key hashes its event id instead: it is pinned like the others,
// so that it takes its place in its shard's stream.
func partitionHash(key []byte, id string) uint32 {
	if key == nil {
		key = []byte(id)
	}
	return murmur2(key) & 0x7fffffff
}

// ErrPartitionCount is wrapped by a relay cycle's error when the topic of
// an aligned outbox has another number of partitions than the outbox has
// shards: nothing of the cycle is published, and every cycle fails so
// until the counts agree again (see "Aligned shards" in the package doc).
// The error is a *PartitionCountError.
var ErrPartitionCount = errors.New("outbox: the aligned topic's partition count differs from the outbox's shard count")

// PartitionCountError says which topic has how many partitions, against
// the aligned outbox's shards.
type PartitionCountError struct {
	Topic      string
	Partitions int // the topic's, as the publisher sees it
	Shards     int // the outbox's
}

func (e *PartitionCountError) Error() string {
	return fmt.Sprintf("outbox: topic %q has %d partitions, the aligned outbox %d shards: nothing is published until they are equal "+
		"(partitions cannot be removed: recreate the topic with %d, or move to a new outbox table of %d shards)",
		e.Topic, e.Partitions, e.Shards, e.Shards, e.Partitions)
}

// Is makes errors.Is(err, ErrPartitionCount) true.
func (e *PartitionCountError) Is(target error) bool { return target == ErrPartitionCount }

// PinningPublisher is the optional Publisher capability the relay of an
// aligned outbox (Config.AlignedTopic) needs: it tells a topic's partition
// count and sends each message to the partition it is given.
// KafkaPublisher is one, over a writer whose Balancer is a [Balancer]; so
// is franzgo.Publisher (module github.com/inboxgo/inbox/transport/franzgo).
type PinningPublisher interface {
	Publisher
	// Partitions returns the number of partitions of topic, as the next
	// PublishPinned call sees it.
	Partitions(ctx context.Context, topic string) (int, error)
	// PublishPinned is Publish, with msgs[i] sent to partition
	// partitions[i] of its topic, which must have count partitions. A
	// message it cannot send there is never sent to another partition: it
	// fails (its entry of a kafka.WriteErrors), and so does every message
	// after it in msgs once the publisher saw its topic with another
	// count; the error then wraps ErrPartitionCount.
	//
	// A publisher that learns where the broker appended a message (the
	// produce response's offsets) sets its msgs[i].Partition and
	// msgs[i].Offset to them; the relay gives each Offset as -1. After a
	// call that returned nil, a relay that stamps sequence headers takes
	// messages that follow, one after the other, from where its check of
	// the partition ended as proof that nothing was appended before them,
	// instead of asking Witness.EndOffsets (one request less per cycle).
	// A publisher that cannot tell leaves Offset at -1.
	PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error
}

// Balancer is the kafka-go Balancer of NewKafkaWriter. A message that
// KafkaPublisher.PublishPinned pins to a partition goes to that partition,
// while kafka-go offers the partition count the call was given; any other
// message goes by Keys.
type Balancer struct {
	// Keys balances the messages nobody pinned. Default
	// kafka.Murmur2Balancer{}: by key, as the Java client does.
	Keys kafka.Balancer
}

// Balance implements kafka.Balancer.
func (b Balancer) Balance(msg kafka.Message, partitions ...int) int {
	if p, ok := msg.WriterData.(*pin); ok {
		return p.balance(msg.Topic, partitions)
	}
	return b.keys().Balance(msg, partitions...)
}

func (b Balancer) keys() kafka.Balancer {
	if b.Keys == nil {
		return kafka.Murmur2Balancer{}
	}
	return b.Keys
}

// keysOf returns the balancer that places the messages nobody pinned
// through a writer's Balancer b: b itself, unless it is a Balancer.
func keysOf(b kafka.Balancer) kafka.Balancer {
	switch b := b.(type) {
	case Balancer:
		return b.keys()
	case *Balancer:
		if b == nil {
			return nil
		}
		return b.keys()
	}
	return b
}

// pins reports whether a writer's Balancer b places pinned messages.
func pins(b kafka.Balancer) bool {
	switch b := b.(type) {
	case Balancer:
		return true
	case *Balancer:
		return b != nil
	}
	return false
}

// pin is the kafka.Message.WriterData by which PublishPinned tells the
// Balancer a message's partition.
type pin struct {
	partition int
	call      *pinCall
	// at, if not nil, takes the offset the broker gave the message (see
	// notePlacements).
	at *atomic.Int64
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

// noPartition is what Balance returns for a message it must not place.
// kafka-go's Balancer cannot fail, and any partition that exists could be
// a wrong one; no topic has partition -1. kafka-go's Transport then fails
// the message in the client, before anything goes on the wire: routing
// the produce request finds no partition -1 in its cluster layout
// ("no partition"), an error the writer does not retry. The message is
// sent nowhere and comes back as its entry of a kafka.WriteErrors.
const noPartition = -1

// balance returns the pinned partition if kafka-go offers as many
// partitions as the relay checked (PublishPinned checked that the
// partition is below that count). The writer reads the partition count of
// every message from its metadata cache, which a refresh may change in the
// middle of a call: once one message was refused, every later one of the
// call is refused too, so that no message overtakes an earlier one of its
// shard that failed.
func (p *pin) balance(topic string, partitions []int) int {
	c := p.call
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused {
		return noPartition
	}
	if len(partitions) != c.count {
		c.refused, c.other, c.topic, c.seen = true, true, topic, len(partitions)
		return noPartition
	}
	if partitions[p.partition] != p.partition {
		c.refused = true
		return noPartition
	}
	return p.partition
}

// mismatch returns the error for a call that was refused for another
// partition count, or nil.
func (c *pinCall) mismatch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.other {
		return nil
	}
	return &PartitionCountError{Topic: c.topic, Partitions: c.seen, Shards: c.count}
}
