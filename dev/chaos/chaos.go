// Package chaos runs the inventory scenario (internal/inventory) under fire
// and proves that nothing was lost and nothing applied twice: real consumer
// processes of one group consume from a real Kafka broker into a database
// while the driver kills them with SIGKILL at random moments, restarts the
// broker and the database server, terminates database connections from the
// server side, and a producer injects duplicates. After a quiet period in
// which the group catches up, the ledger check must hold.
//
// With Failovers it kills a replicated database's primary and promotes
// its standby (failover.go); with LeaderKills it kills the nodes of a
// three-node Kafka cluster that lead the group and its busiest partitions
// (cluster.go). RunFaults is the fault phase: handler faults on known
// messages (poison payloads, network errors, a handler's own deadline,
// deferred constraints that fail at COMMIT) and a topic recreated under
// StoreOffsets, each of which must end applied exactly once or
// dead-lettered within MaxAttempts, within a budget. RunChain is the outbox
// chain under kills and restarts; RunPause the chain with its relays and
// consumers paused (SIGSTOP) instead (pause.go); RunPartition freezes the
// database links of consumer processes one at a time (partition.go).
//
// It is used by dev/cmd/inbox-chaos (make chaos, chaos-failover, chaos-cluster)
// and by TestChaosShort, TestChaosFaults, TestChaosChain, TestChaosPause,
// TestChaosPartition and TestFailoverShort (short runs in make test).
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/dev/testtransport"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/storage"
)

// Config configures one run against one database.
type Config struct {
	Dialect string // sqlite, postgres or mysql
	DSN     string // postgres, mysql; sqlite uses a file in WorkDir
	Brokers []string

	// KafkaDir and DBDir are the service dirs of scripts/kafka.sh and
	// scripts/postgres.sh / scripts/mariadb.sh, for restarts. An empty dir
	// skips that restart with a loud log line, or fails the run if Strict.
	KafkaDir, DBDir string
	Scripts         string // the scripts directory; default: found above the working directory
	Strict          bool   // a restart that cannot be done is an error

	Orders     int           // orders produced (each once, DupRate of them twice)
	DupRate    float64       // share of orders the producer sends twice
	Waves      int           // the orders are written in this many waves during the chaos
	Partitions int           // partitions of the topic
	Consumers  int           // consumer processes running at a time
	BatchSize  int           // messages per inbox transaction in the consumers
	Session    time.Duration // group session timeout

	Duration       time.Duration // length of the chaos phase
	Kills          int           // SIGKILLs during the chaos phase
	BrokerRestarts int
	DBRestarts     int
	Terminations   int           // rounds of server-side connection terminations
	Storms         int           // termination storms: a round every 50 ms for StormLength
	StormLength    time.Duration // default 4 s
	CatchUp        time.Duration // longest quiet period for the group to catch up

	// StoreOffsets runs the consumers with consumer.Config.Offsets.Store.
	StoreOffsets bool

	// Failovers kills the PostgreSQL primary (DBDir) with SIGKILL this many
	// times and promotes its streaming standby (StandbyDir); DSN must name
	// both servers (target_session_attrs=read-write). Replication is the
	// standby's mode, sync or async (scripts/postgres.sh standby). Before
	// each kill the primary's WAL senders are paused for LagWindow (default
	// 1 s): an asynchronous standby then lacks the commits of that window,
	// a synchronous one makes them wait. The killed primary rejoins as the
	// new standby.
	Failovers   int
	StandbyDir  string
	Replication string
	LagWindow   time.Duration

	// LeaderKills kills, with SIGKILL, a node of the three-node Kafka
	// cluster in KafkaDir (scripts/kafka.sh cluster) this many times: in
	// turn the group coordinator's node and the leader of the partition
	// with the most work left. The node is restarted after 1-4 s, and the
	// next kill waits until every partition of the topic has its three
	// in-sync replicas again. The topic then has Replicas replicas (default
	// 3 with LeaderKills), and the consumers dead-letter to a topic of
	// their own, which must stay empty.
	LeaderKills int
	Replicas    int

	Seed    uint64
	WorkDir string    // files of the run (event log, consumer output)
	Log     io.Writer // progress
}

// Report holds the figures of a run.
type Report struct {
	Dialect          string
	BatchSize        int
	Seed             uint64
	Orders           int
	Messages         int   // messages written by the generator (orders + duplicates)
	InTopic          int64 // messages in the topic (more than Messages when a write was retried)
	Duplicates       int   // producer duplicates generated
	Kills            int
	BusyKills        int // kills while the consumers were applying effects
	Replacements     int // consumer processes started after the first ones
	BrokerRestarts   int
	DBRestarts       int
	Terminations     int // rounds
	Storms           int
	ConnsTerminated  int // connections terminated over all rounds and storms
	Skipped          []string
	Findings         []string // stopped partitions, consumers that exited on their own
	StoppedConsumers int      // consumers restarted because a partition stopped or they exited
	ErrorLines       int      // lines the consumers logged at level ERROR
	ErrorKinds       []string // distinct ERROR messages, with a count and an example
	Processed        int      // effects applied, as counted by the consumers
	DupSkipped       int      // deliveries skipped as duplicates
	Assigned         int      // partition assignments
	Ledger           inventory.Ledger
	Problems         []string
	Wall             time.Duration
	CatchUp          time.Duration

	StoreOffsets  bool
	Replication   string         // sync or async, with failovers
	FailoverStats []FailoverStat // one per database failover
	Repositioned  int            // partitions that resumed from the database's position mid-run

	LeaderKills []LeaderKill // one per Kafka node killed
	DeadLetters int64        // messages in the dead-letter topic (with LeaderKills)
}

// LeaderKill is one SIGKILL of a Kafka cluster node.
type LeaderKill struct {
	Node    int           // node id
	Role    string        // "coordinator" or "leader of partition N"
	Back    time.Duration // from the kill until the node was ready again
	FullISR time.Duration // from the kill until every partition had 3 in-sync replicas
}

// FailoverStat is what one database failover did.
type FailoverStat struct {
	// ServerLost is how many effects (ledger rows) the old primary had
	// committed, as last seen before the kill, that the promoted standby
	// lacks: a lower bound of the transactions the failover lost.
	ServerLost int64
	// KafkaAhead is, summed over the partitions, how far the group's offset
	// in Kafka was past the position stored in the promoted database: the
	// messages a consumer resuming from Kafka's offset would skip (with
	// StoreOffsets; without it, unknown and 0).
	KafkaAhead int64
	Promote    time.Duration // from the kill until the standby accepts writes
	Recovery   time.Duration // from the kill until effects are applied again; -1: none were pending
}

// OK reports whether the ledger check held.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// writeVerdict ends a run's report: what was skipped, what was found on
// the way, and whether the run's checks held (ok says what they prove).
func writeVerdict(f func(string, ...any), skipped, findings, problems []string, ok string) {
	for _, s := range skipped {
		f("  SKIPPED: %s", s)
	}
	for _, s := range findings {
		f("  FINDING: %s", s)
	}
	if len(problems) == 0 {
		f("  verification: OK, %s", ok)
	} else {
		f("  verification: FAILED: %s", strings.Join(problems, "; "))
	}
}

func (r *Report) String() string {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	f("chaos run on %s, consumers on %s (batches of %d, seed %d)", r.Dialect, consumerTransport(), r.BatchSize, r.Seed)
	f("  events (orders)          %7d", r.Orders)
	f("  messages written         %7d  (%d producer duplicates injected; %d messages in the topic, retried writes included)", r.Messages, r.Duplicates, r.InTopic)
	f("  consumer kills (SIGKILL) %7d  (%d while effects were being applied; %d replacement processes)", r.Kills, r.BusyKills, r.Replacements)
	f("  broker restarts          %7d", r.BrokerRestarts)
	f("  database restarts        %7d", r.DBRestarts)
	f("  connection terminations  %7d  rounds and %d storms (%d connections, server side)", r.Terminations, r.Storms, r.ConnsTerminated)
	f("  partition assignments    %7d", r.Assigned)
	f("  deliveries skipped (dup) %7d", r.DupSkipped)
	f("  effects applied          %7d  (ledger rows; %d counted by the consumers)", r.Ledger.Applied, r.Processed)
	f("  lost                     %7d", r.Ledger.Lost)
	f("  applied twice            %7d", r.Ledger.AppliedTwice)
	f("  stock                    %7d reserved, %d ordered", r.Ledger.Reserved, r.Ledger.Ordered)
	f("  consumers restarted      %7d  (stopped partition or exited on their own)", r.StoppedConsumers)
	f("  consumer ERROR lines     %7d", r.ErrorLines)
	for _, k := range r.ErrorKinds {
		f("      %s", k)
	}
	if len(r.FailoverStats) > 0 {
		var lost, ahead int64
		var promote, recovery []float64
		for _, fs := range r.FailoverStats {
			lost += fs.ServerLost
			ahead += fs.KafkaAhead
			promote = append(promote, fs.Promote.Seconds())
			if fs.Recovery >= 0 {
				recovery = append(recovery, fs.Recovery.Seconds())
			}
		}
		f("  database failovers       %7d  (%s replication, StoreOffsets %v)", len(r.FailoverStats), r.Replication, r.StoreOffsets)
		f("  transactions lost (srv)  %7d  (at least: committed on the old primary, missing on the promoted standby)", lost)
		f("  Kafka offset ahead of DB %7d  messages (summed over failovers and partitions)", ahead)
		f("  repositioned partitions  %7d  (members that resumed from the database's position)", r.Repositioned)
		f("  promotion (s)            %s", fmtDurations(promote))
		f("  recovery (s)             %s  (kill to the next applied effect)", fmtDurations(recovery))
	}
	if len(r.LeaderKills) > 0 {
		var back, isr []float64
		roles := map[string]int{}
		for _, k := range r.LeaderKills {
			back = append(back, k.Back.Seconds())
			isr = append(isr, k.FullISR.Seconds())
			roles[strings.Fields(k.Role)[0]]++
		}
		f("  Kafka node kills         %7d  (%d of the group coordinator, %d of a busy partition's leader)", len(r.LeaderKills), roles["coordinator"], roles["leader"])
		f("  node back (s)            %s", fmtDurations(back))
		f("  full ISR again (s)       %s", fmtDurations(isr))
		f("  dead letters             %7d  (must be 0: the scenario has no poison)", r.DeadLetters)
	}
	f("  catch-up                 %7.1fs", r.CatchUp.Seconds())
	f("  wall time                %7.1fs", r.Wall.Seconds())
	writeVerdict(f, r.Skipped, r.Findings, r.Problems, "every order applied exactly once")
	return b.String()
}

func (c *Config) defaults() error {
	if c.Orders <= 0 {
		c.Orders = 1000
	}
	if c.Waves <= 0 {
		c.Waves = 5
	}
	if c.Partitions <= 0 {
		c.Partitions = 4
	}
	if c.Consumers <= 0 {
		c.Consumers = 3
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 10
	}
	if c.Session <= 0 {
		c.Session = 6 * time.Second
	}
	if c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.LagWindow <= 0 {
		c.LagWindow = time.Second
	}
	if c.LeaderKills > 0 {
		if c.KafkaDir == "" {
			return errors.New("chaos: LeaderKills need the Kafka cluster's dir (scripts/with-services.sh --kafka-cluster)")
		}
		if _, err := os.Stat(filepath.Join(c.KafkaDir, "cluster")); err != nil {
			return fmt.Errorf("chaos: LeaderKills need a cluster started by scripts/kafka.sh cluster: %w", err)
		}
		if c.Replicas <= 0 {
			c.Replicas = 3
		}
		c.BrokerRestarts = 0 // the cluster's nodes are killed one by one instead
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Failovers > 0 {
		switch {
		case c.DBDir == "" || c.StandbyDir == "":
			return errors.New("chaos: Failovers need DBDir and StandbyDir (scripts/with-services.sh --postgres-standby or --mariadb-replica)")
		case c.Dialect == "postgres" && c.Replication != "sync" && c.Replication != "async":
			return fmt.Errorf("chaos: Replication %q: want sync or async", c.Replication)
		case c.Dialect == "mysql" && c.Replication != "semisync" && c.Replication != "async":
			return fmt.Errorf("chaos: Replication %q: want semisync or async", c.Replication)
		case c.Dialect == "mysql" && c.Failovers > 1:
			return errors.New("chaos: one failover per MariaDB run (the killed primary does not rejoin)")
		case c.Dialect != "postgres" && c.Dialect != "mysql":
			return fmt.Errorf("chaos: no failover for %s", c.Dialect)
		}
	}
	if c.StormLength <= 0 {
		c.StormLength = 4 * time.Second
	}
	if c.CatchUp <= 0 {
		c.CatchUp = 3 * time.Minute
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.WorkDir == "" {
		return errors.New("chaos: WorkDir is required")
	}
	if len(c.Brokers) == 0 {
		return errors.New("chaos: Brokers are required")
	}
	if c.Scripts == "" && (c.KafkaDir != "" || c.DBDir != "") {
		dir, err := FindScripts()
		if err != nil {
			return err
		}
		c.Scripts = dir
	}
	return nil
}

// FindScripts returns the repository's scripts directory, searched upwards
// from the working directory.
func FindScripts() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 10 {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "kafka.sh")); err == nil {
			return filepath.Join(dir, "scripts"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", errors.New("chaos: scripts/kafka.sh not found above the working directory")
}

type run struct {
	cfg     Config
	rep     *Report
	rng     *rand.Rand
	rngMu   sync.Mutex
	backend inventory.Backend // what the consumers use
	db      *gorm.DB          // the driver's own connection
	admin   admin             // server-side connection control
	topic   string
	group   string
	fleet   *fleet
	mu      sync.Mutex // guards rep's counters written by the goroutines

	primaryDir, standbyDir string // with Failovers: swapped by each one
	dlq                    string // the consumers' dead-letter topic, with LeaderKills
	proxy                  *proxy // the consumers' way to the MariaDB primary, with Failovers
	// hurry, if set, is closed when the disruptions are over: the waves
	// left are written without waiting between them.
	hurry chan struct{}
}

func (r *run) say(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "chaos %s %s: %s\n", time.Now().UTC().Format("15:04:05.0"), r.cfg.Dialect, fmt.Sprintf(format, args...))
}

func (r *run) intn(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

func (r *run) jitter(d time.Duration) time.Duration {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return time.Duration(float64(d) * (0.5 + r.rng.Float64()))
}

// Run runs the scenario under chaos until the group caught up, checks the
// ledger and reports. An error means the run could not be carried out; a
// failed check is in Report.Problems.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	r := &run{cfg: cfg, rep: &Report{Dialect: cfg.Dialect, BatchSize: cfg.BatchSize, Seed: cfg.Seed, Orders: cfg.Orders,
		StoreOffsets: cfg.StoreOffsets, Replication: cfg.Replication}, rng: rand.New(rand.NewPCG(cfg.Seed, 99))}
	r.primaryDir, r.standbyDir = cfg.DBDir, cfg.StandbyDir
	runID := fmt.Sprintf("%08x", rand.Uint32())
	r.topic = "chaos-orders-" + runID
	r.group = "chaos-inventory-" + runID

	var err error
	if cfg.Failovers > 0 && cfg.Dialect == "mysql" {
		if cfg.DSN, err = r.startProxy(cfg.DSN); err != nil {
			return nil, err
		}
		r.cfg.DSN = cfg.DSN
		defer r.proxy.close()
	}
	r.admin, r.backend, err = newAdmin(ctx, cfg, runID)
	if err != nil {
		return nil, err
	}
	defer r.admin.close()
	// The driver connects as given (the consumers' connections are the
	// ones marked for termination).
	driver := r.backend
	if cfg.Dialect != "sqlite" {
		driver.DSN = cfg.DSN
	}
	db, store, err := driver.Open()
	if err != nil {
		return nil, err
	}
	r.db = db
	if sqlDB, err := r.db.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := r.setup(ctx, store); err != nil {
		return nil, err
	}
	defer r.backend.DropTables(ctx, r.db)
	if err := inventory.CreateReplicatedTopic(ctx, cfg.Brokers[0], r.topic, cfg.Partitions, cfg.Replicas); err != nil {
		return nil, err
	}
	defer r.deleteTopic()
	if cfg.LeaderKills > 0 {
		r.dlq = r.topic + ".dlq"
		if err := inventory.CreateReplicatedTopic(ctx, cfg.Brokers[0], r.dlq, 1, cfg.Replicas); err != nil {
			return nil, err
		}
	}

	r.fleet = newFleet(r)
	defer r.fleet.stopAll()
	err = r.chaos(ctx)
	r.rep.Wall = time.Since(start)
	if err != nil {
		return r.rep, err
	}
	return r.rep, nil
}

// deleteTopic removes the run's topic, best effort.
func (r *run) deleteTopic() {
	topics := []string{r.topic}
	if r.dlq != "" {
		topics = append(topics, r.dlq)
	}
	deleteTopic(r.cfg.Brokers, topics...)
}

// setup creates the inbox table and the business tables.
func (r *run) setup(ctx context.Context, store storage.InboxStore) error {
	log := slog.New(slog.NewTextHandler(r.cfg.Log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ib, err := inbox.New(r.db, store, inbox.Config{Logger: log})
	if err != nil {
		return err
	}
	if err := ib.Migrate(ctx); err != nil {
		return err
	}
	if _, err := ib.Maintain(ctx); err != nil {
		return err
	}
	return r.backend.CreateTables(ctx, r.db, inventory.SKUs)
}

func (r *run) chaos(ctx context.Context) error {
	cfg := r.cfg
	batch := inventory.Generate(r.backend.RunID, cfg.Orders, cfg.DupRate, cfg.Seed)
	r.rep.Messages, r.rep.Duplicates = len(batch.Messages), batch.Duplicates
	r.say("%d orders, %d messages (%d producer duplicates) in %d waves over %v; %d consumers, %d partitions; topic %s",
		cfg.Orders, len(batch.Messages), batch.Duplicates, cfg.Waves, cfg.Duration, cfg.Consumers, cfg.Partitions, r.topic)

	for range cfg.Consumers {
		if err := r.fleet.start(ctx); err != nil {
			return err
		}
	}
	chaosCtx, cancelChaos := context.WithCancel(ctx)
	defer cancelChaos()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	superDone := make(chan struct{})
	go func() { defer close(superDone); r.fleet.supervise(chaosCtx) }()
	wg.Add(3)
	go func() { defer wg.Done(); errs <- r.produce(chaosCtx, batch.Messages) }()
	go func() { defer wg.Done(); errs <- r.killer(chaosCtx) }()
	go func() { defer wg.Done(); errs <- r.disruptor(chaosCtx) }()
	wg.Wait()
	close(errs)
	var failed error
	for err := range errs {
		failed = errors.Join(failed, err)
	}
	if failed != nil {
		cancelChaos()
		<-superDone
		return failed
	}

	r.say("chaos over: %d kills, %d broker restarts, %d database restarts, %d termination rounds; quiet period until the group catches up",
		r.rep.Kills, r.rep.BrokerRestarts, r.rep.DBRestarts, r.rep.Terminations)
	quiet := time.Now()
	err := r.waitCaughtUp(ctx)
	r.rep.CatchUp = time.Since(quiet)
	cancelChaos()
	<-superDone
	r.fleet.stopAll()
	if err != nil {
		return err
	}
	return r.verify(ctx, batch)
}

// produce writes the messages in waves spread over the chaos phase.
func (r *run) produce(ctx context.Context, msgs []kafka.Message) error {
	w := inventory.Writer(r.cfg.Brokers, r.topic)
	defer w.Close()
	waves := r.cfg.Waves
	every := r.cfg.Duration / time.Duration(waves+1)
	for i := range waves {
		lo, hi := len(msgs)*i/waves, len(msgs)*(i+1)/waves
		wctx, cancel := context.WithTimeout(ctx, r.cfg.Duration+2*time.Minute)
		err := inventory.Write(wctx, w, msgs[lo:hi])
		cancel()
		if err != nil {
			return err
		}
		if waves <= 20 || (i+1)%(waves/10) == 0 {
			r.say("wave %d/%d written (%d messages)", i+1, waves, hi-lo)
		}
		if i < waves-1 && r.sleepUnlessHurried(ctx, r.jitter(every)) != nil {
			return ctx.Err()
		}
	}
	return nil
}

// sleepUnlessHurried sleeps for d, or until ctx ends (its error) or hurry
// is closed (nil).
func (r *run) sleepUnlessHurried(ctx context.Context, d time.Duration) error {
	if r.hurry == nil {
		return backoff.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.hurry:
	case <-t.C:
	}
	return nil
}

// killer sends SIGKILL to a random consumer Kills times, spread over the
// chaos phase, and starts a replacement after each.
func (r *run) killer(ctx context.Context) error {
	if r.cfg.Kills == 0 {
		return nil
	}
	deadline := time.Now().Add(r.cfg.Duration)
	every := r.cfg.Duration / time.Duration(r.cfg.Kills+1)
	for i := 0; i < r.cfg.Kills; i++ {
		wait := r.jitter(every)
		if left := time.Until(deadline) / time.Duration(r.cfg.Kills-i+1); wait > 2*left {
			wait = left
		}
		if backoff.Sleep(ctx, wait) != nil {
			return ctx.Err()
		}
		busy := r.waitBusy(ctx, 3*time.Second)
		if err := r.fleet.killRandom(ctx, busy); err != nil {
			return err
		}
	}
	return nil
}

// waitBusy waits, at most max, for a moment when the consumers are applying
// effects (the ledger grows), so that a kill is likely to land in the middle
// of a transaction or between a commit and its offset commit.
func (r *run) waitBusy(ctx context.Context, max time.Duration) bool {
	return pollUntil(ctx, max, 100*time.Millisecond, rises(func(ctx context.Context) (int64, error) {
		return r.backend.Reservations(ctx, r.db)
	}))
}

// pollUntil calls cond every `every`, each call under a timeout of 1 s,
// until it holds (true), or max passed or ctx ended (false).
func pollUntil(ctx context.Context, max, every time.Duration, cond func(context.Context) bool) bool {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		ok := cond(qctx)
		cancel()
		if ok {
			return true
		}
		if backoff.Sleep(ctx, every) != nil {
			return false
		}
	}
	return false
}

// rises is the condition that count read higher than at its previous
// successful reading; a failed reading changes nothing.
func rises(count func(context.Context) (int64, error)) func(context.Context) bool {
	prev := int64(-1)
	return func(ctx context.Context) bool {
		n, err := count(ctx)
		if err != nil {
			return false
		}
		up := prev >= 0 && n > prev
		prev = n
		return up
	}
}

// disruptor restarts the broker and the database and terminates database
// connections at random moments of the chaos phase, in a random order.
func (r *run) disruptor(ctx context.Context) error {
	var acts []string
	for range r.cfg.BrokerRestarts {
		acts = append(acts, "broker")
	}
	for range r.cfg.DBRestarts {
		acts = append(acts, "db")
	}
	for range r.cfg.Failovers {
		acts = append(acts, "failover")
	}
	for range r.cfg.LeaderKills {
		acts = append(acts, "leader")
	}
	for range r.cfg.Terminations {
		acts = append(acts, "terminate")
	}
	if r.cfg.Dialect != "sqlite" {
		for range r.cfg.Storms {
			acts = append(acts, "storm")
		}
	}
	if len(acts) == 0 {
		return nil
	}
	r.rngMu.Lock()
	r.rng.Shuffle(len(acts), func(i, j int) { acts[i], acts[j] = acts[j], acts[i] })
	r.rngMu.Unlock()
	every := r.cfg.Duration / time.Duration(len(acts)+1)
	deadline := time.Now().Add(r.cfg.Duration)
	for i, a := range acts {
		// Failovers and node kills take seconds each: the waits shrink so
		// that the disruptions stay inside the chaos phase, under load.
		wait := r.jitter(every)
		if left := time.Until(deadline) / time.Duration(len(acts)-i+1); wait > left {
			wait = max(left, 0)
		}
		if backoff.Sleep(ctx, wait) != nil {
			return ctx.Err()
		}
		var err error
		switch a {
		case "broker":
			err = r.restartBroker(ctx)
		case "db":
			err = r.restartDB(ctx)
		case "failover":
			err = r.failover(ctx)
		case "leader":
			err = r.killLeader(ctx)
		case "terminate":
			err = r.terminate(ctx)
		case "storm":
			err = r.storm(ctx)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *run) skip(what string) error {
	msg := what
	if r.cfg.Strict {
		return fmt.Errorf("chaos: cannot %s, and every disruption is required (CI=true or INBOX_REQUIRE_BACKENDS=1)", msg)
	}
	r.say("!!!!! SKIPPED: %s !!!!!", msg)
	r.mu.Lock()
	r.rep.Skipped = append(r.rep.Skipped, msg)
	r.mu.Unlock()
	return nil
}

func (r *run) restartBroker(ctx context.Context) error {
	if r.cfg.KafkaDir == "" {
		return r.skip("restart the Kafka broker: INBOX_KAFKA_DIR is not set (a broker not started by scripts/with-services.sh)")
	}
	r.say("restarting the Kafka broker")
	t0 := time.Now()
	if err := r.script(ctx, "kafka.sh", "restart", r.cfg.KafkaDir); err != nil {
		return err
	}
	r.mu.Lock()
	r.rep.BrokerRestarts++
	r.mu.Unlock()
	r.say("Kafka broker back after %.1fs", time.Since(t0).Seconds())
	return nil
}

func (r *run) restartDB(ctx context.Context) error {
	var script string
	switch r.cfg.Dialect {
	case "postgres":
		script = "postgres.sh"
	case "mysql":
		script = "mariadb.sh"
	default:
		r.say("no database server to restart for %s (an embedded database; consumer kills cover its crashes)", r.cfg.Dialect)
		return nil
	}
	if r.cfg.DBDir == "" {
		return r.skip(fmt.Sprintf("restart the %s server: its service dir is not set (a server not started by scripts/with-services.sh)", r.cfg.Dialect))
	}
	r.say("restarting the %s server", r.cfg.Dialect)
	t0 := time.Now()
	if err := r.script(ctx, script, "restart", r.cfg.DBDir); err != nil {
		return err
	}
	r.mu.Lock()
	r.rep.DBRestarts++
	r.mu.Unlock()
	r.say("%s server back after %.1fs", r.cfg.Dialect, time.Since(t0).Seconds())
	return nil
}

func (r *run) terminate(ctx context.Context) error {
	if r.cfg.Dialect == "sqlite" {
		return nil
	}
	n, err := r.admin.terminate(ctx)
	if err != nil {
		// The server may be restarting at this moment: not a reason to stop.
		r.say("terminating connections failed: %v", err)
		return nil
	}
	r.mu.Lock()
	r.rep.Terminations++
	r.rep.ConnsTerminated += n
	r.mu.Unlock()
	r.say("terminated %d consumer connections from the server side", n)
	return nil
}

// storm terminates the consumers' connections every 50 ms for StormLength:
// an outage in which every attempt of a message finds its connection cut.
func (r *run) storm(ctx context.Context) error {
	busy := r.waitBusy(ctx, 5*time.Second)
	r.say("termination storm for %v (consumers busy: %v)", r.cfg.StormLength, busy)
	end := time.Now().Add(r.cfg.StormLength)
	total := 0
	for i := 0; i < 10_000 && time.Now().Before(end); i++ {
		if n, err := r.admin.terminate(ctx); err == nil {
			total += n
		}
		if backoff.Sleep(ctx, 50*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	r.mu.Lock()
	r.rep.Storms++
	r.rep.ConnsTerminated += total
	r.mu.Unlock()
	r.say("termination storm over: %d connections terminated", total)
	return nil
}

// waitCaughtUp waits, within CatchUp, until the group committed every
// partition to its end. Stopped consumers are still replaced meanwhile.
func (r *run) waitCaughtUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CatchUp)
	defer cancel()
	last := time.Now()
	var p inventory.Progress
	for {
		pp, err := inventory.GroupProgress(ctx, r.cfg.Brokers, r.group, r.topic, r.cfg.Partitions)
		if err == nil {
			p = pp
			if p.Done && r.cfg.StoreOffsets {
				// After a failover the group's offsets can be at the end
				// while the database's position, and its effects, are not.
				p.Done = r.storedAtEnd(ctx, p.Ends)
			}
			if p.Done {
				r.rep.InTopic = p.Total
				r.say("caught up: %s", p)
				return nil
			}
		}
		if time.Since(last) > 5*time.Second {
			r.say("catching up: %s", p)
			last = time.Now()
		}
		if backoff.Sleep(ctx, 250*time.Millisecond) != nil {
			return fmt.Errorf("chaos: the group did not catch up within %v (%s)", r.cfg.CatchUp, p)
		}
	}
}

func (r *run) verify(ctx context.Context, batch inventory.Batch) error {
	out, err := inventory.CountOutcomes(r.fleet.eventLog)
	if err != nil {
		return err
	}
	r.rep.Processed, r.rep.DupSkipped, r.rep.Assigned, r.rep.Repositioned = out.Processed, out.Duplicates, out.Assigned, out.Repositioned
	r.rep.ErrorLines, r.rep.ErrorKinds = r.fleet.errors.summary()
	var ledger inventory.Ledger
	for attempt := 1; ; attempt++ {
		ledger, err = r.backend.Check(ctx, r.db, batch.Orders)
		if err == nil || attempt == 5 {
			break
		}
		if backoff.Sleep(ctx, time.Second) != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ledger check: %w", err)
	}
	r.rep.Ledger = ledger
	r.rep.Problems = ledger.Problems()
	if r.dlq != "" {
		n, err := inventory.TopicSize(ctx, r.cfg.Brokers, r.dlq, 1)
		if err != nil {
			return fmt.Errorf("count the dead letters: %w", err)
		}
		r.rep.DeadLetters = n
		if n > 0 {
			r.rep.Problems = append(r.rep.Problems, fmt.Sprintf("%d messages dead-lettered (the scenario has no poison)", n))
		}
	}
	if ledger.Applied != int64(len(batch.Orders)) {
		r.rep.Problems = append(r.rep.Problems, fmt.Sprintf("%d effects applied for %d orders", ledger.Applied, len(batch.Orders)))
	}
	return nil
}

// consumerTransport is the Kafka client the run's consumer processes use
// (testtransport.Var, which they inherit), for the reports.
func consumerTransport() string {
	name, err := testtransport.Name()
	if err != nil {
		return err.Error()
	}
	return name
}
