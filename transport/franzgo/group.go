package franzgo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxgo/inbox/transport"
)

// The causes a function's context ends with (context.Cause).
var (
	// ErrRevoked: a rebalance moved the partition to another member.
	ErrRevoked = errors.New("franzgo: the partition was revoked from this member by a rebalance")
	// ErrLost: the member lost its partitions without a rebalance handing
	// them over (its session expired, a commit found it fenced, or the
	// group coordinator refused it): another member may already run them.
	ErrLost = errors.New("franzgo: the partition was lost: this member's group session ended (session expired or fenced)")
	// ErrGroupClosed: Group.Close was called.
	ErrGroupClosed = errors.New("franzgo: the group membership was closed")
)

// errNotRunning is Commit's error for a partition no function of the
// generation runs (anymore): the member does not hold it.
var errNotRunning = errors.New("franzgo: commit for a partition this generation does not run")

// errRejected marks the group configuration franz-go refused.
type errRejected struct{ err error }

func (e errRejected) Error() string {
	return "franz-go rejected the group configuration: " + e.err.Error()
}
func (e errRejected) Unwrap() error { return e.err }

func (c *client) Group(cfg transport.GroupConfig) (transport.Group, error) {
	switch {
	case cfg.GroupID == "":
		return nil, errors.New("franz-go: the group id is empty")
	case len(cfg.Topics) == 0:
		return nil, errors.New("franz-go: the group names no topic")
	case cfg.StartOffset != transport.FirstOffset && cfg.StartOffset != transport.LastOffset:
		return nil, fmt.Errorf("franz-go: StartOffset %d is neither FirstOffset nor LastOffset", cfg.StartOffset)
	case cfg.SessionTimeout < 0 || cfg.HeartbeatInterval < 0 || cfg.RebalanceTimeout < 0 || cfg.MaxWait < 0 || cfg.JoinBackoff < 0:
		return nil, errors.New("franz-go: a group timeout is negative")
	}
	for _, t := range cfg.Topics {
		if t == "" {
			return nil, errors.New("franz-go: the group names an empty topic")
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &group{
		c: c, cfg: cfg, log: log,
		ctx: ctx, cancel: cancel,
		held:    map[tp]bool{},
		pending: map[tp]bool{},
		restart: map[tp]bool{},
		running: map[tp]*part{},
		wake:    make(chan struct{}, 1),
		errs:    make(chan error, 16),
	}, nil
}

type tp struct {
	topic     string
	partition int32
}

// part is one function Start runs.
type part struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	reader *reader
}

// group is one membership: member is the franz-go group member (fetching
// paused: it only joins, rebalances and commits), fetcher the direct
// consumer the readers' records come from.
type group struct {
	c   *client
	cfg transport.GroupConfig
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	member  *kgo.Client
	fetcher *fetcher
	loops   sync.WaitGroup

	mu     sync.Mutex
	joined bool
	closed bool
	// held: the partitions the group assigned to this member and did not
	// revoke. pending: those of them Next has not handed out yet.
	// restart: those whose function returned on its own, handed out again
	// after the next rejoin. running: the functions Start runs.
	held    map[tp]bool
	pending map[tp]bool
	// memberID and genID: the session of the last assignment, the
	// generation Next hands out.
	memberID string
	genID    int32
	restart  map[tp]bool
	running  map[tp]*part

	wake chan struct{}
	errs chan error
}

// join creates the two clients; the member starts joining at once.
func (g *group) join() error {
	common := g.c.common(g.log)
	fetchOpts := append(common,
		kgo.FetchMaxWait(max(g.cfg.MaxWait, 10*time.Millisecond)),
		kgo.FetchMaxBytes(transport.MaxFetchBytes),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	fcl, err := kgo.NewClient(append(fetchOpts, g.c.opts.ClientOptions...)...)
	if err != nil {
		return errRejected{err}
	}
	memberOpts := append(g.c.common(g.log),
		kgo.ConsumerGroup(g.cfg.GroupID),
		kgo.ConsumeTopics(g.cfg.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(g.assigned),
		kgo.OnPartitionsRevoked(g.revoked),
		kgo.OnPartitionsLost(g.lost),
		// It never fetches (its topics are paused below); should a fetch
		// slip in before the pause, it stays small.
		kgo.FetchMaxBytes(1),
		kgo.FetchMaxPartitionBytes(1),
	)
	if g.cfg.SessionTimeout > 0 {
		memberOpts = append(memberOpts, kgo.SessionTimeout(g.cfg.SessionTimeout))
	}
	if g.cfg.HeartbeatInterval > 0 {
		memberOpts = append(memberOpts, kgo.HeartbeatInterval(g.cfg.HeartbeatInterval))
	}
	if g.cfg.RebalanceTimeout > 0 {
		memberOpts = append(memberOpts, kgo.RebalanceTimeout(g.cfg.RebalanceTimeout))
	}
	if g.cfg.JoinBackoff > 0 {
		b := g.cfg.JoinBackoff
		memberOpts = append(memberOpts, kgo.RetryBackoffFn(func(int) time.Duration { return b }))
	}
	mcl, err := kgo.NewClient(append(memberOpts, g.c.opts.ClientOptions...)...)
	if err != nil {
		fcl.Close()
		return errRejected{err}
	}
	mcl.PauseFetchTopics(g.cfg.Topics...)
	g.member = mcl
	g.fetcher = newFetcher(fcl, g.log)
	g.loops.Add(2)
	go func() { defer g.loops.Done(); g.fetcher.run(g.ctx) }()
	go func() { defer g.loops.Done(); g.memberLoop() }()
	return nil
}

// memberLoop polls the member, which fetches nothing: its polls return
// the errors of the group management (failed joins, a refused
// configuration), which Next returns.
func (g *group) memberLoop() {
	for {
		fs := g.member.PollFetches(g.ctx)
		if fs.IsClientClosed() || g.ctx.Err() != nil {
			return
		}
		fs.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			g.log.Warn("franz-go: group member error", "topic", topic, "partition", partition, "error", err)
			select {
			case g.errs <- err:
			default:
			}
		})
	}
}

func (g *group) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// assigned runs after every join, with the partitions new to this member
// (possibly none): they, and the partitions to restart that the member
// still holds, become pending for Next.
func (g *group) assigned(_ context.Context, cl *kgo.Client, added map[string][]int32) {
	memberID, genID := cl.GroupMetadata()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.memberID, g.genID = memberID, genID
	for t, ps := range added {
		for _, p := range ps {
			k := tp{t, p}
			g.held[k] = true
			g.pending[k] = true
		}
	}
	for k := range g.restart {
		if g.running[k] != nil {
			continue // starts again after the join its return asks for
		}
		if g.held[k] {
			g.pending[k] = true
		}
		delete(g.restart, k)
	}
	if len(g.pending) > 0 {
		g.signal()
	}
	g.log.Debug("franz-go: partitions assigned", "added", added)
}

// revoked ends the functions of the revoked partitions and waits for them
// to return before franz-go acknowledges the revocation to the group.
func (g *group) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	g.drop(revoked, ErrRevoked)
}

// lost does as revoked: the functions must have returned before the
// member rejoins, which could hand it the same partitions again.
func (g *group) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	g.drop(lost, ErrLost)
}

func (g *group) drop(ps map[string][]int32, cause error) {
	var wait []*part
	g.mu.Lock()
	for t, parts := range ps {
		for _, p := range parts {
			k := tp{t, p}
			delete(g.held, k)
			delete(g.pending, k)
			delete(g.restart, k)
			if r := g.running[k]; r != nil {
				r.cancel(cause)
				wait = append(wait, r)
			}
		}
	}
	g.mu.Unlock()
	if len(ps) > 0 {
		g.log.Debug("franz-go: partitions taken away", "partitions", ps, "cause", cause, "running", len(wait))
	}
	for _, r := range wait {
		<-r.done
	}
}

func (g *group) Next(ctx context.Context) (transport.Generation, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrGroupClosed
	}
	if !g.joined {
		if err := g.join(); err != nil {
			g.mu.Unlock()
			return nil, err
		}
		g.joined = true
	}
	g.mu.Unlock()
	for {
		g.mu.Lock()
		var take []tp
		for k := range g.pending {
			take = append(take, k)
		}
		clear(g.pending)
		g.mu.Unlock()
		if len(take) > 0 {
			slices.SortFunc(take, func(a, b tp) int {
				return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
			})
			return g.generation(ctx, take)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-g.ctx.Done():
			return nil, ErrGroupClosed
		case err := <-g.errs:
			return nil, err
		case <-g.wake:
		}
	}
}

// generation builds the generation of the partitions take, with the
// group's committed offsets. If those cannot be read, the partitions go
// back to pending for the next call.
func (g *group) generation(ctx context.Context, take []tp) (transport.Generation, error) {
	g.mu.Lock()
	memberID, genID := g.memberID, g.genID
	g.mu.Unlock()
	offsets, err := g.committed(ctx, take)
	if err != nil {
		g.mu.Lock()
		for _, k := range take {
			if g.held[k] && g.running[k] == nil {
				g.pending[k] = true
			}
		}
		g.mu.Unlock()
		return nil, fmt.Errorf("franz-go: reading the group's committed offsets: %w", err)
	}
	gen := &generation{g: g, id: genID, memberID: memberID, assigned: map[string][]transport.Assignment{}, started: map[tp]*part{}}
	for _, k := range take {
		off, ok := offsets[k]
		if !ok || off < 0 {
			off = g.cfg.StartOffset
		}
		gen.assigned[k.topic] = append(gen.assigned[k.topic], transport.Assignment{Topic: k.topic, Partition: int(k.partition), Offset: off})
	}
	return gen, nil
}

// committed asks the coordinator for the group's committed offsets of ps
// (-1 for none).
func (g *group) committed(ctx context.Context, ps []tp) (map[tp]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = g.cfg.GroupID
	byTopic := map[string][]int32{}
	for _, k := range ps {
		byTopic[k.topic] = append(byTopic[k.topic], k.partition)
	}
	for t, parts := range byTopic {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic = t
		rt.Partitions = parts
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, g.member)
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	out := make(map[tp]int64, len(ps))
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
			}
			out[tp{t.Topic, p.Partition}] = p.Offset
		}
	}
	return out, nil
}

// Rejected: the errors retrying cannot cure, as kafka-go's transport
// tells them, and the configuration franz-go refused.
func (g *group) Rejected(err error) bool {
	var rej errRejected
	if errors.As(err, &rej) {
		return true
	}
	for _, e := range []error{
		kerr.InvalidSessionTimeout,
		kerr.InvalidGroupID,
		kerr.GroupAuthorizationFailed,
		kerr.TopicAuthorizationFailed,
		kerr.SaslAuthenticationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (g *group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	var wait []*part
	for _, r := range g.running {
		r.cancel(ErrGroupClosed)
		wait = append(wait, r)
	}
	g.mu.Unlock()
	for _, r := range wait {
		<-r.done
	}
	if g.member != nil {
		// Leaves the group: its revocation finds no function running.
		g.member.Close()
	}
	g.cancel()
	if g.fetcher != nil {
		g.fetcher.cl.Close()
	}
	g.loops.Wait()
	return nil
}

type generation struct {
	g        *group
	id       int32
	memberID string
	assigned map[string][]transport.Assignment

	mu      sync.Mutex
	started map[tp]*part
}

func (gen *generation) ID() int32        { return gen.id }
func (gen *generation) MemberID() string { return gen.memberID }

func (gen *generation) Assigned(topic string) []transport.Assignment {
	return append([]transport.Assignment(nil), gen.assigned[topic]...)
}

// Start does not run fn for a partition revoked since Next handed it out
// (or whose function still runs): the member no longer holds it, and a
// function of it could only commit over its new owner.
func (gen *generation) Start(a transport.Assignment, fn func(ctx context.Context, r transport.PartitionReader)) {
	g := gen.g
	k := tp{a.Topic, int32(a.Partition)}
	g.mu.Lock()
	if g.closed || !g.held[k] || g.running[k] != nil {
		g.mu.Unlock()
		g.log.Debug("franz-go: not starting a partition this member no longer holds", "topic", a.Topic, "partition", a.Partition)
		return
	}
	ctx, cancel := context.WithCancelCause(g.ctx)
	r := g.fetcher.reader(k, a.Offset)
	p := &part{cancel: cancel, done: make(chan struct{}), reader: r}
	g.running[k] = p
	g.mu.Unlock()
	gen.mu.Lock()
	gen.started[k] = p
	gen.mu.Unlock()
	go func() {
		defer func() {
			_ = r.Close()
			early := ctx.Err() == nil
			cancel(nil)
			g.mu.Lock()
			if g.running[k] == p {
				delete(g.running, k)
			}
			// Returned on its own (it doubts the member's hold on the
			// partition), or ended by fenced: the member rejoins, and
			// the partition starts again after the join if the member
			// still holds it.
			rejoin := g.held[k] && !g.closed && (early || errors.Is(context.Cause(ctx), ErrLost))
			if rejoin {
				g.restart[k] = true
			}
			g.mu.Unlock()
			close(p.done)
			if rejoin {
				g.log.Warn("franz-go: a partition's function returned while the member holds it; rejoining the group", "topic", a.Topic, "partition", a.Partition)
				g.member.ForceRebalance()
			}
		}()
		fn(ctx, r)
	}()
}

func (gen *generation) Commit(topic string, partition int, next int64) error {
	k := tp{topic, int32(partition)}
	gen.mu.Lock()
	p := gen.started[k]
	gen.mu.Unlock()
	gen.g.mu.Lock()
	ok := p != nil && gen.g.running[k] == p
	gen.g.mu.Unlock()
	if !ok {
		return errNotRunning
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var rerr error
	gen.g.member.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{topic: {int32(partition): {Epoch: -1, Offset: next}}},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				rerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						rerr = err
						return
					}
				}
			}
		})
	if rerr != nil {
		err := fmt.Errorf("franz-go: committing %s/%d at %d: %w", topic, partition, next, rerr)
		if gen.Over(err) {
			gen.g.fenced(err)
		}
		return err
	}
	return nil
}

// fenced ends every running function: the coordinator no longer counts
// this member. franz-go rejoins at once as a new member and, cooperative,
// keeps claiming the partitions it held, without calling OnPartitionsLost;
// so the functions end here, and each partition the new member still
// holds starts again under the new generation once its function returned
// (see Start).
func (g *group) fenced(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.running) == 0 {
		return
	}
	g.log.Warn("franz-go: a commit found this member fenced out of the group; ending its partitions' functions", "error", err)
	for _, p := range g.running {
		p.cancel(ErrLost)
	}
}

// Over: the OffsetCommit response's codes that say the coordinator no
// longer counts this member in the generation. REBALANCE_IN_PROGRESS is
// not among them: a member of the current generation gets it while the
// next one forms.
func (gen *generation) Over(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.IllegalGeneration) ||
		errors.Is(err, kerr.FencedInstanceID) || errors.Is(err, errNotRunning)
}
