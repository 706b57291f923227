package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/outbox"
)

// ChainConfig configures the chain phase (RunChain). Config gives the
// database, the brokers, the disruptions (Duration, Kills, BrokerRestarts,
// DBRestarts, Terminations; not Storms, Failovers or LeaderKills) and
// Partitions, Session, Seed, WorkDir and Log.
type ChainConfig struct {
	Orders    int           // orders service A places, spread over the chaos phase in Config.Waves waves
	Writers   int           // service A's concurrent writers; each owns a share of the SKUs; default 4
	Relays    int           // relay processes per outbox; default 2
	Consumers int           // consumer processes per consuming stage; default 2
	Lease     time.Duration // the relays' lease; default 3 s
	// CrashAfter makes the first relay process of each outbox kill itself
	// with SIGKILL right after its CrashAfter-th publish was acknowledged by
	// the broker and before it marked the messages published: a crash at
	// the one moment that must make a relay publish again, so that every
	// run has duplicates on both topics whatever the random kills hit.
	// 0: no such crash.
	CrashAfter int
	// Pauses stops a relay or consumer process with SIGSTOP this many times
	// over the chaos phase and lets it go on (SIGCONT) after PauseFor to
	// twice that, each role in turn: at most one process of a role is
	// paused at a time, so its other processes stay healthy. Every other
	// pause of a role is made to land inside a transaction the process
	// holds open on the server (pause.go). The consumers then log at Warn
	// and keep a trace, and with Config.Offsets.Store the stored offsets are
	// read all along: none may ever go back.
	Pauses   int
	PauseFor time.Duration // default twice the larger of Config.Session and Lease
	// Rewinds puts service A's database (its orders and outbox A's tables)
	// back to a backup taken a few seconds earlier this many times over
	// the chaos phase, while the orders come in (rewind.go).
	Rewinds int
}

// ChainReport holds the figures of a chain run.
type ChainReport struct {
	Dialect        string
	Seed           uint64
	Orders         int
	Kills          int            // SIGKILLs of relay and consumer processes
	BusyKills      int            // kills while the victim's role had work in hand
	Injected       int            // relays that killed themselves between a publish and its acknowledgement (CrashAfter)
	KillsByRole    map[string]int // "relay orders", "relay reserve", "consumer reserve", "consumer ledger"
	BrokerRestarts int
	DBRestarts     int
	Terminations   int // rounds of server-side connection terminations
	Conns          int // connections terminated
	// OrdersTopic and StockTopic are the topics' contents: duplicates there
	// are copies a relay published again after a kill or a lost
	// acknowledgement.
	OrdersTopic, StockTopic inventory.TopicScan
	// DupSkipped are the deliveries each consuming stage's inbox dropped as
	// duplicates, as logged by its processes (a killed process may lose its
	// last line); Outcomes all that its processes logged, by dedup path.
	DupSkipped map[string]int
	Outcomes   map[string]inventory.Outcomes
	Ledger     inventory.ChainLedger
	Findings   []string // processes that exited on their own or stopped a partition
	ErrorLines int
	ErrorKinds []string
	Skipped    []string
	Problems   []string
	CatchUp    time.Duration
	Wall       time.Duration

	StoreOffsets bool // the consumers stored their offsets (Config.Offsets.Store)
	// The pauses (ChainConfig.Pauses), and what the processes said and
	// charged meanwhile.
	Pauses        []Pause
	OffsetSamples int      // readings of every stored offset of both groups
	OffsetsBack   []string // a stored offset read below an earlier reading of it
	Charged       []string // from the traces: attempts charged to a message, dead letters, stopped partitions
	Marks         []string // lines of markPatterns, by level
	Fenced        int      // zombie workers that found their partition taken over (Warn)
	LeaseLost     int      // relay cycles whose leases another relay had taken over (Warn)

	// The rewinds of service A's database (ChainConfig.Rewinds), and what
	// the relays said and did about them.
	Rewinds []Rewind
	// Orders a restore took out of A's table: their OrderCreated published
	// before the restore (counted like the others), or not (RolledBackGone:
	// not the library's to deliver, not counted).
	RolledBackSent, RolledBackGone int
	WentBack                       int   // relay lines "the outbox's database went back" (Warn)
	Epoch                          int64 // outbox A's epoch in its store at the end (a restore puts an older one back)
	OrdersAfterRewinds             int   // orders placed after the last restore
}

// OK reports whether every check held.
func (r *ChainReport) OK() bool { return len(r.Problems) == 0 }

func (r *ChainReport) String() string {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	f("chain run on %s, consumers on %s (seed %d): A (aligned outbox) -> relay -> B (watermarks, outbox) -> relay -> ledger (inbox rows)", r.Dialect, consumerTransport(), r.Seed)
	f("  orders placed by A       %7d  (%d rows)", r.Orders, r.Ledger.Placed)
	f("  SIGKILLs                 %7d  (%s; %d while busy)", r.Kills, fmtRoles(r.KillsByRole), r.BusyKills)
	f("  injected relay crashes   %7d  (SIGKILL to itself between the broker's acknowledgement and marking published)", r.Injected)
	f("  broker restarts          %7d", r.BrokerRestarts)
	f("  database restarts        %7d", r.DBRestarts)
	f("  connection terminations  %7d  rounds (%d connections)", r.Terminations, r.Conns)
	f("  OrderCreated in topic    %7d  (%d distinct, %d duplicates published, %d missing, %d first copies out of order)",
		r.OrdersTopic.Messages, r.OrdersTopic.Distinct, r.OrdersTopic.Duplicates, r.OrdersTopic.Missing, r.OrdersTopic.Reordered)
	f("  StockReserved in topic   %7d  (%d distinct, %d duplicates published, %d missing, %d first copies out of order)",
		r.StockTopic.Messages, r.StockTopic.Distinct, r.StockTopic.Duplicates, r.StockTopic.Missing, r.StockTopic.Reordered)
	for _, c := range r.OrdersTopic.Renumbered {
		f("  OrderCreated copy under another epoch or number: %s", c)
	}
	f("  duplicates dropped       %7d  by B, %d by the ledger", r.DupSkipped[inventory.StageReserve], r.DupSkipped[inventory.StageLedger])
	for _, stage := range []string{inventory.StageReserve, inventory.StageLedger} {
		f("  %-24s %s", "dedup path ("+stage+")", fmtPaths(r.Outcomes[stage]))
	}
	f("  dedup state              %7d  watermark rows of B (one per stream), %d inbox rows of B, %d of the ledger",
		r.Ledger.ReserveWatermarks, r.Ledger.ReserveInboxRows, r.Ledger.LedgerInboxRows)
	f("  reserved (B)             %7d  (%d lost, %d twice)", r.Ledger.Reserved, r.Ledger.ReserveLost, r.Ledger.ReserveTwice)
	f("  booked (ledger)          %7d  (%d lost, %d twice)", r.Ledger.Booked, r.Ledger.BookLost, r.Ledger.BookTwice)
	f("  reordered within a key   %7d  (checked per key by B and by the ledger)", r.Ledger.Reordered)
	f("  aligned stream gaps      %7d  (OrderCreated on the topic: %d messages of the aligned outbox A, read per stream)", len(r.OrdersTopic.StreamGaps), r.OrdersTopic.Aligned)
	f("  process ERROR lines      %7d", r.ErrorLines)
	for _, k := range r.ErrorKinds {
		f("      %s", k)
	}
	if len(r.Pauses) > 0 {
		r.writePauses(f)
	}
	if len(r.Rewinds) > 0 {
		r.writeRewinds(f)
	}
	f("  catch-up                 %7.1fs", r.CatchUp.Seconds())
	f("  wall time                %7.1fs", r.Wall.Seconds())
	writeVerdict(f, r.Skipped, r.Findings, r.Problems, "every order reserved once, every StockReserved published and booked once, in order per key, each stage on its dedup path, no gap in A's streams")
	return b.String()
}

// fmtPaths is a stage's logged outcomes by dedup path.
func fmtPaths(o inventory.Outcomes) string {
	return fmt.Sprintf("%d applied, %d duplicates by watermark; %d applied, %d duplicates by inbox row",
		o.WatermarkProcessed, o.WatermarkDuplicates, o.Processed-o.WatermarkProcessed, o.Duplicates-o.WatermarkDuplicates)
}

func fmtRoles(m map[string]int) string {
	var parts []string
	for _, role := range chainRoles {
		parts = append(parts, fmt.Sprintf("%s %d", role.label(), m[role.label()]))
	}
	return strings.Join(parts, ", ")
}

// ChainTable is the markdown table of docs/RELIABILITY.md's chain section.
func ChainTable(reps []*ChainReport) string {
	var b strings.Builder
	b.WriteString("| database | orders | SIGKILLs (relays / consumers) | injected relay crashes | broker restarts | DB restarts | OrderCreated duplicates published | StockReserved duplicates published | duplicates dropped (B / ledger) | B by watermark (applied / duplicates) | ledger by inbox row (applied / duplicates) | reserved | booked | lost | applied twice | reordered | stream gaps | wall time |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range reps {
		relays := r.KillsByRole["relay orders"] + r.KillsByRole["relay reserve"]
		lost := r.Ledger.ReserveLost + r.Ledger.BookLost + int64(r.OrdersTopic.Missing+r.StockTopic.Missing)
		twice := r.Ledger.ReserveTwice + r.Ledger.BookTwice
		b2, l := r.Outcomes[inventory.StageReserve], r.Outcomes[inventory.StageLedger]
		fmt.Fprintf(&b, "| %s | %d | %d (%d / %d) | %d | %d | %d | %d | %d | %d / %d | %d / %d | %d / %d | %d | %d | %d | %d | %d | %d | %.0fs |\n",
			r.Dialect, r.Orders, r.Kills, relays, r.Kills-relays, r.Injected, r.BrokerRestarts, r.DBRestarts,
			r.OrdersTopic.Duplicates, r.StockTopic.Duplicates, r.DupSkipped[inventory.StageReserve], r.DupSkipped[inventory.StageLedger],
			b2.WatermarkProcessed, b2.WatermarkDuplicates, l.Processed-l.WatermarkProcessed, l.Duplicates-l.WatermarkDuplicates,
			r.Ledger.Reserved, r.Ledger.Booked, lost, twice, r.Ledger.Reordered+int64(r.OrdersTopic.Reordered+r.StockTopic.Reordered),
			len(r.OrdersTopic.StreamGaps)+len(r.StockTopic.StreamGaps), r.Wall.Seconds())
	}
	return b.String()
}

// chainRole is one kind of process of the chain.
type chainRole struct{ role, stage string }

func (c chainRole) label() string { return c.role + " " + c.stage }

var chainRoles = []chainRole{
	{inventory.RoleRelay, inventory.StageOrders},
	{inventory.RoleRelay, inventory.StageReserve},
	{inventory.RoleConsumer, inventory.StageReserve},
	{inventory.RoleConsumer, inventory.StageLedger},
}

// chainRun is one run of the chain phase. It borrows run's disruptions
// (broker and database restarts, connection terminations, skips).
type chainRun struct {
	*run
	cc     ChainConfig
	chain  inventory.Chain // as the processes see it
	orders []inventory.ChainEvent
	crep   *ChainReport

	pmu     sync.Mutex
	procs   []*chainProc
	started int
	pwg     sync.WaitGroup
	errs    *errorLog
	marks   *markLog
	// placing is held (read) by service A's writers while they place an
	// order, and (write) by a backup or a restore of A's database: no order
	// is half in it.
	placing sync.RWMutex
	placed  atomic.Int64 // orders service A placed
	// lastRestore is placed when the last restore of A's database ended.
	lastRestore atomic.Int64
	// firstRelay names the first relay process of each outbox, the one
	// CrashAfter applies to.
	firstRelay map[string]string
	// toKill are the roles the next kills take, in order (killer's alone).
	toKill []chainRole
}

type chainProc struct {
	proc
	role    chainRole
	relayID string
	trace   string // a consumer's trace file
	// crashes: the relay is to kill itself after CrashAfter publishes, so
	// the random kills spare it (it is its outbox's first relay).
	crashes bool
}

func (cc *ChainConfig) defaults() {
	if cc.Orders <= 0 {
		cc.Orders = 1000
	}
	if cc.Writers <= 0 {
		cc.Writers = 4
	}
	if cc.Relays <= 0 {
		cc.Relays = 2
	}
	if cc.Consumers <= 0 {
		cc.Consumers = 2
	}
	if cc.Lease <= 0 {
		cc.Lease = 3 * time.Second
	}
}

// RunChain runs the outbox chain under chaos on cfg's database: service A
// places orders in its process (this one) and enqueues OrderCreated in each
// order's transaction; relay processes publish both outboxes; consumer
// processes of service B reserve stock and enqueue StockReserved,
// deduplicating by the watermarks of outbox A's streams (A is aligned to
// its topic, and its source trusted); consumer processes of the ledger
// book them, through the ledger's inbox rows. Meanwhile relays and
// consumers are killed with SIGKILL at random moments and replaced (a
// relay under its old id or a new one), the broker and the database server
// are restarted, and connections are terminated. After the chaos and a
// quiet period it checks that every order was reserved exactly once, every
// StockReserved published at least once and booked exactly once, nothing
// applied out of its key's order, each stage's outcomes on its dedup path
// only, and A's streams on the topic without a gap.
//
// An error means the run could not be carried out; a failed check is in
// ChainReport.Problems.
func RunChain(ctx context.Context, cfg Config, cc ChainConfig) (*ChainReport, error) {
	cfg.Storms, cfg.Failovers, cfg.LeaderKills = 0, 0, 0
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	cc.defaults()
	start := time.Now()
	runID := fmt.Sprintf("%08x", rand.Uint32())
	c := &chainRun{
		run:  &run{cfg: cfg, rep: &Report{Dialect: cfg.Dialect}, rng: rand.New(rand.NewPCG(cfg.Seed, 15))},
		cc:   cc,
		crep: &ChainReport{Dialect: cfg.Dialect, Seed: cfg.Seed, Orders: cc.Orders, KillsByRole: map[string]int{}, DupSkipped: map[string]int{}, Outcomes: map[string]inventory.Outcomes{}},
		errs: &errorLog{kinds: map[string]*errorKind{}}, marks: newMarkLog(), firstRelay: map[string]string{},
	}
	c.crep.StoreOffsets = cfg.StoreOffsets
	c.primaryDir, c.standbyDir = cfg.DBDir, cfg.StandbyDir
	var err error
	c.admin, c.backend, err = newAdmin(ctx, cfg, runID)
	if err != nil {
		return nil, err
	}
	defer c.admin.close()
	c.chain = inventory.Chain{Backend: c.backend, Partitions: cfg.Partitions}
	// The driver (service A and the checks) connects as given; the
	// processes' connections are the ones marked for termination.
	driver := c.chain
	if cfg.Dialect != "sqlite" {
		driver.Backend.DSN = cfg.DSN
	}
	c.db, err = driver.Open()
	if err != nil {
		return nil, err
	}
	defer closeDB(c.db)
	log := slog.New(slog.NewTextHandler(cfg.Log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := driver.Setup(ctx, c.db, inventory.SKUs, log); err != nil {
		driver.Drop(ctx, c.db)
		return nil, fmt.Errorf("chain setup: %w", err)
	}
	defer driver.Drop(ctx, c.db)
	for _, topic := range []string{c.chain.OrdersTopic(), c.chain.StockTopic()} {
		if err := inventory.CreateReplicatedTopic(ctx, cfg.Brokers[0], topic, cfg.Partitions, cfg.Replicas); err != nil {
			return nil, err
		}
	}
	defer deleteTopic(cfg.Brokers, c.chain.OrdersTopic(), c.chain.StockTopic())
	c.orders = inventory.ChainOrders(runID, cc.Orders, inventory.SKUs)

	defer c.stopAll()
	err = c.runChaos(ctx, driver, log)
	c.crep.Wall = time.Since(start)
	return c.crep, err
}

func (c *chainRun) runChaos(ctx context.Context, driver inventory.Chain, log *slog.Logger) error {
	cfg := c.cfg
	c.say("chain: %d orders in %d waves over %v; %d relays per outbox, %d consumers per stage, %d partitions; %d kills",
		c.cc.Orders, cfg.Waves, cfg.Duration, c.cc.Relays, c.cc.Consumers, cfg.Partitions, cfg.Kills)
	for _, role := range chainRoles {
		n := c.cc.Consumers
		if role.role == inventory.RoleRelay {
			n = c.cc.Relays
		}
		for range n {
			if err := c.start(ctx, role, ""); err != nil {
				return err
			}
		}
	}
	obA, err := driver.NewOutbox(c.db, inventory.StageOrders, log)
	if err != nil {
		return err
	}
	chaosCtx, cancelChaos := context.WithCancel(ctx)
	defer cancelChaos()
	superDone := make(chan struct{})
	go func() { defer close(superDone); c.supervise(chaosCtx) }()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan struct{})
	go func() { defer close(sampled); c.sampleOffsets(sampleCtx) }()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	wg.Add(5)
	go func() { defer wg.Done(); errs <- c.serviceA(chaosCtx, driver, obA) }()
	go func() { defer wg.Done(); errs <- c.killer(chaosCtx) }()
	go func() { defer wg.Done(); errs <- c.disruptor(chaosCtx) }()
	go func() { defer wg.Done(); errs <- c.pauser(chaosCtx) }()
	go func() { defer wg.Done(); errs <- c.rewinder(chaosCtx, driver) }()
	wg.Wait()
	close(errs)
	var failed error
	for err := range errs {
		failed = errors.Join(failed, err)
	}
	c.copyDisruptions()
	if failed != nil {
		cancelChaos()
		<-superDone
		return failed
	}
	c.say("chain: chaos over (%d kills, %d broker restarts, %d database restarts); quiet period until the ledger has every order",
		c.crep.Kills, c.crep.BrokerRestarts, c.crep.DBRestarts)
	quiet := time.Now()
	err = c.waitDone(ctx, driver)
	c.crep.CatchUp = time.Since(quiet)
	cancelChaos()
	<-superDone
	stopSampling()
	<-sampled
	c.stopAll()
	if err != nil {
		return err
	}
	return c.verify(ctx, driver)
}

func (c *chainRun) copyDisruptions() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.crep.BrokerRestarts, c.crep.DBRestarts = c.rep.BrokerRestarts, c.rep.DBRestarts
	c.crep.Terminations, c.crep.Conns = c.rep.Terminations, c.rep.ConnsTerminated
	c.crep.Skipped = c.rep.Skipped
}

// serviceA places the orders in waves spread over the chaos phase, with
// Writers concurrent writers; each writer owns some SKUs and places their
// orders in sequence, so a key's numbers commit in order.
func (c *chainRun) serviceA(ctx context.Context, driver inventory.Chain, ob *outbox.Outbox) error {
	waves := c.cfg.Waves
	every := c.cfg.Duration / time.Duration(waves+1)
	skuOwner := map[string]int{}
	for i, s := range inventory.SKUs {
		skuOwner[s] = i % c.cc.Writers
	}
	for i := range waves {
		lo, hi := len(c.orders)*i/waves, len(c.orders)*(i+1)/waves
		var wg sync.WaitGroup
		errs := make(chan error, c.cc.Writers)
		for w := range c.cc.Writers {
			wg.Go(func() {
				for _, o := range c.orders[lo:hi] {
					if skuOwner[o.SKU] != w {
						continue
					}
					octx, cancel := context.WithTimeout(ctx, 3*time.Minute)
					c.placing.RLock()
					err := driver.PlaceOrder(octx, c.db, ob, o)
					c.placing.RUnlock()
					cancel()
					if err != nil {
						errs <- err
						return
					}
					c.placed.Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		if err, failed := <-errs; failed {
			return fmt.Errorf("service A: %w", err)
		}
		c.say("chain: wave %d/%d placed (%d orders)", i+1, waves, hi-lo)
		if i < waves-1 && backoff.Sleep(ctx, c.jitter(every)) != nil {
			return ctx.Err()
		}
	}
	return nil
}

// killer sends SIGKILL to a random relay or consumer Kills times over the
// chaos phase and starts a replacement of the same role after each.
func (c *chainRun) killer(ctx context.Context) error {
	if c.cfg.Kills == 0 {
		return nil
	}
	every := c.cfg.Duration / time.Duration(c.cfg.Kills+1)
	for range c.cfg.Kills {
		if backoff.Sleep(ctx, c.jitter(every)) != nil {
			return ctx.Err()
		}
		if err := c.killRandom(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (c *chainRun) start(ctx context.Context, role chainRole, relayID string) error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.startLocked(ctx, role, relayID)
}

func (c *chainRun) startLocked(ctx context.Context, role chainRole, relayID string) error {
	c.started++
	name := fmt.Sprintf("%s-%s-%d", role.role, role.stage, c.started)
	crashAfter := 0
	if role.role == inventory.RoleRelay && relayID == "" {
		relayID = name
		if c.firstRelay[role.stage] == "" {
			c.firstRelay[role.stage] = name
			crashAfter = c.cc.CrashAfter
		}
	}
	logFile, err := os.OpenFile(filepath.Join(c.cfg.WorkDir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	w := &watcher{file: logFile, errors: c.errs, marks: c.marks}
	trace := ""
	if role.role == inventory.RoleConsumer && c.cc.Pauses > 0 {
		trace = filepath.Join(c.cfg.WorkDir, name+".trace")
	}
	// The process is not bound to ctx: it is always ended by the run.
	cmd, err := inventory.StartChainProcess(context.WithoutCancel(ctx), inventory.ChainProcessConfig{
		Chain: c.chain, Role: role.role, Stage: role.stage, Name: name, Brokers: c.cfg.Brokers,
		// The relays of an outbox share its shards, so killing one stops
		// real work.
		RelayID: relayID, Lease: c.cc.Lease, MaxShards: max(c.chain.Shards(role.stage)/c.cc.Relays, 1), CrashAfter: crashAfter,
		Group: c.groupOf(role.stage), Session: c.cfg.Session,
		EventLog:     filepath.Join(c.cfg.WorkDir, "events-"+role.stage+".log"),
		StoreOffsets: c.cfg.StoreOffsets, Warnings: c.cc.Pauses > 0 || c.cc.Rewinds > 0, Trace: trace,
	}, w)
	if err != nil {
		logFile.Close()
		return err
	}
	p := &chainProc{proc: proc{name: name, cmd: cmd, out: w, done: make(chan struct{})}, role: role, relayID: relayID, trace: trace, crashes: crashAfter > 0}
	c.pwg.Go(func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	})
	c.procs = append(c.procs, p)
	return nil
}

// waitBusy waits, at most max, for a moment when processes of role are
// working: for a relay, rows of its outbox waiting to be published; for a
// consumer, its stage's effects growing. A kill then likely lands between a
// publish and its acknowledgement, or between a commit and its offset
// commit: the moments that make duplicates.
func (c *chainRun) waitBusy(ctx context.Context, role chainRole, max time.Duration) bool {
	if role.role == inventory.RoleRelay {
		return pollUntil(ctx, max, 20*time.Millisecond, func(ctx context.Context) bool {
			n, err := c.chain.Unpublished(ctx, c.db, role.stage)
			return err == nil && n >= 3
		})
	}
	return pollUntil(ctx, max, 20*time.Millisecond, rises(func(ctx context.Context) (int64, error) {
		if role.stage == inventory.StageReserve {
			return c.chain.Reserved(ctx, c.db)
		}
		return c.chain.Booked(ctx, c.db)
	}))
}

// nextRole is the role of the next kill: every role once in each
// len(chainRoles) kills, in a random order, so that a run of that many
// kills hits relays and consumers of both stages, not only by chance.
func (c *chainRun) nextRole() chainRole {
	if len(c.toKill) == 0 {
		c.toKill = slices.Clone(chainRoles)
		for i := len(c.toKill) - 1; i > 0; i-- {
			j := c.intn(i + 1)
			c.toKill[i], c.toKill[j] = c.toKill[j], c.toKill[i]
		}
	}
	role := c.toKill[0]
	c.toKill = c.toKill[1:]
	return role
}

// killRandom kills a random process of the next role (nextRole) with SIGKILL, at a
// busy moment if one comes within 3 s, reaps it and starts one of the same
// role: a relay resumes under the killed one's id half of the
// time (its leases are its own at once), else under a new id (it waits for
// the leases to expire, or other relays take the shards).
func (c *chainRun) killRandom(ctx context.Context) error {
	c.pmu.Lock()
	n := len(c.procs)
	c.pmu.Unlock()
	if n == 0 {
		return nil
	}
	role := c.nextRole()
	busy := c.waitBusy(ctx, role, 3*time.Second)
	c.pmu.Lock()
	defer c.pmu.Unlock()
	// A relay waiting for its injected crash is spared while its role has
	// another process: a random kill before its CrashAfter-th publish
	// would leave the run without the crash between the broker's
	// acknowledgement and marking published.
	var of, spared []int
	for i, p := range c.procs {
		switch {
		case p.role != role:
		case p.crashes:
			spared = append(spared, i)
		default:
			of = append(of, i)
		}
	}
	if len(of) == 0 {
		of = spared
	}
	if len(of) == 0 {
		return nil
	}
	i := of[c.intn(len(of))]
	p := c.procs[i]
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if err := reap(&p.proc, 30*time.Second); err != nil {
		return err
	}
	c.procs = append(c.procs[:i], c.procs[i+1:]...)
	c.mu.Lock()
	c.crep.Kills++
	c.crep.KillsByRole[p.role.label()]++
	if busy {
		c.crep.BusyKills++
	}
	kills := c.crep.Kills
	c.mu.Unlock()
	id := ""
	if p.role.role == inventory.RoleRelay && c.intn(2) == 0 {
		id = p.relayID
	}
	c.say("chain: SIGKILL %s (kill #%d, busy %v)", p.name, kills, busy)
	return c.startLocked(ctx, p.role, id)
}

// supervise replaces, until ctx ends, every process that exited on its own
// or reported a stopped partition, each a finding.
func (c *chainRun) supervise(ctx context.Context) {
	var lastExit time.Time
	for {
		c.pmu.Lock()
		for i := 0; i < len(c.procs); i++ {
			p := c.procs[i]
			var finding string
			select {
			case <-p.done:
				if p.out.crashedOnPurpose() {
					c.say("chain: %s killed itself between a publish and its acknowledgement (injected); replacing it", p.name)
					c.mu.Lock()
					c.crep.Injected++
					c.mu.Unlock()
					c.procs = append(c.procs[:i], c.procs[i+1:]...)
					i--
					if err := c.startLocked(ctx, p.role, p.relayID); err != nil {
						c.say("chain: cannot start a replacement: %v", err)
					}
					continue
				}
				if time.Since(lastExit) < time.Second {
					continue // at most one replacement a second while processes keep exiting
				}
				lastExit = time.Now()
				finding = fmt.Sprintf("%s exited on its own (%v): %s", p.name, p.cmd.ProcessState, p.out.tail())
			default:
				if line := p.out.stopped(); line != "" {
					finding = fmt.Sprintf("%s stopped a partition: %s", p.name, line)
					_ = p.cmd.Process.Signal(syscall.SIGKILL)
					_ = reap(&p.proc, 30*time.Second)
				}
			}
			if finding == "" {
				continue
			}
			c.say("chain: FINDING: %s; replacing it", finding)
			c.mu.Lock()
			c.crep.Findings = append(c.crep.Findings, finding)
			c.mu.Unlock()
			c.procs = append(c.procs[:i], c.procs[i+1:]...)
			i--
			if err := c.startLocked(ctx, p.role, p.relayID); err != nil {
				c.say("chain: cannot start a replacement: %v", err)
			}
		}
		c.pmu.Unlock()
		if backoff.Sleep(ctx, 200*time.Millisecond) != nil {
			return
		}
	}
}

// stopAll ends every process (SIGTERM, then SIGKILL after 30 s).
func (c *chainRun) stopAll() {
	c.pmu.Lock()
	procs := c.procs
	c.procs = nil
	c.pmu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		if reap(&p.proc, 30*time.Second) != nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			_ = reap(&p.proc, 30*time.Second)
		}
	}
	c.pwg.Wait()
}

// waitDone waits, within CatchUp, until the ledger holds every order and
// both groups committed their topics to the end, twice in a row 2 s apart
// (a relay that lost an acknowledgement may still publish copies).
func (c *chainRun) waitDone(ctx context.Context, driver inventory.Chain) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CatchUp)
	defer cancel()
	last := time.Now()
	settled := 0
	progress := ""
	for {
		done := false
		booked, err := driver.Booked(ctx, c.db)
		if err == nil {
			progress = fmt.Sprintf("%d/%d booked", booked, len(c.orders))
			done = booked >= int64(len(c.orders))
		}
		if err == nil && c.cc.Rewinds > 0 {
			// The orders a restore took back before they were published
			// are never booked: done is both outboxes published and both
			// groups at their topics' ends.
			done = c.outboxesPublished(ctx, driver)
			progress = fmt.Sprintf("%d booked of %d placed (some taken back by the rewinds); outboxes published: %v", booked, len(c.orders), done)
		}
		for _, g := range []struct{ stage, topic string }{
			{inventory.StageReserve, c.chain.OrdersTopic()}, {inventory.StageLedger, c.chain.StockTopic()},
		} {
			if !done {
				break
			}
			p, err := inventory.GroupProgress(ctx, c.cfg.Brokers, c.groupOf(g.stage), g.topic, c.cfg.Partitions)
			done = err == nil && p.Done
			if err == nil {
				progress += fmt.Sprintf("; %s: %s", g.stage, p)
			}
			if done && c.cfg.StoreOffsets {
				// Every partition's stored offset at its log end too: the
				// position a member starts from.
				done = c.stageStoredAtEnd(ctx, g.stage, g.topic, p.Ends)
				if !done {
					progress += " (stored offsets not yet at the end)"
				}
			}
		}
		if done {
			settled++
			if settled == 2 {
				c.say("chain: caught up: %s", progress)
				return nil
			}
		} else {
			settled = 0
		}
		if time.Since(last) > 5*time.Second {
			c.say("chain: catching up: %s", progress)
			last = time.Now()
		}
		wait := 250 * time.Millisecond
		if done {
			wait = 2 * time.Second
		}
		if backoff.Sleep(ctx, wait) != nil {
			return fmt.Errorf("chaos: the chain did not catch up within %v (%s)", c.cfg.CatchUp, progress)
		}
	}
}

func (c *chainRun) verify(ctx context.Context, driver inventory.Chain) error {
	for _, stage := range []string{inventory.StageReserve, inventory.StageLedger} {
		out, err := inventory.CountOutcomes(filepath.Join(c.cfg.WorkDir, "events-"+stage+".log"))
		if err != nil {
			return err
		}
		c.crep.DupSkipped[stage] = out.Duplicates
		c.crep.Outcomes[stage] = out
		c.crep.Problems = append(c.crep.Problems, out.PathProblems(stage)...)
	}
	c.crep.ErrorLines, c.crep.ErrorKinds = c.errs.summary()
	if c.cc.Rewinds > 0 {
		return c.verifyRewound(ctx, driver)
	}
	var err error
	for attempt := 1; ; attempt++ {
		c.crep.Ledger, err = driver.Check(ctx, c.db, c.orders)
		if err == nil || attempt == 5 || backoff.Sleep(ctx, time.Second) != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("chain check: %w", err)
	}
	c.crep.Problems = append(c.crep.Problems, c.crep.Ledger.Problems()...)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c.crep.OrdersTopic, err = inventory.ScanTopic(sctx, c.cfg.Brokers, c.chain.OrdersTopic(), c.cfg.Partitions, inventory.EventIDs(inventory.StageOrders, c.orders))
	if err != nil {
		return fmt.Errorf("scan %s: %w", c.chain.OrdersTopic(), err)
	}
	c.crep.StockTopic, err = inventory.ScanTopic(sctx, c.cfg.Brokers, c.chain.StockTopic(), c.cfg.Partitions, inventory.EventIDs(inventory.StageReserve, c.orders))
	if err != nil {
		return fmt.Errorf("scan %s: %w", c.chain.StockTopic(), err)
	}
	c.crep.Problems = append(c.crep.Problems, c.crep.OrdersTopic.Problems("OrderCreated")...)
	c.crep.Problems = append(c.crep.Problems, c.crep.StockTopic.Problems("StockReserved")...)
	return c.judgePauses()
}

// groupOf is the consumer group of a consuming stage.
func (c *chainRun) groupOf(stage string) string { return "chain-" + stage + "-" + c.backend.RunID }
