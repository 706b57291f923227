package consumer

// memBroker: an in-memory Kafka for the package's tests, behind package
// transport's interfaces. Partitions are logs in memory, the group keeps
// committed offsets and hands out generations that a test ends (rebalance)
// with the assignment it chooses, eagerly (every partition revoked, as
// kafka-go does) or, with cooperative set, cooperatively (only the
// partitions that move, as franz-go's cooperative-sticky does); dead
// letters are captured.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/transport"
)

var (
	errMemGenerationOver = errors.New("membroker: not a member of the current generation")
	errMemRebalance      = errors.New("membroker: rebalance")
	errMemGroupClosed    = errors.New("membroker: group closed")
	errMemRevoked        = errors.New("membroker: partition revoked")
)

type memBroker struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	logs    map[string][]*memLog
	// committed is the group's committed offset per partition.
	committed map[topicPartition]int64
	commits   []memCommit
	// gen is the current generation's id; genCancel ends it (eager).
	gen       int32
	genCancel context.CancelCauseFunc
	// cooperative makes the groups rebalance cooperatively: a generation's
	// Assigned lists only the partitions new to the member, and a
	// rebalance ends only the revoked partitions' functions, waiting for
	// them, before the next generation is handed out. rebalances counts
	// the rebalances asked for (by rebalance, or by a function returning
	// on its own); revocations records each revocation as acknowledged.
	cooperative bool
	// relist makes a cooperative group break its contract: Assigned lists
	// the partitions the member keeps too, and Start runs a second
	// function for them.
	relist      bool
	rebalances  int
	revocations []memRevocation
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

// memRevocation is a partition revoked from the member (cooperative):
// the group's committed offset when the revocation was acknowledged, after
// the partition's function returned.
type memRevocation struct {
	gen       int32 // the generation being formed
	tp        topicPartition
	committed int64 // -1: none
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
	b.rebalances++
	if b.genCancel != nil && !b.cooperative {
		b.genCancel(errMemRebalance)
	}
	b.notify()
}

// revoked returns the revocations acknowledged so far.
func (b *memBroker) revoked() []memRevocation {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.revocations)
}

// memTransport is one Consumer's client of a memBroker.
type memTransport struct{ b *memBroker }

// client returns a new client of the broker, for Config.Transport.
func (b *memBroker) client() transport.Client { return &memTransport{b: b} }

func (t *memTransport) Group(cfg transport.GroupConfig) (transport.Group, error) {
	return &memGroup{t: t, cfg: cfg, held: make(map[topicPartition]*memHold)}, nil
}

// reader opens a reader of the partition; b.mu is held.
func (b *memBroker) reader(topic string, partition int) *memReader {
	b.readers++
	return &memReader{b: b, topic: topic, partition: partition, pos: -1}
}

func (t *memTransport) LogOffsets(_ context.Context, topic string, partition int) (int64, int64, error) {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	ps := t.b.logs[topic]
	if partition >= len(ps) {
		return 0, 0, fmt.Errorf("membroker: no partition %s/%d", topic, partition)
	}
	return ps[partition].start, ps[partition].next, nil
}

func (t *memTransport) MissingTopics(_ context.Context, topics []string) ([]string, error) {
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

func (t *memTransport) DeadLetterWriter() transport.Writer { return memWriter{t.b} }

func (t *memTransport) Close() {
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

// memGroup is one member of the group. Eager, prev is the generation
// handed out last, whose context ends at the next rebalance. Cooperative,
// held is the partitions whose functions run (guarded by b.mu), each with
// a context of its own, and fns counts those functions.
type memGroup struct {
	t    *memTransport
	cfg  transport.GroupConfig
	prev *memGeneration

	joined bool
	seen   int  // the broker's rebalances this member followed
	rejoin bool // the last join failed: the next one does not wait
	held   map[topicPartition]*memHold
	extra  []*memHold // the holds relist started a second function over
	fns    sync.WaitGroup
}

// memHold is a partition a cooperative member runs a function for.
type memHold struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	ending bool // revoked or closed: its return is not a reason to rejoin
}

func (g *memGroup) Next(ctx context.Context) (transport.Generation, error) {
	b := g.t.b
	if b.cooperative {
		if err := g.revoke(ctx); err != nil {
			return nil, err
		}
	} else if g.prev != nil {
		select {
		case <-g.prev.ctx.Done():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		g.prev.fns.Wait()
		g.prev = nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.joinErrs) > 0 {
		err := b.joinErrs[0]
		b.joinErrs = b.joinErrs[1:]
		g.rejoin = true
		return nil, err
	}
	b.gen++
	gctx, cancel := context.WithCancelCause(context.Background())
	b.genCancel = cancel
	gen := &memGeneration{b: b, g: g, genID: b.gen, ctx: gctx, cancel: cancel, assigned: make(map[string][]transport.Assignment)}
	for topic, ps := range b.logs {
		if !slices.Contains(g.cfg.Topics, topic) {
			continue
		}
		for p := range ps {
			if b.assign != nil && !slices.Contains(b.assign[topic], p) {
				continue
			}
			if _, kept := g.held[topicPartition{topic, p}]; kept && !b.relist {
				continue // cooperative: runs on under the generation that started it
			}
			off, ok := b.committed[topicPartition{topic, p}]
			if !ok {
				off = g.cfg.StartOffset
			}
			gen.assigned[topic] = append(gen.assigned[topic], transport.Assignment{Topic: topic, Partition: p, Offset: off})
		}
	}
	g.prev = gen
	b.notify()
	return gen, nil
}

// revoke waits, after the member's first join, for the next rebalance;
// then it ends the functions of the partitions the new assignment takes
// from this member, waits for them to return and acknowledges the
// revocation. A partition whose function returned on its own is no longer
// held: it is assigned again.
func (g *memGroup) revoke(ctx context.Context) error {
	b := g.t.b
	b.mu.Lock()
	for g.joined && !g.rejoin && b.rebalances == g.seen {
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
		b.mu.Lock()
	}
	g.joined, g.rejoin, g.seen = true, false, b.rebalances
	revoked := make(map[topicPartition]*memHold)
	for tp, h := range g.held {
		select {
		case <-h.done:
			delete(g.held, tp)
			continue
		default:
		}
		if b.assign != nil && !slices.Contains(b.assign[tp.topic], tp.partition) {
			h.ending = true
			revoked[tp] = h
		}
	}
	b.mu.Unlock()
	for _, h := range revoked {
		h.cancel(errMemRevoked)
	}
	for tp, h := range revoked {
		<-h.done
		b.mu.Lock()
		delete(g.held, tp)
		committed, ok := b.committed[tp]
		if !ok {
			committed = -1
		}
		b.revocations = append(b.revocations, memRevocation{gen: b.gen + 1, tp: tp, committed: committed})
		b.mu.Unlock()
	}
	return nil
}

type memRejected struct{ error }

func (g *memGroup) Rejected(err error) bool {
	var r memRejected
	return errors.As(err, &r)
}

func (g *memGroup) Close() error {
	if g.prev != nil {
		g.prev.cancel(errMemGroupClosed)
		g.prev.fns.Wait()
	}
	b := g.t.b
	b.mu.Lock()
	for _, h := range append(slices.Collect(maps.Values(g.held)), g.extra...) {
		h.ending = true
		h.cancel(errMemGroupClosed)
	}
	b.mu.Unlock()
	g.fns.Wait()
	return nil
}

type memGeneration struct {
	b        *memBroker
	g        *memGroup
	genID    int32
	ctx      context.Context
	cancel   context.CancelCauseFunc
	fns      sync.WaitGroup
	assigned map[string][]transport.Assignment
}

func (g *memGeneration) ID() int32        { return g.genID }
func (g *memGeneration) MemberID() string { return "mem-member" }

func (g *memGeneration) Assigned(topic string) []transport.Assignment { return g.assigned[topic] }

func (g *memGeneration) Start(a transport.Assignment, fn func(ctx context.Context, r transport.PartitionReader)) {
	b := g.b
	b.mu.Lock()
	r := b.reader(a.Topic, a.Partition)
	if !b.cooperative {
		b.mu.Unlock()
		g.fns.Go(func() {
			defer g.cancel(errors.New("membroker: a function of the generation returned"))
			defer r.Close()
			fn(g.ctx, r)
		})
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &memHold{cancel: cancel, done: make(chan struct{})}
	if old, ok := g.g.held[topicPartition{a.Topic, a.Partition}]; ok {
		g.g.extra = append(g.g.extra, old)
	}
	g.g.held[topicPartition{a.Topic, a.Partition}] = h
	b.mu.Unlock()
	g.g.fns.Go(func() {
		defer func() {
			b.mu.Lock()
			if !h.ending {
				// The member's hold is in doubt: it rejoins.
				b.rebalances++
				b.notify()
			}
			close(h.done)
			b.mu.Unlock()
		}()
		defer r.Close()
		fn(ctx, r)
	})
}

func (g *memGeneration) Commit(topic string, partition int, next int64) error {
	b := g.b
	b.mu.Lock()
	defer b.mu.Unlock()
	tp := topicPartition{topic, partition}
	if b.cooperative {
		if _, ok := g.g.held[tp]; !ok {
			return errMemGenerationOver
		}
	} else if g.genID != b.gen {
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

func (g *memGeneration) Over(err error) bool { return errors.Is(err, errMemGenerationOver) }

type memReader struct {
	b         *memBroker
	topic     string
	partition int
	pos       int64
	closed    bool
	caughtUp  bool
}

func (r *memReader) CaughtUp() bool {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	return r.caughtUp
}

func (r *memReader) SetOffset(offset int64) error {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.closed {
		return errors.New("membroker: reader closed")
	}
	r.pos = offset
	return nil
}

func (r *memReader) Fetch(ctx context.Context) (kafka.Message, error) {
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
				r.caughtUp = r.pos >= l.next
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

func (r *memReader) Close() error {
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
