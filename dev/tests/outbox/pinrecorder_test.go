package outbox_test

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/outbox"
)

// pinRecorder is a PinningPublisher standing in for a topic of count
// partitions: it records each message with its partition. seen, if set, is
// the count its writes see instead of count, as when the topic changed
// between the relay's check and the write.
type pinRecorder struct {
	// before, if set, runs once at the start of the next PublishPinned:
	// another writer that publishes between a relay's check and its
	// publish.
	before func()

	// lose, if set, is the event id of a message the recorder
	// acknowledges once and leaves out of its partition.
	lose string

	mu    sync.Mutex
	count int
	seen  int
	got   []kafka.Message
	parts []int
}

func (p *pinRecorder) Publish(context.Context, []kafka.Message) error {
	return errors.New("pinRecorder: an aligned relay called Publish")
}

func (p *pinRecorder) Partitions(context.Context, string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count, nil
}

func (p *pinRecorder) PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error {
	if before := p.before; before != nil {
		p.before = nil
		before()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if seen := cmp.Or(p.seen, p.count); seen != count {
		each := make(kafka.WriteErrors, len(msgs))
		for i := range each {
			each[i] = errors.New("no partition -1")
		}
		return errors.Join(&outbox.PartitionCountError{Topic: msgs[0].Topic, Partitions: seen, Shards: count}, each)
	}
	for i, m := range msgs {
		if id, _ := headerOf([]kafka.Message{m}, header.EventID); p.lose != "" && id == p.lose {
			p.lose = ""
			continue
		}
		p.got = append(p.got, m)
		p.parts = append(p.parts, partitions[i])
	}
	return nil
}

// EndOffsets and ReadPartition make the recorder a Witness: partition p's
// log is the messages recorded for p, in order, at offsets from 0.
func (p *pinRecorder) EndOffsets(_ context.Context, _ string, partitions []int) (map[int]int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ends := map[int]int64{}
	for _, pt := range partitions {
		ends[pt] = int64(len(p.log(pt)))
	}
	return ends, nil
}

func (p *pinRecorder) ReadPartition(_ context.Context, _ string, partition int, from, end int64, fn func(kafka.Message) error) (int64, error) {
	p.mu.Lock()
	log := p.log(partition)
	p.mu.Unlock()
	for off := from; off < end && off < int64(len(log)); off++ {
		m := log[off]
		m.Offset = off
		if err := fn(m); err != nil {
			return from, err
		}
	}
	return from, nil
}

// log returns partition's messages; p.mu is held.
func (p *pinRecorder) log(partition int) []kafka.Message {
	var out []kafka.Message
	for i, m := range p.got {
		if p.parts[i] == partition {
			out = append(out, m)
		}
	}
	return out
}

func (p *pinRecorder) published() ([]kafka.Message, []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]kafka.Message(nil), p.got...), append([]int(nil), p.parts...)
}

func headerOf(msgs []kafka.Message, key string) (string, int) {
	val, n := "", 0
	for _, m := range msgs {
		for _, h := range m.Headers {
			if h.Key == key {
				val, n = string(h.Value), n+1
			}
		}
	}
	return val, n
}
