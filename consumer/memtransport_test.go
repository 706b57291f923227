package consumer

// memBroker: an in-memory Kafka for the package's tests, behind the
// transport interfaces (transport.go). Partitions are logs in memory, the
// group keeps committed offsets and hands out generations that a test ends
// (rebalance) with the assignment it chooses; dead letters are captured.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

var (
	errMemGenerationOver = errors.New("membroker: not a member of the current generation")
	errMemRebalance      = errors.New("membroker: rebalance")
	errMemGroupClosed    = errors.New("membroker: group closed")
)

type memBroker struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	logs    map[string][]*memLog
	// committed is the group's committed offset per partition.
	committed map[topicPartition]int64
	commits   []memCommit
	// gen is the current generation's id; genCtx ends it.
	gen       int32
	genCancel context.CancelCauseFunc
	// assign, when set, is the partitions of each topic the next
	// generations assign (all of them otherwise).
	assign map[string][]int
	// joinErrs are returned by the next calls of next, in order.
	joinErrs []error
	// commitErr, when set, decides the commits' errors.
	commitErr func(tp topicPartition, next int64) error
	// fetchErrs are returned by the next fetches, in order.
	fetchErrs []error
	// deadErrs are returned by the next dead-letter writes, in order;
	// deadErr, when set, by every write after them.
	deadErrs []error
	deadErr  error
	dead     []kafka.Message
	readers  int // the partition readers open
	closed   int // the transports closed
}

type memLog struct {
	start int64 // the log start offset (retention)
	next  int64 // the log end offset
	msgs  []kafka.Message
}

type memCommit struct {
	gen  int32
	tp   topicPartition
	next int64
}

func newMemBroker() *memBroker {
	return &memBroker{
		changed:   make(chan struct{}),
		logs:      make(map[string][]*memLog),
		committed: make(map[topicPartition]int64),
	}
}

// notify wakes the waiters; b.mu is held.
func (b *memBroker) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// createTopic creates topic with n empty partitions.
func (b *memBroker) createTopic(topic string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		b.logs[topic] = append(b.logs[topic], &memLog{})
	}
}

// produce appends msgs to topic's partition and returns the offset of the
// first.
func (b *memBroker) produce(topic string, partition int, msgs ...kafka.Message) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.logs[topic][partition]
	first := l.next
	for _, m := range msgs {
		m.Topic, m.Partition, m.Offset = topic, partition, l.next
		if m.Time.IsZero() {
			m.Time = time.Now()
		}
		l.msgs = append(l.msgs, m)
		l.next++
	}
	b.notify()
	return first
}

// truncate drops the messages before offset, as retention does.
func (b *memBroker) truncate(topic string, partition int, offset int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.logs[topic][partition]
	l.start = offset
	l.msgs = slices.DeleteFunc(l.msgs, func(m kafka.Message) bool { return m.Offset < offset })
	b.notify()
}

// committedOffset returns the group's committed offset (-1: none).
func (b *memBroker) committedOffset(topic string, partition int) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n, ok := b.committed[topicPartition{topic, partition}]; ok {
		return n
	}
	return -1
}

// setCommitted sets the group's committed offset, as a reset would.
func (b *memBroker) setCommitted(topic string, partition int, next int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.committed[topicPartition{topic, partition}] = next
}

// deadLetters returns the dead letters written so far.
func (b *memBroker) deadLetters() []kafka.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.dead)
}

// generation returns the current generation's id (0: none yet).
func (b *memBroker) generation() int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

// rebalance ends the current generation; the next one assigns assign
// (nil: every partition).
func (b *memBroker) rebalance(assign map[string][]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.assign = assign
	if b.genCancel != nil {
		b.genCancel(errMemRebalance)
	}
	b.notify()
}

// memTransport is one Consumer's client of a memBroker.
type memTransport struct {
	b   *memBroker
	cfg *Config
}

func (b *memBroker) transport() func(cfg *Config, log *slog.Logger) transport {
	return func(cfg *Config, _ *slog.Logger) transport { return &memTransport{b: b, cfg: cfg} }
}

func (t *memTransport) group() (consumerGroup, error) { return &memGroup{t: t}, nil }

func (t *memTransport) reader(topic string, partition int, _ *slog.Logger) partitionReader {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	t.b.readers++
	return &memReader{b: t.b, topic: topic, partition: partition, pos: -1}
}

func (t *memTransport) logOffsets(_ context.Context, topic string, partition int) (int64, int64, error) {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	ps := t.b.logs[topic]
	if partition >= len(ps) {
		return 0, 0, fmt.Errorf("membroker: no partition %s/%d", topic, partition)
	}
	return ps[partition].start, ps[partition].next, nil
}

func (t *memTransport) missingTopics(_ context.Context, topics []string) ([]string, error) {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	var out []string
	for _, topic := range topics {
		if _, ok := t.b.logs[topic]; !ok {
			out = append(out, topic)
		}
	}
	return out, nil
}

func (t *memTransport) deadLetterWriter() MessageWriter { return memWriter{t.b} }

func (t *memTransport) close() {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	t.b.closed++
}

// memWriter captures dead letters (partitioned as the topic's partition 0).
type memWriter struct{ b *memBroker }

func (w memWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	if len(w.b.deadErrs) > 0 {
		err := w.b.deadErrs[0]
		w.b.deadErrs = w.b.deadErrs[1:]
		return err
	}
	if w.b.deadErr != nil {
		return w.b.deadErr
	}
	for _, m := range msgs {
		if m.Topic == "" {
			return errors.New("membroker: a dead letter without a topic")
		}
		w.b.dead = append(w.b.dead, m)
	}
	w.b.notify()
	return nil
}

type memGroup struct {
	t    *memTransport
	prev *memGeneration
}

func (g *memGroup) next(ctx context.Context) (generation, error) {
	if g.prev != nil {
		select {
		case <-g.prev.ctx.Done():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		g.prev.fns.Wait()
		g.prev = nil
	}
	b := g.t.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.joinErrs) > 0 {
		err := b.joinErrs[0]
		b.joinErrs = b.joinErrs[1:]
		return nil, err
	}
	b.gen++
	gctx, cancel := context.WithCancelCause(context.Background())
	b.genCancel = cancel
	gen := &memGeneration{b: b, genID: b.gen, ctx: gctx, cancel: cancel, assigned: make(map[string][]assignment)}
	for topic, ps := range b.logs {
		if !slices.Contains(g.t.cfg.Topics, topic) {
			continue
		}
		for p := range ps {
			if b.assign != nil && !slices.Contains(b.assign[topic], p) {
				continue
			}
			off, ok := b.committed[topicPartition{topic, p}]
			if !ok {
				off = g.t.cfg.StartOffset
			}
			gen.assigned[topic] = append(gen.assigned[topic], assignment{partition: p, offset: off})
		}
	}
	g.prev = gen
	b.notify()
	return gen, nil
}

type memRejected struct{ error }

func (g *memGroup) rejected(err error) bool {
	var r memRejected
	return errors.As(err, &r)
}

func (g *memGroup) close() error {
	if g.prev != nil {
		g.prev.cancel(errMemGroupClosed)
		g.prev.fns.Wait()
	}
	return nil
}

type memGeneration struct {
	b        *memBroker
	genID    int32
	ctx      context.Context
	cancel   context.CancelCauseFunc
	fns      sync.WaitGroup
	assigned map[string][]assignment
}

func (g *memGeneration) id() int32        { return g.genID }
func (g *memGeneration) memberID() string { return "mem-member" }

func (g *memGeneration) assignments(topic string) []assignment { return g.assigned[topic] }

func (g *memGeneration) start(fn func(ctx context.Context)) {
	g.fns.Go(func() {
		defer g.cancel(errors.New("membroker: a function of the generation returned"))
		fn(g.ctx)
	})
}

func (g *memGeneration) commit(topic string, partition int, next int64) error {
	b := g.b
	b.mu.Lock()
	defer b.mu.Unlock()
	tp := topicPartition{topic, partition}
	if g.genID != b.gen {
		return errMemGenerationOver
	}
	if b.commitErr != nil {
		if err := b.commitErr(tp, next); err != nil {
			return err
		}
	}
	b.committed[tp] = next
	b.commits = append(b.commits, memCommit{gen: g.genID, tp: tp, next: next})
	b.notify()
	return nil
}

func (g *memGeneration) over(err error) bool { return errors.Is(err, errMemGenerationOver) }

type memReader struct {
	b         *memBroker
	topic     string
	partition int
	pos       int64
	closed    bool
}

func (r *memReader) seek(offset int64) error {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.closed {
		return errors.New("membroker: reader closed")
	}
	r.pos = offset
	return nil
}

func (r *memReader) fetch(ctx context.Context) (kafka.Message, error) {
	for {
		r.b.mu.Lock()
		if len(r.b.fetchErrs) > 0 {
			err := r.b.fetchErrs[0]
			r.b.fetchErrs = r.b.fetchErrs[1:]
			r.b.mu.Unlock()
			return kafka.Message{}, err
		}
		l := r.b.logs[r.topic][r.partition]
		pos := max(r.pos, l.start)
		for _, m := range l.msgs {
			if m.Offset >= pos {
				r.pos = m.Offset + 1
				r.b.mu.Unlock()
				m.Headers = slices.Clone(m.Headers)
				return m, nil
			}
		}
		ch := r.b.changed
		r.b.mu.Unlock()
		select {
		case <-ctx.Done():
			return kafka.Message{}, ctx.Err()
		case <-ch:
		}
	}
}

func (r *memReader) close() error {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.b.readers--
	}
	return nil
}

// recreate deletes topic and creates it again with n empty partitions.
func (b *memBroker) recreate(topic string, n int) {
	b.mu.Lock()
	delete(b.logs, topic)
	b.mu.Unlock()
	b.createTopic(topic, n)
}
