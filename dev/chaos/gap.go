package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// The gap phase (RunGap): the relay of the chain's aligned outbox A loses
// one message on purpose (inventory.ChainProcessConfig.Drop: the message
// is never sent, yet reported published, so no relay sends it again).
// Service B trusts A's source and detects gaps: the partition of the lost
// message must stop at the next message of its stream, with
// consumer.ReasonSequenceGap naming the stream and the missing number,
// while the other partitions go on; a consumer started afterwards must
// stop there again (the watermark holds what was applied), and nothing
// after the gap may be applied. A loss nobody notices is the failure this
// phase exists to catch.

// GapConfig sizes the gap phase.
type GapConfig struct {
	Rounds int           // rounds, each on a chain of its own with one message dropped; default 3
	Orders int           // orders service A places per round; default 300
	Budget time.Duration // longest wait for each stop and for the other partitions' reservations; default 1 min
}

func (gc *GapConfig) defaults() {
	if gc.Rounds <= 0 {
		gc.Rounds = 3
	}
	if gc.Orders <= 0 {
		gc.Orders = 300
	}
	if gc.Budget <= 0 {
		gc.Budget = time.Minute
	}
}

// gapStarts is how many consumer processes of B, one after the other, meet
// the gap in a round: the one running when the message is lost, and one
// started after it stopped, which finds the gap from the stored watermark.
const gapStarts = 2

// GapRound is what one round of the gap phase saw.
type GapRound struct {
	Partition int    // the lost message's partition, which is its shard
	Seq       int64  // its number in the stream
	EventID   string // its event id
	InStream  int    // messages of its stream (the partition's), the lost one included
	Source    string // outbox A's source id
	Epoch     int64
	// Dropped: the relay said it dropped the message (inventory.InjectedDrop).
	Dropped bool
	// Stops are the stopped partitions B's consumer processes recorded, in
	// the order of the processes; Named those of them that stopped the
	// lost message's partition at the next message of its stream with
	// ReasonSequenceGap and an error naming the stream and the missing
	// number, and Loud those of them whose process logged PARTITION
	// STOPPED at Error.
	Stops        []inventory.Stop
	Named, Loud  int
	AppliedAfter int   // orders of the stream after the gap that B reserved: must be 0
	Expected     int   // orders B must have reserved: every other partition's, and the stream's before the gap
	Lost, Twice  int64 // of those, never reserved / reserved more than once
	Reordered    int64 // events B applied out of their key's order
	TopicGaps    []inventory.StreamGap
	TopicMissing int // event ids missing from the topic: the lost one alone
	// DetectIn is the time from the relay's drop to the first stop, as the
	// driver saw both (polling every 50 ms).
	DetectIn time.Duration
	Problems []string
}

// GapReport holds the figures of a gap phase.
type GapReport struct {
	Dialect string
	Seed    uint64
	Orders  int // per round
	Rounds  []*GapRound
	Wall    time.Duration
}

// Problems lists what went wrong, by round.
func (r *GapReport) Problems() []string {
	var p []string
	for i, g := range r.Rounds {
		for _, s := range g.Problems {
			p = append(p, fmt.Sprintf("round %d: %s", i+1, s))
		}
	}
	return p
}

// OK reports whether every round's checks held.
func (r *GapReport) OK() bool { return len(r.Problems()) == 0 }

// Detections returns how many times a consumer stopped at the gap naming
// it, and how many times it should have.
func (r *GapReport) Detections() (named, want int) {
	for _, g := range r.Rounds {
		named += g.Named
	}
	return named, gapStarts * len(r.Rounds)
}

func (r *GapReport) String() string {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	f("gap phase on %s (seed %d): relay A loses one message of its aligned outbox per round; B, trusting A's source, must stop there", r.Dialect, r.Seed)
	for i, g := range r.Rounds {
		f("  round %d: dropped seq %d of %d on partition %d (%s); %d stops, %d named the stream and the missing number (%d loud); %d after the gap applied; %d/%d others reserved (%d lost, %d twice); detected %.1fs after the drop",
			i+1, g.Seq, g.InStream, g.Partition, g.EventID, len(g.Stops), g.Named, g.Loud, g.AppliedAfter, int64(g.Expected)-g.Lost, g.Expected, g.Lost, g.Twice, g.DetectIn.Seconds())
		for _, st := range g.Stops[:min(len(g.Stops), 1)] {
			f("      %s/%d offset %d: %s: %s", st.Topic, st.Partition, st.Offset, st.Reason, st.Err)
		}
	}
	named, want := r.Detections()
	f("  gap detected             %d of %d times", named, want)
	f("  wall time                %7.1fs", r.Wall.Seconds())
	writeVerdict(f, nil, nil, r.Problems(), "every lost message stopped its partition with sequence-gap, naming the stream and the number, and nothing after it was applied")
	return b.String()
}

// GapTable is the markdown table of docs/RELIABILITY.md's gap section.
func GapTable(reps []*GapReport) string {
	var b strings.Builder
	b.WriteString("| database | rounds | orders per round | messages dropped | gap detected (stops naming the stream and number / consumer starts) | logged PARTITION STOPPED at Error | applied after the gap | others lost / twice | reordered | detected after the drop (s) | wall time |\n")
	b.WriteString("|---|---:|---:|---:|---|---:|---:|---|---:|---|---:|\n")
	for _, r := range reps {
		dropped, loud, after, reordered := 0, 0, 0, int64(0)
		var lost, twice int64
		var detect []time.Duration
		for _, g := range r.Rounds {
			if g.Dropped {
				dropped++
			}
			loud += g.Loud
			after += g.AppliedAfter
			lost += g.Lost
			twice += g.Twice
			reordered += g.Reordered
			if g.Named > 0 {
				detect = append(detect, g.DetectIn)
			}
		}
		named, want := r.Detections()
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d / %d | %d | %d | %d / %d | %d | %s | %.0fs |\n",
			r.Dialect, len(r.Rounds), r.Orders, dropped, named, want, loud, after, lost, twice, reordered, spreadOf(detect), r.Wall.Seconds())
	}
	return b.String()
}

// RunGap runs the gap phase on cfg's database (Config gives the database,
// the brokers, Partitions, Session, Seed, WorkDir and Log; nothing is
// killed or restarted). An error means a round could not be carried out;
// a failed check is in the report's Problems.
func RunGap(ctx context.Context, cfg Config, gc GapConfig) (*GapReport, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	gc.defaults()
	start := time.Now()
	rep := &GapReport{Dialect: cfg.Dialect, Seed: cfg.Seed, Orders: gc.Orders}
	rng := rand.New(rand.NewPCG(cfg.Seed, 16))
	defer func() { rep.Wall = time.Since(start) }()
	for i := range gc.Rounds {
		g := &gapRound{cfg: cfg, gc: gc, rng: rng, n: i + 1, errs: &errorLog{kinds: map[string]*errorKind{}}, res: &GapRound{}}
		err := g.run(ctx)
		rep.Rounds = append(rep.Rounds, g.res)
		if err != nil {
			return rep, fmt.Errorf("gap round %d: %w", i+1, err)
		}
	}
	return rep, nil
}

// gapRound is one round: a chain of its own (tables, topic), relay A with
// a message to drop, and B's consumers one after the other.
type gapRound struct {
	cfg  Config
	gc   GapConfig
	rng  *rand.Rand
	n    int
	errs *errorLog
	res  *GapRound

	chain inventory.Chain
	db    *gorm.DB
	procs []*proc
	pwg   sync.WaitGroup
}

func (g *gapRound) say(format string, args ...any) {
	fmt.Fprintf(g.cfg.Log, "chaos %s %s: gap round %d: %s\n", time.Now().Format("15:04:05.0"), g.cfg.Dialect, g.n, fmt.Sprintf(format, args...))
}

func (g *gapRound) run(ctx context.Context) error {
	runID := fmt.Sprintf("%08x", rand.Uint32())
	g.chain = inventory.Chain{Backend: backendFor(g.cfg, runID), Partitions: g.cfg.Partitions}
	var err error
	if g.db, err = g.chain.Open(); err != nil {
		return err
	}
	defer closeDB(g.db)
	log := slog.New(slog.NewTextHandler(g.cfg.Log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := g.chain.Setup(ctx, g.db, inventory.SKUs, log); err != nil {
		g.chain.Drop(ctx, g.db)
		return fmt.Errorf("chain setup: %w", err)
	}
	defer g.chain.Drop(ctx, g.db)
	topic := g.chain.OrdersTopic()
	if err := inventory.CreateReplicatedTopic(ctx, g.cfg.Brokers[0], topic, g.cfg.Partitions, g.cfg.Replicas); err != nil {
		return err
	}
	defer deleteTopic(g.cfg.Brokers, topic)
	defer g.stopAll()

	// The orders are all in the outbox before the relay starts, so that
	// the lost message can be chosen among them with messages of its
	// stream on both sides.
	orders := inventory.ChainOrders(runID, g.gc.Orders, inventory.SKUs)
	ob, err := g.chain.NewOutbox(g.db, inventory.StageOrders, log)
	if err != nil {
		return err
	}
	for _, o := range orders {
		octx, cancel := context.WithTimeout(ctx, time.Minute)
		err := g.chain.PlaceOrder(octx, g.db, ob, o)
		cancel()
		if err != nil {
			return err
		}
	}
	streams, err := g.streams(ctx)
	if err != nil {
		return err
	}
	if g.res.Source, g.res.Epoch, err = g.chain.Source(ctx, g.db, inventory.StageOrders); err != nil {
		return err
	}
	// Not the first number of a stream: a new group takes a stream's first
	// number for its start, so only a later one is a gap.
	var shards []int32
	for s, rows := range streams {
		if len(rows) >= 3 {
			shards = append(shards, s)
		}
	}
	if len(shards) == 0 {
		return fmt.Errorf("no stream of 3 messages or more among %d orders", len(orders))
	}
	slices.Sort(shards)
	shard := shards[g.rng.IntN(len(shards))]
	stream := streams[shard]
	// Neither the first nor the last, and in the first half, so that the
	// stream goes on well past the gap.
	lost := stream[1+g.rng.IntN(max((len(stream)-2)/2, 1))]
	next := stream[lost.Seq] // numbered from 1
	g.res.Partition, g.res.Seq, g.res.EventID, g.res.InStream = int(shard), lost.Seq, lost.EventID, len(stream)
	g.say("%d orders in the outbox; relay A will drop partition %d's seq %d of %d (%s)", len(orders), shard, lost.Seq, len(stream), lost.EventID)

	relay, err := g.start(ctx, "relay-orders", inventory.ChainProcessConfig{
		Role: inventory.RoleRelay, Stage: inventory.StageOrders, RelayID: "gap-relay-" + runID, Lease: 2 * time.Second,
		Drop: &inventory.SeqPos{Shard: shard, Seq: lost.Seq},
	})
	if err != nil {
		return err
	}
	group := "gap-reserve-" + runID
	var dropAt time.Time
	for i := 1; i <= gapStarts; i++ {
		name := fmt.Sprintf("consumer-reserve-%d", i)
		cons, err := g.start(ctx, name, inventory.ChainProcessConfig{
			Role: inventory.RoleConsumer, Stage: inventory.StageReserve, Group: group, Session: g.cfg.Session,
			EventLog: g.eventLog(name), StoreOffsets: g.cfg.StoreOffsets,
		})
		if err != nil {
			return err
		}
		st, at, ok := g.awaitStop(ctx, cons, relay, &dropAt)
		if !ok {
			g.res.Problems = append(g.res.Problems, fmt.Sprintf("%s did not stop within %v (%s)", name, g.gc.Budget, cons.out.tail()))
		} else {
			g.judgeStop(st, topic, next, cons)
			if i == 1 && !dropAt.IsZero() {
				g.res.DetectIn = at.Sub(dropAt)
			}
			g.say("%s stopped partition %d at offset %d: %s", name, st.Partition, st.Offset, st.Reason)
		}
		if i == 1 {
			// The other partitions, and the stream up to the gap, must be
			// unaffected by the stop.
			if err := g.awaitOthers(ctx, streams); err != nil {
				return err
			}
		}
		g.stop(cons)
	}
	g.res.Dropped = strings.Contains(g.readLog("relay-orders"), inventory.InjectedDrop)
	g.stopAll()
	return g.verify(ctx, orders, streams, lost, next)
}

// streams returns outbox A's rows by shard, each in sequence order
// numbered from 1 without a hole: what the relay stamps.
func (g *gapRound) streams(ctx context.Context) (map[int32][]inventory.OutboxEntry, error) {
	rows, err := g.chain.OutboxEntries(ctx, g.db, inventory.StageOrders)
	if err != nil {
		return nil, err
	}
	out := map[int32][]inventory.OutboxEntry{}
	for _, r := range rows {
		if r.Seq != int64(len(out[r.Shard])+1) {
			return nil, fmt.Errorf("outbox A: shard %d holds seq %d after %d rows", r.Shard, r.Seq, len(out[r.Shard]))
		}
		out[r.Shard] = append(out[r.Shard], r)
	}
	return out, nil
}

func (g *gapRound) eventLog(name string) string {
	return filepath.Join(g.cfg.WorkDir, fmt.Sprintf("gap-%d-events-%s.log", g.n, name))
}

func (g *gapRound) logPath(name string) string {
	return filepath.Join(g.cfg.WorkDir, fmt.Sprintf("gap-%d-%s.log", g.n, name))
}

func (g *gapRound) readLog(name string) string {
	b, _ := os.ReadFile(g.logPath(name))
	return string(b)
}

// start starts a chain process of the round.
func (g *gapRound) start(ctx context.Context, name string, pc inventory.ChainProcessConfig) (*proc, error) {
	logFile, err := os.OpenFile(g.logPath(name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	pc.Chain, pc.Name, pc.Brokers = g.chain, name, g.cfg.Brokers
	w := &watcher{file: logFile, errors: g.errs}
	// The process is not bound to ctx: it is always ended by the round.
	cmd, err := inventory.StartChainProcess(context.WithoutCancel(ctx), pc, w)
	if err != nil {
		logFile.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, out: w, done: make(chan struct{})}
	g.pwg.Go(func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	})
	g.procs = append(g.procs, p)
	return p, nil
}

// stop ends a process (SIGTERM, then SIGKILL after 30 s).
func (g *gapRound) stop(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if reap(p, 30*time.Second) != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = reap(p, 30*time.Second)
	}
}

func (g *gapRound) stopAll() {
	for _, p := range g.procs {
		g.stop(p)
	}
	g.procs = nil
	g.pwg.Wait()
}

// awaitStop waits, within the budget, for cons to record a stopped
// partition, noting in dropAt when the relay first said it dropped the
// message. It returns the first stop and when it was seen.
func (g *gapRound) awaitStop(ctx context.Context, cons, relay *proc, dropAt *time.Time) (inventory.Stop, time.Time, bool) {
	deadline := time.Now().Add(g.gc.Budget)
	for time.Now().Before(deadline) {
		if dropAt.IsZero() && strings.Contains(g.readLog(relay.name), inventory.InjectedDrop) {
			*dropAt = time.Now()
		}
		out, err := inventory.CountOutcomes(g.eventLog(cons.name))
		if err == nil && len(out.Stops) > 0 {
			return out.Stops[0], time.Now(), true
		}
		select {
		case <-cons.done:
			return inventory.Stop{}, time.Time{}, false
		default:
		}
		if backoff.Sleep(ctx, 50*time.Millisecond) != nil {
			return inventory.Stop{}, time.Time{}, false
		}
	}
	return inventory.Stop{}, time.Time{}, false
}

// gapError matches the text of the consumer's error for a gap in an
// aligned stream (PartitionStoppedError.Err).
var gapError = regexp.MustCompile(`^sequence gap in source "([^"]*)" epoch (\d+) shard (\d+): got (\d+), expected (\d+) \(missing or reordered upstream: ([0-9.]+)\)$`)

// judgeStop checks that st is the stop the lost message must cause: its
// partition, at the message after it in the stream, for a sequence gap,
// naming the stream (source, epoch, shard) and the missing number; and
// that the process said so loudly.
func (g *gapRound) judgeStop(st inventory.Stop, topic string, next inventory.OutboxEntry, p *proc) {
	var wrong []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			wrong = append(wrong, fmt.Sprintf(format, args...))
		}
	}
	check(st.Reason == consumer.ReasonSequenceGap, "reason %q, want %q", st.Reason, consumer.ReasonSequenceGap)
	check(st.Topic == topic && st.Partition == g.res.Partition, "stopped %s/%d, want %s/%d", st.Topic, st.Partition, topic, g.res.Partition)
	check(st.EventID == next.EventID, "stopped at event %q, want the next of the stream, %q", st.EventID, next.EventID)
	seq := strconv.FormatInt(g.res.Seq, 10)
	if m := gapError.FindStringSubmatch(st.Err); m == nil {
		wrong = append(wrong, fmt.Sprintf("error %q does not name a sequence gap", st.Err))
	} else {
		check(m[1] == g.res.Source && m[2] == strconv.FormatInt(g.res.Epoch, 10), "names source %s epoch %s, want %s epoch %d", m[1], m[2], g.res.Source, g.res.Epoch)
		check(m[3] == strconv.Itoa(g.res.Partition), "names shard %s, want %d", m[3], g.res.Partition)
		check(m[4] == strconv.FormatInt(next.Seq, 10) && m[5] == seq && m[6] == seq, "names got %s, expected %s, missing %s; want %d, %s, %s", m[4], m[5], m[6], next.Seq, seq, seq)
	}
	if len(wrong) > 0 {
		g.res.Problems = append(g.res.Problems, fmt.Sprintf("%s stopped, but not at the gap: %s", p.name, strings.Join(wrong, "; ")))
		return
	}
	g.res.Named++
	if line := p.out.stopped(); strings.Contains(line, "level=ERROR") && strings.Contains(line, "reason="+consumer.ReasonSequenceGap) {
		g.res.Loud++
	} else {
		g.res.Problems = append(g.res.Problems, fmt.Sprintf("%s stopped at the gap without a PARTITION STOPPED line at Error naming the reason (%q)", p.name, line))
	}
}

// expected reports, for an order's outbox row, whether B must reserve it:
// everything but the lost message's stream from the lost message on.
func (g *gapRound) expected(e inventory.OutboxEntry) bool {
	return int(e.Shard) != g.res.Partition || e.Seq < g.res.Seq
}

// awaitOthers waits, within the budget, until B reserved every order it
// must, or one it must not.
func (g *gapRound) awaitOthers(ctx context.Context, streams map[int32][]inventory.OutboxEntry) error {
	want := 0
	for _, rows := range streams {
		for _, e := range rows {
			if g.expected(e) {
				want++
			}
		}
	}
	ok := pollUntil(ctx, g.gc.Budget, 100*time.Millisecond, func(ctx context.Context) bool {
		n, err := g.chain.Reserved(ctx, g.db)
		return err == nil && n >= int64(want)
	})
	if !ok && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// verify reads what B applied and what the topic holds.
func (g *gapRound) verify(ctx context.Context, orders []inventory.ChainEvent, streams map[int32][]inventory.OutboxEntry, lost, next inventory.OutboxEntry) error {
	counts, err := g.chain.ReservedCounts(ctx, g.db)
	if err != nil {
		return err
	}
	for _, rows := range streams {
		for _, e := range rows {
			n := counts[strings.TrimPrefix(e.EventID, "order-created-")]
			switch {
			case !g.expected(e) && n > 0:
				g.res.AppliedAfter++
			case !g.expected(e):
			case n == 0:
				g.res.Lost++
				g.res.Expected++
			default:
				g.res.Twice += n - 1
				g.res.Expected++
			}
		}
	}
	if g.res.Reordered, err = g.chain.Reorders(ctx, g.db); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	scan, err := inventory.ScanTopic(sctx, g.cfg.Brokers, g.chain.OrdersTopic(), g.cfg.Partitions, inventory.EventIDs(inventory.StageOrders, orders))
	if err != nil {
		return err
	}
	g.res.TopicGaps, g.res.TopicMissing = scan.StreamGaps, scan.Missing
	add := func(cond bool, format string, args ...any) {
		if cond {
			g.res.Problems = append(g.res.Problems, fmt.Sprintf(format, args...))
		}
	}
	add(!g.res.Dropped, "the relay never said it dropped the message (%s)", inventory.InjectedDrop)
	add(len(scan.StreamGaps) != 1 || scan.StreamGaps[0].Partition != g.res.Partition || scan.StreamGaps[0].Want != lost.Seq || scan.StreamGaps[0].Got != next.Seq,
		"the topic's aligned streams have the gaps %v, want one on partition %d, seq %d where %d was next", scan.StreamGaps, g.res.Partition, next.Seq, lost.Seq)
	add(scan.Missing != 1, "%d events missing from the topic, want the dropped one alone", scan.Missing)
	add(g.res.AppliedAfter > 0, "%d orders after the gap applied on partition %d", g.res.AppliedAfter, g.res.Partition)
	add(g.res.Lost > 0, "%d orders before the gap or on other partitions never reserved", g.res.Lost)
	add(g.res.Twice > 0, "%d reservations applied twice", g.res.Twice)
	add(g.res.Reordered > 0, "%d events applied out of their key's order", g.res.Reordered)
	for i := 1; i <= gapStarts; i++ {
		out, err := inventory.CountOutcomes(g.eventLog(fmt.Sprintf("consumer-reserve-%d", i)))
		if err != nil {
			return err
		}
		g.res.Stops = append(g.res.Stops, out.Stops...)
	}
	// Each process stops the partition once: it stays stopped until it is
	// assigned again, and nothing here moves it.
	add(len(g.res.Stops) != gapStarts, "%d stops, want %d (one per consumer process): %v", len(g.res.Stops), gapStarts, g.res.Stops)
	if n, kinds := g.errs.summary(); n > 0 && !errorsOnlyStops(kinds) {
		add(true, "%d ERROR lines besides the stops: %s", n, strings.Join(kinds, "; "))
	}
	return nil
}

// errorsOnlyStops reports whether every kind of ERROR line is the stopped
// partition's own.
func errorsOnlyStops(kinds []string) bool {
	for _, k := range kinds {
		if !strings.Contains(k, "PARTITION STOPPED") {
			return false
		}
	}
	return true
}
