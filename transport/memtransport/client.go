package memtransport

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
	errGenerationOver = errors.New("memtransport: not a member of the current generation")
	errGroupClosed    = errors.New("memtransport: group closed")
	errRevoked        = errors.New("memtransport: partition revoked")
	errReturned       = errors.New("memtransport: a function of the generation returned")
)

// The bounds of a session timeout a broker accepts by default
// (group.min.session.timeout.ms, group.max.session.timeout.ms).
const (
	minSessionTimeout = 6 * time.Second
	maxSessionTimeout = 30 * time.Minute
)

// rejectedError is a join the coordinator refuses for good.
type rejectedError struct{ error }

func (e rejectedError) Unwrap() error { return e.error }

// client is one consumer's client of a Cluster.
type client struct {
	c    *Cluster
	mode Rebalancing
}

func (t *client) Group(cfg transport.GroupConfig) (transport.Group, error) {
	if cfg.GroupID == "" || len(cfg.Topics) == 0 {
		return nil, errors.New("memtransport: a group needs an id and topics")
	}
	cfg.Topics = slices.Clone(cfg.Topics)
	return &group{t: t, mode: t.mode, cfg: cfg, held: make(map[topicPartition]*hold)}, nil
}

func (t *client) LogOffsets(_ context.Context, topic string, partition int) (int64, int64, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	l, err := t.c.log(topic, partition)
	if err != nil {
		return 0, 0, err
	}
	return l.start, l.next, nil
}

func (t *client) MissingTopics(_ context.Context, topics []string) ([]string, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	var out []string
	for _, topic := range topics {
		if _, ok := t.c.topics[topic]; !ok {
			out = append(out, topic)
		}
	}
	return out, nil
}

func (t *client) DeadLetterWriter() transport.Writer { return writer{t.c} }

func (t *client) Close() {}

// writer is the dead-letter writer: it appends to the topic each message
// names, partitioned by kafka.Hash of the key.
type writer struct{ c *Cluster }

func (w writer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if err := w.c.fault(OpDeadLetter); err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Topic == "" {
			return errors.New("memtransport: a message without a topic")
		}
		if _, ok := w.c.topics[m.Topic]; !ok {
			return fmt.Errorf("memtransport: topic %q: %w", m.Topic, kafka.UnknownTopicOrPartition)
		}
	}
	for _, m := range msgs {
		if err := w.c.appendBalanced(m.Topic, &w.c.dlqKeys, []kafka.Message{m}); err != nil {
			return err
		}
	}
	return nil
}

// group is the one member of a consumer group. Eager, prev is the
// generation handed out last, whose context ends at the next rebalance.
// Cooperative, held is the partitions whose functions run (guarded by
// c.mu), each with a context of its own, and fns counts those functions.
type group struct {
	t    *client
	mode Rebalancing
	cfg  transport.GroupConfig
	prev *generation

	joined bool
	seen   int  // the group's rebalances this member followed
	rejoin bool // the last join failed: the next one does not wait
	held   map[topicPartition]*hold
	extra  []*hold // the holds a second Start of a held partition replaced
	fns    sync.WaitGroup
}

// hold is a partition a cooperative member runs a function for.
type hold struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	ending bool // revoked or closed: its return is not a reason to rejoin
}

func (g *group) Next(ctx context.Context) (transport.Generation, error) {
	c := g.t.c
	if g.mode == Cooperative {
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.fault(OpJoin); err != nil {
		g.rejoin = true
		return nil, err
	}
	if st := g.cfg.SessionTimeout; st != 0 && (st < minSessionTimeout || st > maxSessionTimeout) {
		return nil, rejectedError{fmt.Errorf("memtransport: session timeout %v outside the broker's %v to %v: %w",
			st, minSessionTimeout, maxSessionTimeout, kafka.InvalidSessionTimeout)}
	}
	gs := c.group(g.cfg.GroupID)
	if gs.member != nil && gs.member != g {
		return nil, rejectedError{fmt.Errorf("memtransport: group %q has a member already: the cluster models one member per group (Cluster.Rebalance stands for the others)", g.cfg.GroupID)}
	}
	gs.member = g
	gs.gen++
	gctx, cancel := context.WithCancelCause(context.Background())
	gs.genCancel = cancel
	gen := &generation{c: c, g: g, gs: gs, id: gs.gen, ctx: gctx, cancel: cancel, assigned: make(map[string][]transport.Assignment)}
	for _, topic := range g.cfg.Topics {
		for _, p := range c.partitions(topic) {
			if gs.keep != nil && !slices.Contains(gs.keep[topic], p) {
				continue
			}
			if _, kept := g.held[topicPartition{topic, p}]; kept {
				continue // cooperative: runs on under the generation that started it
			}
			off, ok := gs.committed[topicPartition{topic, p}]
			if !ok {
				off = g.cfg.StartOffset
			}
			gen.assigned[topic] = append(gen.assigned[topic], transport.Assignment{Topic: topic, Partition: p, Offset: off})
		}
	}
	g.prev = gen
	c.notify()
	return gen, nil
}

// revoke waits, after the member's first join, for the next rebalance;
// then it ends the functions of the partitions the new assignment takes
// from this member and waits for them to return, which acknowledges the
// revocation. A partition whose function returned on its own is no longer
// held: it is assigned again.
func (g *group) revoke(ctx context.Context) error {
	c := g.t.c
	c.mu.Lock()
	gs := c.group(g.cfg.GroupID)
	for g.joined && !g.rejoin && gs.rebalances == g.seen {
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
		c.mu.Lock()
	}
	g.joined, g.rejoin, g.seen = true, false, gs.rebalances
	revoked := make(map[topicPartition]*hold)
	for tp, h := range g.held {
		select {
		case <-h.done:
			delete(g.held, tp)
			continue
		default:
		}
		_, exists := c.topics[tp.topic]
		if !exists || gs.keep != nil && !slices.Contains(gs.keep[tp.topic], tp.partition) {
			h.ending = true
			revoked[tp] = h
		}
	}
	c.mu.Unlock()
	for _, h := range revoked {
		h.cancel(errRevoked)
	}
	for tp, h := range revoked {
		<-h.done
		c.mu.Lock()
		delete(g.held, tp)
		c.mu.Unlock()
	}
	return nil
}

func (g *group) Rejected(err error) bool {
	var r rejectedError
	return errors.As(err, &r)
}

func (g *group) Close() error {
	if g.prev != nil {
		g.prev.cancel(errGroupClosed)
		g.prev.fns.Wait()
	}
	c := g.t.c
	c.mu.Lock()
	for _, h := range append(slices.Collect(maps.Values(g.held)), g.extra...) {
		h.ending = true
		h.cancel(errGroupClosed)
	}
	c.mu.Unlock()
	g.fns.Wait()
	c.mu.Lock()
	if gs := c.group(g.cfg.GroupID); gs.member == g {
		gs.member = nil
	}
	c.notify()
	c.mu.Unlock()
	return nil
}

// generation is one generation of a group, as its member sees it.
type generation struct {
	c        *Cluster
	g        *group
	gs       *groupState
	id       int32
	ctx      context.Context
	cancel   context.CancelCauseFunc
	fns      sync.WaitGroup
	assigned map[string][]transport.Assignment
}

func (g *generation) ID() int32        { return g.id }
func (g *generation) MemberID() string { return "memtransport-" + g.g.cfg.GroupID }

func (g *generation) Assigned(topic string) []transport.Assignment {
	return slices.Clone(g.assigned[topic])
}

func (g *generation) Start(a transport.Assignment, fn func(ctx context.Context, r transport.PartitionReader)) {
	c := g.c
	r := &reader{c: c, topic: a.Topic, partition: a.Partition, pos: -1}
	if g.g.mode == Eager {
		g.fns.Go(func() {
			defer g.cancel(errReturned)
			defer r.Close()
			fn(g.ctx, r)
		})
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &hold{cancel: cancel, done: make(chan struct{})}
	tp := topicPartition{a.Topic, a.Partition}
	c.mu.Lock()
	if old, ok := g.g.held[tp]; ok {
		// Against the contract (the partition's function still runs): the
		// old hold is ended at Close all the same.
		g.g.extra = append(g.g.extra, old)
	}
	g.g.held[tp] = h
	c.mu.Unlock()
	g.g.fns.Go(func() {
		defer func() {
			c.mu.Lock()
			if !h.ending {
				// The member's hold is in doubt: it rejoins.
				g.gs.rebalances++
				c.notify()
			}
			close(h.done)
			c.mu.Unlock()
		}()
		defer r.Close()
		fn(ctx, r)
	})
}

func (g *generation) Commit(topic string, partition int, next int64) error {
	c := g.c
	c.mu.Lock()
	defer c.mu.Unlock()
	tp := topicPartition{topic, partition}
	if g.g.mode == Cooperative {
		h, ok := g.g.held[tp]
		if !ok || g.gs.member != g.g {
			return errGenerationOver
		}
		select {
		case <-h.done:
			return errGenerationOver
		default:
		}
	} else if g.id != g.gs.gen || g.gs.member != g.g {
		return errGenerationOver
	}
	if err := c.fault(OpCommit); err != nil {
		return err
	}
	g.gs.committed[tp] = next
	c.notify()
	return nil
}

func (g *generation) Over(err error) bool { return errors.Is(err, errGenerationOver) }

// reader reads one partition's log.
type reader struct {
	c         *Cluster
	topic     string
	partition int
	pos       int64
	closed    bool
	caughtUp  bool
}

func (r *reader) CaughtUp() bool {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.caughtUp
}

func (r *reader) SetOffset(offset int64) error {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.closed {
		return errors.New("memtransport: reader closed")
	}
	r.pos = offset
	return nil
}

func (r *reader) Fetch(ctx context.Context) (kafka.Message, error) {
	for {
		r.c.mu.Lock()
		if r.closed {
			r.c.mu.Unlock()
			return kafka.Message{}, errors.New("memtransport: reader closed")
		}
		if err := r.c.fault(OpFetch); err != nil {
			r.c.mu.Unlock()
			return kafka.Message{}, err
		}
		l, err := r.c.log(r.topic, r.partition)
		if err != nil {
			r.c.mu.Unlock()
			return kafka.Message{}, err
		}
		// The log holds offsets start to next-1, one message each.
		if pos := max(r.pos, l.start); pos < l.next {
			m := l.msgs[pos-l.start]
			r.pos = pos + 1
			r.caughtUp = r.pos >= l.next
			r.c.mu.Unlock()
			m.Headers = slices.Clone(m.Headers)
			return m, nil
		}
		ch := r.c.changed
		r.c.mu.Unlock()
		select {
		case <-ctx.Done():
			return kafka.Message{}, ctx.Err()
		case <-ch:
		}
	}
}

func (r *reader) Close() error {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	r.closed = true
	return nil
}
