package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
)

// The partition phase (RunPartition): each consumer process of the
// inventory scenario reaches the database through a link of its own, a
// proxy of the driver's; one link at a time freezes (packets dropped,
// nothing closed: no RST, no FIN) while the other members stay healthy,
// and is healed or cut after a while. The frozen member keeps
// heartbeating, since Kafka is fine, so only its own bounds can give its
// partitions up: each of its steps on the database gives up after
// Timeouts.Database, and after Timeouts.ProcessingStall of that it leaves the
// group. The phase measures how long the healthy members take to commit
// on the frozen member's partitions, and checks that the freeze charged
// no message anything.

// PartitionConfig sizes the partition phase. Config gives the database,
// the brokers, Orders, Partitions, Consumers (at least 2), BatchSize,
// Session, StoreOffsets, Seed, WorkDir and Log; the phase's length follows
// from the freezes.
type PartitionConfig struct {
	Freezes   int           // links frozen, one after the other; default 4, healed and cut in turn
	FreezeFor time.Duration // how long each stays frozen; default 25 s, and at least Bound + 5 s
	// The consumers' consumer.Config.Timeouts.Database and
	// MaxProcessingStall; default 2 s and 8 s.
	DatabaseTimeout, MaxProcessingStall time.Duration
	// IdleTxTimeout is the server's idle-in-transaction timeout, set on
	// every consumer session (PostgreSQL idle_in_transaction_session_timeout,
	// MariaDB idle_transaction_timeout), as docs/RELIABILITY.md recommends:
	// without it the frozen member's open transaction keeps its rows locked
	// until the link heals, and the new owner waits on them. Default 4 s.
	IdleTxTimeout time.Duration
	// Ends says how the freezes end, in turn: "heal" or "cut"; default
	// heal, cut.
	Ends []string
}

// PartitionReport holds the figures of a partition run.
type PartitionReport struct {
	Dialect      string
	Seed         uint64
	Orders       int
	Messages     int
	InTopic      int64
	BatchSize    int
	StoreOffsets bool
	Consumers    int

	Session, DatabaseTimeout, MaxProcessingStall, IdleTxTimeout time.Duration
	// Bound is the documented bound of a move: Timeouts.ProcessingStall +
	// SessionTimeout + the rebalance (at most the consumers'
	// RebalanceTimeout, 2 × SessionTimeout).
	Bound time.Duration

	Freezes    []Freeze
	Ledger     inventory.Ledger
	Charged    []string // from the traces: attempts charged to a message, dead letters, stopped partitions
	Marks      []string
	Stalled    int // members that left their group over a stalled partition (PARTITION STALLED)
	ErrorLines int
	ErrorKinds []string
	Findings   []string
	Skipped    []string
	Problems   []string
	CatchUp    time.Duration
	Wall       time.Duration
}

// Freeze is one frozen link.
type Freeze struct {
	Process string
	Ended   string // "heal" or "cut"
	// Open is how many transactions the member held open on the server just
	// after its link froze (-1: the server could not be asked).
	Open       int
	Partitions []int // the partitions the member held when its link froze
	// Moved is, per partition of Partitions, the time from the freeze to
	// the first commit of a healthy member on it (absent: none within
	// FreezeFor); MovedAll is the longest, -1 if one is absent.
	Moved    map[int]time.Duration
	MovedAll time.Duration
	// Back is the time from the heal or cut until the member held a
	// partition again (-1: not within a minute).
	Back time.Duration
}

// OK reports whether every check held.
func (r *PartitionReport) OK() bool { return len(r.Problems) == 0 }

func (r *PartitionReport) String() string {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	f("partition run on %s, consumers on %s (batches of %d, seed %d): a consumer's database link frozen, the others healthy", r.Dialect, consumerTransport(), r.BatchSize, r.Seed)
	f("  events (orders)          %7d  (%d messages written, %d in the topic)", r.Orders, r.Messages, r.InTopic)
	f("  consumers                %7d  (StoreOffsets %v)", r.Consumers, r.StoreOffsets)
	f("  settings                 SessionTimeout %v, DatabaseTimeout %v, MaxProcessingStall %v, server idle-transaction timeout %v", r.Session, r.DatabaseTimeout, r.MaxProcessingStall, r.IdleTxTimeout)
	f("  bound                    %v  (MaxProcessingStall + SessionTimeout + the rebalance, at most 2 x SessionTimeout)", r.Bound)
	var moved []float64
	for i, fr := range r.Freezes {
		parts := make([]string, 0, len(fr.Partitions))
		for _, p := range fr.Partitions {
			if d, ok := fr.Moved[p]; ok {
				parts = append(parts, fmt.Sprintf("%d: %.1fs", p, d.Seconds()))
			} else {
				parts = append(parts, fmt.Sprintf("%d: not moved", p))
			}
		}
		all := "not all moved"
		if fr.MovedAll >= 0 {
			all = fmt.Sprintf("%.1fs", fr.MovedAll.Seconds())
			moved = append(moved, fr.MovedAll.Seconds())
		}
		back := "not back"
		if fr.Back >= 0 {
			back = fmt.Sprintf("back %.1fs after", fr.Back.Seconds())
		}
		f("  freeze %d                 %s, %d transactions open; partitions moved after %s (%s); %s, %s", i+1, fr.Process, fr.Open, all, strings.Join(parts, ", "), fr.Ended, back)
	}
	f("  moved over (s)           %s  (freeze to a healthy member's first commit on the last of the frozen member's partitions)", fmtDurations(moved))
	f("  members out of the group %7d  (PARTITION STALLED)", r.Stalled)
	f("  effects applied          %7d  (ledger rows)", r.Ledger.Applied)
	f("  lost                     %7d", r.Ledger.Lost)
	f("  applied twice            %7d", r.Ledger.AppliedTwice)
	f("  charged to messages      %7d  (attempts, dead letters, stopped partitions)", len(r.Charged))
	for _, s := range r.Charged[:min(len(r.Charged), 5)] {
		f("      %s", s)
	}
	f("  consumer ERROR lines     %7d", r.ErrorLines)
	for _, k := range r.ErrorKinds {
		f("      %s", k)
	}
	for _, m := range r.Marks {
		f("      %s", m)
	}
	f("  catch-up                 %7.1fs", r.CatchUp.Seconds())
	f("  wall time                %7.1fs", r.Wall.Seconds())
	writeVerdict(f, r.Skipped, r.Findings, r.Problems, "every order applied exactly once, every move within the bound, no message charged")
	return b.String()
}

// PartitionTable is the markdown table of docs/RELIABILITY.md's partition
// section.
func PartitionTable(reps []*PartitionReport) string {
	var b strings.Builder
	b.WriteString("| database | StoreOffsets | orders | freezes (healed / cut) | open transactions at the freeze | partitions moved | moved over (s) median (min..max) | bound (s) | back after heal or cut (s) | effects applied | lost | applied twice | attempts charged | ERROR lines | wall time |\n")
	b.WriteString("|---|---|---:|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range reps {
		var heal, moved int
		var open []string
		var all, back []time.Duration
		for _, fr := range r.Freezes {
			if fr.Ended == "heal" {
				heal++
			}
			open = append(open, strconv.Itoa(fr.Open))
			moved += len(fr.Moved)
			if fr.MovedAll >= 0 {
				all = append(all, fr.MovedAll)
			}
			if fr.Back >= 0 {
				back = append(back, fr.Back)
			}
		}
		fmt.Fprintf(&b, "| %s | %v | %d | %d (%d / %d) | %s | %d | %s | %.0f | %s | %d | %d | %d | %d | %d | %.0fs |\n",
			r.Dialect, r.StoreOffsets, r.Orders, len(r.Freezes), heal, len(r.Freezes)-heal, strings.Join(open, ", "), moved,
			spreadOf(all), r.Bound.Seconds(), spreadOf(back), r.Ledger.Applied, r.Ledger.Lost, r.Ledger.AppliedTwice,
			len(r.Charged), r.ErrorLines, r.Wall.Seconds())
	}
	return b.String()
}

func (pc *PartitionConfig) defaults(session time.Duration) time.Duration {
	if pc.Freezes <= 0 {
		pc.Freezes = 4
	}
	if pc.DatabaseTimeout <= 0 {
		pc.DatabaseTimeout = 2 * time.Second
	}
	if pc.MaxProcessingStall <= 0 {
		pc.MaxProcessingStall = 8 * time.Second
	}
	if pc.IdleTxTimeout <= 0 {
		pc.IdleTxTimeout = 4 * time.Second
	}
	if len(pc.Ends) == 0 {
		pc.Ends = []string{"heal", "cut"}
	}
	bound := pc.MaxProcessingStall + session + 2*session
	if pc.FreezeFor <= 0 {
		pc.FreezeFor = 25 * time.Second
	}
	pc.FreezeFor = max(pc.FreezeFor, bound+5*time.Second)
	return bound
}

// partitionRun is one run of the partition phase.
type partitionRun struct {
	*run
	pc    PartitionConfig
	prep  *PartitionReport
	marks *markLog
}

// RunPartition runs the partition phase on cfg's database (PostgreSQL or
// MariaDB): Consumers inventory consumer processes, each through a proxy
// of its own, under a steady stream of orders; Freezes times a member
// holding partitions has its link frozen for FreezeFor and then healed or
// cut (in turn). Each freeze must move the member's partitions to the
// healthy members within the bound, the member must come back once its
// link does, every order must be applied exactly once, and no message may
// be charged an attempt, dead-lettered, stopped at or logged as failed at
// Error.
//
// An error means the run could not be carried out; a failed check is in
// PartitionReport.Problems.
func RunPartition(ctx context.Context, cfg Config, pc PartitionConfig) (*PartitionReport, error) {
	if cfg.Dialect != "postgres" && cfg.Dialect != "mysql" {
		return nil, fmt.Errorf("chaos: the partition phase needs a database server reached over TCP, not %s", cfg.Dialect)
	}
	for _, e := range pc.Ends {
		if e != "heal" && e != "cut" {
			return nil, fmt.Errorf("chaos: a freeze ends by heal or cut, not %q", e)
		}
	}
	cfg.Kills, cfg.BrokerRestarts, cfg.DBRestarts, cfg.Terminations, cfg.Storms, cfg.Failovers, cfg.LeaderKills = 0, 0, 0, 0, 0, 0, 0
	cfg.Consumers = max(cfg.Consumers, 2)
	if cfg.Session <= 0 {
		cfg.Session = 6 * time.Second
	}
	bound := pc.defaults(cfg.Session)
	// Each freeze: waiting for a settled group, the freeze, the member's
	// return; the orders flow all along.
	cfg.Duration = time.Duration(pc.Freezes) * (pc.FreezeFor + 20*time.Second)
	cfg.Waves = max(cfg.Waves, int(cfg.Duration/(500*time.Millisecond)))
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	runID := fmt.Sprintf("%08x", rand.Uint32())
	r := &partitionRun{
		run: &run{cfg: cfg, rep: &Report{Dialect: cfg.Dialect}, rng: rand.New(rand.NewPCG(cfg.Seed, 23)),
			topic: "chaos-partition-" + runID, group: "chaos-partition-" + runID, hurry: make(chan struct{})},
		pc: pc, marks: newMarkLog(),
		prep: &PartitionReport{Dialect: cfg.Dialect, Seed: cfg.Seed, Orders: cfg.Orders, BatchSize: cfg.BatchSize, StoreOffsets: cfg.StoreOffsets,
			Consumers: cfg.Consumers, Session: cfg.Session, DatabaseTimeout: pc.DatabaseTimeout, MaxProcessingStall: pc.MaxProcessingStall,
			IdleTxTimeout: pc.IdleTxTimeout, Bound: bound},
	}
	var err error
	r.admin, r.backend, err = newAdmin(ctx, cfg, runID)
	if err != nil {
		return nil, err
	}
	defer r.admin.close()
	server, err := serverOf(cfg.Dialect, r.backend.DSN)
	if err != nil {
		return nil, err
	}
	driver := r.backend
	driver.DSN = cfg.DSN
	db, store, err := driver.Open()
	if err != nil {
		return nil, err
	}
	r.db = db
	defer closeDB(db)
	if err := r.setup(ctx, store); err != nil {
		return nil, err
	}
	defer r.backend.DropTables(ctx, r.db)
	if err := inventory.CreateTopic(ctx, cfg.Brokers[0], r.topic, cfg.Partitions); err != nil {
		return nil, err
	}
	defer r.deleteTopic()

	r.fleet = newFleet(r.run)
	r.fleet.marks = r.marks
	r.fleet.prepare = func(p *proc, pcfg *inventory.ProcessConfig) error {
		link, err := newProxy(server)
		if err != nil {
			return err
		}
		dsn, err := throughLink(cfg.Dialect, pcfg.Backend.DSN, link.addr(), pc.IdleTxTimeout)
		if err != nil {
			link.close()
			return err
		}
		p.link, p.trace = link, filepath.Join(cfg.WorkDir, p.name+".trace")
		pcfg.Backend.DSN, pcfg.Trace, pcfg.Warnings = dsn, p.trace, true
		pcfg.DatabaseTimeout, pcfg.MaxProcessingStall = pc.DatabaseTimeout, pc.MaxProcessingStall
		return nil
	}
	defer r.fleet.stopAll()
	err = r.partition(ctx)
	r.prep.Wall = time.Since(start)
	return r.prep, err
}

// serverOf is the host:port of the server a DSN names.
func serverOf(dialect, dsn string) (string, error) {
	if dialect == "mysql" {
		mc, err := gomysql.ParseDSN(dsn)
		if err != nil {
			return "", fmt.Errorf("chaos: mysql DSN: %w", err)
		}
		return mc.Addr, nil
	}
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("chaos: postgres DSN: %w", err)
	}
	return net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))), nil
}

// throughLink returns dsn reaching its server at addr instead, with the
// server's idle-in-transaction timeout set on the session.
func throughLink(dialect, dsn, addr string, idleTx time.Duration) (string, error) {
	if dialect == "mysql" {
		mc, err := gomysql.ParseDSN(dsn)
		if err != nil {
			return "", err
		}
		mc.Addr = addr
		if mc.Params == nil {
			mc.Params = map[string]string{}
		}
		mc.Params["idle_transaction_timeout"] = strconv.Itoa(int(idleTx.Round(time.Second) / time.Second))
		return mc.FormatDSN(), nil
	}
	idle := strconv.FormatInt(idleTx.Milliseconds(), 10)
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Host = addr
		q := u.Query()
		q.Set("idle_in_transaction_session_timeout", idle)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	// Later keywords win.
	return dsn + " host=" + host + " port=" + port + " idle_in_transaction_session_timeout=" + idle, nil
}

func (r *partitionRun) partition(ctx context.Context) error {
	cfg := r.cfg
	batch := inventory.Generate(r.backend.RunID, cfg.Orders, cfg.DupRate, cfg.Seed)
	r.prep.Messages = len(batch.Messages)
	r.say("partition: %d orders, %d messages over %v; %d consumers, each through a link of its own, %d partitions; %d freezes of %v (bound %v)",
		cfg.Orders, len(batch.Messages), cfg.Duration, cfg.Consumers, cfg.Partitions, r.pc.Freezes, r.pc.FreezeFor, r.prep.Bound)
	for range cfg.Consumers {
		if err := r.fleet.start(ctx); err != nil {
			return err
		}
	}
	chaosCtx, cancelChaos := context.WithCancel(ctx)
	defer cancelChaos()
	superDone := make(chan struct{})
	go func() { defer close(superDone); r.fleet.supervise(chaosCtx) }()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs <- r.produce(chaosCtx, batch.Messages) }()
	go func() {
		defer wg.Done()
		err := r.freezer(chaosCtx)
		close(r.hurry) // the orders left need no freeze to fall into
		if err != nil {
			cancelChaos()
		}
		errs <- err
	}()
	wg.Wait()
	close(errs)
	var failed error
	for err := range errs {
		if !errors.Is(err, context.Canceled) || ctx.Err() != nil {
			failed = errors.Join(failed, err)
		}
	}
	if failed != nil {
		cancelChaos()
		<-superDone
		return failed
	}
	r.say("partition: freezes over; quiet period until the group catches up")
	quiet := time.Now()
	err := r.waitCaughtUp(ctx)
	r.prep.CatchUp = time.Since(quiet)
	r.prep.InTopic = r.rep.InTopic
	cancelChaos()
	<-superDone
	r.fleet.stopAll()
	if err != nil {
		return err
	}
	if err := r.verify(ctx, batch); err != nil {
		return err
	}
	return r.judge()
}

// freezer freezes the links one after the other.
func (r *partitionRun) freezer(ctx context.Context) error {
	last := ""
	for i := range r.pc.Freezes {
		p, owned, err := r.steady(ctx, last)
		if err != nil {
			return err
		}
		last = p.name
		fr := Freeze{Process: p.name, Ended: r.pc.Ends[i%len(r.pc.Ends)], Open: -1, Moved: map[int]time.Duration{}, MovedAll: -1, Back: -1}
		// The first two freezes land while the member holds a transaction
		// open, the next two at a random moment, and so on (with the
		// default Ends, each pair is healed once and cut once). The first
		// kind freezes the link right after one of the member's statements
		// reached the server; if the server shows no transaction open (it
		// was an autocommit statement, or a BEGIN that opened none yet),
		// the link is healed at once (what it held is forwarded) and
		// frozen after the next statement, for at most seekFor.
		inTx := (i/2)%2 == 0
		tries := 0
		var frozen time.Time
		seekUntil := time.Now().Add(seekFor)
		for {
			tries++
			if inTx {
				// Right after one of the member's statements reached the
				// server: most of them are inside a transaction.
				select {
				case <-p.link.freezeAfterWrite():
				case <-time.After(time.Second):
					p.link.disarm()
					p.link.freeze()
				case <-ctx.Done():
					p.link.disarm()
					return ctx.Err()
				}
			} else {
				p.link.freeze()
			}
			frozen = time.Now()
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			n, err := r.admin.openTransactions(qctx, r.db, p.link.serverPorts())
			cancel()
			fr.Open = -1
			if err == nil {
				fr.Open = n
			}
			if !inTx || fr.Open > 0 || time.Now().After(seekUntil) || ctx.Err() != nil {
				break
			}
			// Armed again at once: the next write is likely the next
			// statement of the same transaction (a BEGIN opens none on
			// MariaDB until its first statement, and the driver prepares
			// each statement before executing it).
			p.link.heal()
		}
		// The partitions it held a moment before: an assignment in flight
		// is no concern of steady's by now.
		fr.Partitions = owned
		r.say("partition: freeze %d: %s's link frozen (it holds partitions %v, %d transactions open; %d freezes to find one)", i+1, p.name, owned, fr.Open, tries)
		until := frozen.Add(r.pc.FreezeFor)
		for time.Now().Before(until) && len(fr.Moved) < len(owned) {
			r.moved(p, owned, frozen, fr.Moved)
			if backoff.Sleep(ctx, 100*time.Millisecond) != nil {
				p.link.heal()
				return ctx.Err()
			}
		}
		r.moved(p, owned, frozen, fr.Moved)
		if len(fr.Moved) == len(owned) {
			fr.MovedAll = 0
			for _, d := range fr.Moved {
				fr.MovedAll = max(fr.MovedAll, d)
			}
			r.say("partition: freeze %d: every partition of %s committed on by a healthy member %.1fs after the freeze", i+1, p.name, fr.MovedAll.Seconds())
		} else {
			r.say("partition: freeze %d: only %d of %s's %d partitions moved within %v", i+1, len(fr.Moved), p.name, len(owned), r.pc.FreezeFor)
		}
		if backoff.Sleep(ctx, time.Until(until)) != nil {
			p.link.heal()
			return ctx.Err()
		}
		if fr.Ended == "heal" {
			p.link.heal()
		} else {
			p.link.cut()
		}
		ended := time.Now()
		r.say("partition: freeze %d: %s's link %s after %.1fs", i+1, p.name, map[string]string{"heal": "healed", "cut": "cut"}[fr.Ended], ended.Sub(frozen).Seconds())
		for time.Since(ended) < time.Minute {
			trace, err := inventory.ReadTrace(p.trace)
			if err == nil && len(inventory.Owned(trace, time.Now())) > 0 && assignedSince(trace, ended) {
				fr.Back = time.Since(ended)
				break
			}
			if backoff.Sleep(ctx, 100*time.Millisecond) != nil {
				return ctx.Err()
			}
		}
		r.say("partition: freeze %d: %s back in the group after %.1fs", i+1, p.name, fr.Back.Seconds())
		r.prep.Freezes = append(r.prep.Freezes, fr)
	}
	return nil
}

// assignedSince reports whether a trace holds an assignment after t.
func assignedSince(trace []inventory.TraceEvent, t time.Time) bool {
	for _, e := range trace {
		if e.Kind == hooks.Assigned && e.At.After(t) {
			return true
		}
	}
	return false
}

// steady waits, at most two minutes, until the group is settled, per the
// members' traces: every partition held by exactly one running member, no
// partition assigned or revoked for a session timeout, and commits on
// every one of them since. It returns a member holding some (not the one
// frozen last, if another does) and its partitions.
func (r *partitionRun) steady(ctx context.Context, last string) (*proc, []int, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		r.fleet.mu.Lock()
		procs := slices.Clone(r.fleet.procs)
		r.fleet.mu.Unlock()
		held := map[int]int{}
		var candidates []*proc
		var owns [][]int
		now := time.Now()
		quiet := now.Add(-max(r.cfg.Session, 2*time.Second))
		settled := true
		for _, p := range procs {
			trace, err := inventory.ReadTrace(p.trace)
			if err != nil {
				settled = false
				continue
			}
			var mine []int
			for part := range inventory.Owned(trace, now) {
				held[part]++
				mine = append(mine, part)
				if _, ok := inventory.FirstCommit(trace, part, quiet); !ok {
					settled = false
				}
			}
			for _, e := range trace {
				if (e.Kind == hooks.Assigned || e.Kind == hooks.Revoked) && e.At.After(quiet) {
					settled = false
				}
			}
			if len(mine) > 0 {
				slices.Sort(mine)
				candidates = append(candidates, p)
				owns = append(owns, mine)
			}
		}
		for _, n := range held {
			settled = settled && n == 1
		}
		if settled && len(held) == r.cfg.Partitions && len(candidates) > 1 {
			i := r.intn(len(candidates))
			if candidates[i].name == last {
				i = (i + 1) % len(candidates)
			}
			return candidates[i], owns[i], nil
		}
		if backoff.Sleep(ctx, 200*time.Millisecond) != nil {
			return nil, nil, ctx.Err()
		}
	}
	return nil, nil, errors.New("chaos: the group did not settle within two minutes (every partition held, by more than one member)")
}

// moved records, for each of owned not yet in into, the time from frozen to
// the first commit on it of a member other than p.
func (r *partitionRun) moved(p *proc, owned []int, frozen time.Time, into map[int]time.Duration) {
	traces, err := filepath.Glob(filepath.Join(r.cfg.WorkDir, "*.trace"))
	if err != nil {
		return
	}
	for _, path := range traces {
		if path == p.trace {
			continue
		}
		trace, err := inventory.ReadTrace(path)
		if err != nil {
			continue
		}
		for _, part := range owned {
			if _, done := into[part]; done {
				continue
			}
			if at, ok := inventory.FirstCommit(trace, part, frozen); ok {
				into[part] = at.Sub(frozen)
			}
		}
	}
}

// judge adds the phase's checks to the ledger's.
func (r *partitionRun) judge() error {
	pr := r.prep
	pr.Ledger, pr.Problems = r.rep.Ledger, r.rep.Problems
	pr.ErrorLines, pr.ErrorKinds = r.rep.ErrorLines, r.rep.ErrorKinds
	pr.Findings, pr.Skipped = r.rep.Findings, r.rep.Skipped
	pr.Marks = r.marks.summary()
	pr.Stalled = r.marks.count("", markStalled)
	traces, err := filepath.Glob(filepath.Join(r.cfg.WorkDir, "*.trace"))
	if err != nil {
		return err
	}
	slices.Sort(traces)
	for _, path := range traces {
		trace, err := inventory.ReadTrace(path)
		if err != nil {
			return err
		}
		for _, e := range inventory.Charged(trace) {
			pr.Charged = append(pr.Charged, strings.TrimSuffix(filepath.Base(path), ".trace")+": "+e.String())
		}
	}
	add := func(cond bool, format string, args ...any) {
		if cond {
			pr.Problems = append(pr.Problems, fmt.Sprintf(format, args...))
		}
	}
	add(len(pr.Charged) > 0, "%d attempts, dead letters or stopped partitions charged to healthy messages (e.g. %s)", len(pr.Charged), first(pr.Charged))
	add(r.marks.count("ERROR", markMessageFailed) > 0, "%d healthy messages logged as failed at Error", r.marks.count("ERROR", markMessageFailed))
	add(len(pr.Findings) > 0, "%d consumers exited or stopped a partition", len(pr.Findings))
	add(len(pr.Freezes) < r.pc.Freezes, "%d freezes made of %d", len(pr.Freezes), r.pc.Freezes)
	for i, fr := range pr.Freezes {
		add(len(fr.Partitions) == 0, "freeze %d: %s held no partition", i+1, fr.Process)
		add(fr.MovedAll < 0, "freeze %d: %d of %s's partitions %v never committed on by a healthy member within %v", i+1,
			len(fr.Partitions)-len(fr.Moved), fr.Process, fr.Partitions, r.pc.FreezeFor)
		add(fr.MovedAll > pr.Bound, "freeze %d: %s's partitions moved after %.1fs, past the bound of %v", i+1, fr.Process, fr.MovedAll.Seconds(), pr.Bound)
		add(fr.Back < 0, "freeze %d: %s not back in the group within a minute of the %s", i+1, fr.Process, fr.Ended)
	}
	return nil
}
