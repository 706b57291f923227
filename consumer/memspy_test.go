package consumer

// spy wraps a memtransport client with what the package's tests assert
// and inject beyond the cluster's own API: the readers left open, the
// client's Close, each commit with its generation, the partitions' ends,
// commits refused as from a fenced member, a dead-letter writer that
// always fails, and a client that breaks the contract by starting a kept
// partition again.

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/transport"
	"github.com/inboxgo/inbox/transport/memtransport"
)

var errSpyFenced = errors.New("spy: this member's generation is over")

type spy struct {
	cluster *memtransport.Cluster

	mu      sync.Mutex
	readers int // open
	closed  int // Client.Close calls
	commits []spyCommit
	ends    []spyEnd
	// commitErr, when set, decides the commits' errors before the
	// cluster's; errSpyFenced is one the consumer reads as fenced out.
	commitErr func(partition int, next int64) error
	// deadErr, when set, fails every dead-letter write.
	deadErr error
	// relist makes a cooperative client break its contract: Assigned
	// lists the partitions the member keeps too, and Start runs a second
	// function for them.
	relist bool
}

type spyCommit struct {
	gen       int32
	partition int
	next      int64
}

// spyEnd is a partition's function that returned after the client ended
// its context (a revocation, a rebalance, Close): the group's committed
// offset then (-1: none), before the client went on.
type spyEnd struct {
	partition int
	committed int64
}

func (s *spy) set(f func(s *spy)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *spy) openReaders() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readers
}

func (s *spy) closes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *spy) commitLog() []spyCommit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.commits)
}

// revoked returns the functions' ends so far.
func (s *spy) revoked() []spyEnd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ends)
}

func (s *spy) wrap(c transport.Client) transport.Client { return &spyClient{Client: c, s: s} }

type spyClient struct {
	transport.Client
	s *spy
}

func (c *spyClient) Group(cfg transport.GroupConfig) (transport.Group, error) {
	g, err := c.Client.Group(cfg)
	if err != nil {
		return nil, err
	}
	return &spyGroup{Group: g, s: c.s, cfg: cfg, running: map[int]bool{}}, nil
}

func (c *spyClient) DeadLetterWriter() transport.Writer {
	return spyWriter{w: c.Client.DeadLetterWriter(), s: c.s}
}

func (c *spyClient) Close() {
	c.s.set(func(s *spy) { s.closed++ })
	c.Client.Close()
}

type spyWriter struct {
	w transport.Writer
	s *spy
}

func (w spyWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	w.s.mu.Lock()
	err := w.s.deadErr
	w.s.mu.Unlock()
	if err != nil {
		return err
	}
	return w.w.WriteMessages(ctx, msgs...)
}

type spyGroup struct {
	transport.Group
	s   *spy
	cfg transport.GroupConfig

	mu      sync.Mutex
	running map[int]bool // the partitions (of the first topic) whose function runs
}

func (g *spyGroup) Next(ctx context.Context) (transport.Generation, error) {
	gen, err := g.Group.Next(ctx)
	if err != nil {
		return nil, err
	}
	return &spyGeneration{Generation: gen, g: g}, nil
}

type spyGeneration struct {
	transport.Generation
	g *spyGroup
}

func (gen *spyGeneration) Assigned(topic string) []transport.Assignment {
	as := gen.Generation.Assigned(topic)
	s := gen.g.s
	s.mu.Lock()
	relist := s.relist
	s.mu.Unlock()
	if !relist {
		return as
	}
	gen.g.mu.Lock()
	defer gen.g.mu.Unlock()
	for p := range gen.g.running {
		if slices.ContainsFunc(as, func(a transport.Assignment) bool { return a.Partition == p }) {
			continue
		}
		off, ok := s.cluster.Committed(gen.g.cfg.GroupID, topic, p)
		if !ok {
			off = gen.g.cfg.StartOffset
		}
		as = append(as, transport.Assignment{Topic: topic, Partition: p, Offset: off})
	}
	return as
}

func (gen *spyGeneration) Start(a transport.Assignment, fn func(ctx context.Context, r transport.PartitionReader)) {
	s := gen.g.s
	gen.g.mu.Lock()
	gen.g.running[a.Partition] = true
	gen.g.mu.Unlock()
	gen.Generation.Start(a, func(ctx context.Context, r transport.PartitionReader) {
		s.set(func(s *spy) { s.readers++ })
		sr := &spyReader{PartitionReader: r, s: s}
		fn(ctx, sr)
		sr.Close() // as the client does
		gen.g.mu.Lock()
		delete(gen.g.running, a.Partition)
		gen.g.mu.Unlock()
		if ctx.Err() != nil {
			committed, ok := s.cluster.Committed(gen.g.cfg.GroupID, a.Topic, a.Partition)
			if !ok {
				committed = -1
			}
			s.set(func(s *spy) { s.ends = append(s.ends, spyEnd{partition: a.Partition, committed: committed}) })
		}
	})
}

func (gen *spyGeneration) Commit(topic string, partition int, next int64) error {
	s := gen.g.s
	s.mu.Lock()
	f := s.commitErr
	s.mu.Unlock()
	if f != nil {
		if err := f(partition, next); err != nil {
			return err
		}
	}
	if err := gen.Generation.Commit(topic, partition, next); err != nil {
		return err
	}
	s.set(func(s *spy) {
		s.commits = append(s.commits, spyCommit{gen: gen.ID(), partition: partition, next: next})
	})
	return nil
}

func (gen *spyGeneration) Over(err error) bool {
	return errors.Is(err, errSpyFenced) || gen.Generation.Over(err)
}

type spyReader struct {
	transport.PartitionReader
	s    *spy
	once sync.Once
}

func (r *spyReader) Close() error {
	r.once.Do(func() { r.s.set(func(s *spy) { s.readers-- }) })
	return r.PartitionReader.Close()
}
