// Command inbox-chaos runs the inventory scenario under chaos against each
// database in turn and proves that every event's effect was applied exactly
// once: consumer processes of one group are killed with SIGKILL at random
// moments and replaced, the Kafka broker and the database server are
// restarted, database connections are terminated from the server side, and
// the producer injects duplicates. After a quiet period in which the group
// catches up, the ledger is checked.
//
// Then, per database, the fault phase (dev/chaos.RunFaults): handler
// faults on known messages (poison payloads, network errors, a handler's own
// deadline, deferred constraints that fail at COMMIT) under Failure.Policy
// DeadLetter with a small Failure.MaxAttempts, and a topic recreated under
// Offsets.Store. Healthy messages must be applied exactly once, poison ones
// dead-lettered within MaxAttempts, nothing lost; every round has a budget,
// so a stuck message fails the run instead of hanging it.
//
// Then the chain phase (dev/chaos.RunChain): the outbox chain, service
// A's OrderCreated through relay processes to service B, which
// deduplicates them by sequence, B's StockReserved through relay processes
// to a ledger's inbox, under SIGKILLs
// of relays and consumers, broker and database restarts and connection
// terminations: every order reserved once, every StockReserved published at
// least once and booked once, in order per key.
//
// Then the gap phase (dev/chaos.RunGap): the chain's relay A drops one
// message of its aligned outbox on purpose while reporting it published,
// in each of several rounds; service B, which deduplicates by the
// sequence of A's trusted source, must stop that partition with
// consumer.ReasonSequenceGap naming the stream and the missing number,
// every time, and apply nothing after it.
//
// Then the pause phase (dev/chaos.RunPause; PostgreSQL and MariaDB, with
// StoreOffsets off and on): the chain's relays and consumers stopped with
// SIGSTOP past their lease and session timeout, half of the pauses inside a
// transaction the process holds open, and let go on: besides the chain's
// checks, no message charged an attempt and no stored offset ever read below
// an earlier reading. Then the partition phase (dev/chaos.RunPartition;
// PostgreSQL and MariaDB, StoreOffsets off and on): each inventory consumer
// reaches the database through a link of its own, and one link at a time
// freezes (no RST) and is healed or cut: the frozen member's partitions must
// be committed on by a healthy member within Timeouts.ProcessingStall +
// SessionTimeout + the rebalance, with no message charged anything. Then
// the rewind phase (dev/chaos.RunRewind): the chain's database goes back
// under load, restored from a backup taken seconds earlier, or, with
// -rewind-failover (PostgreSQL, scripts/with-services.sh --postgres-standby
// async), failed over to a standby cut off seconds earlier; every order
// the rewinds left to deliver must be reserved and booked once.
// -phases selects the phases.
//
// It needs real servers: run it through make chaos, which starts throwaway
// ones with scripts/with-services.sh. The broker and database restarts use
// the service dirs that script exports (INBOX_KAFKA_DIR, INBOX_POSTGRES_DIR,
// INBOX_MYSQL_DIR); without them they are skipped with a loud log line, and
// under CI=true or INBOX_REQUIRE_BACKENDS=1 that is an error.
//
// Usage:
//
//	scripts/with-services.sh --postgres --mariadb --kafka -- go run ./dev/cmd/inbox-chaos [flags]
//
// It exits 0 when every check holds, 1 when one does not or a run fails, 2 on
// a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/inboxgo/inbox/dev/chaos"
	"github.com/inboxgo/inbox/dev/inventory"
)

func main() {
	if ran, code := inventory.RunProcessFromEnv(os.Stderr); ran {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inbox-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c chaos.Config
	dbs := fs.String("db", "sqlite,postgres,mysql", "databases to run against, in turn")
	fs.IntVar(&c.Orders, "orders", 20000, "orders (events) to produce")
	fs.Float64Var(&c.DupRate, "dup", 0.1, "share of orders the producer sends twice (0..1)")
	fs.IntVar(&c.Waves, "waves", 10, "the orders are written in this many waves during the chaos")
	fs.IntVar(&c.Partitions, "partitions", 6, "partitions of the topic")
	fs.IntVar(&c.Consumers, "consumers", 4, "consumer processes running at a time")
	fs.IntVar(&c.BatchSize, "batch", 0, "messages per inbox transaction; 0: 10 on SQLite, 1 on PostgreSQL and MariaDB (see docs/RELIABILITY.md: batches of the scenario's hot rows deadlock)")
	fs.DurationVar(&c.Session, "session", 6*time.Second, "group session timeout (the broker's group.min.session.timeout.ms bounds it)")
	fs.DurationVar(&c.Duration, "duration", 150*time.Second, "length of the chaos phase per database")
	fs.IntVar(&c.Kills, "kills", 55, "SIGKILLs per database")
	fs.IntVar(&c.BrokerRestarts, "broker-restarts", 2, "Kafka broker restarts per database")
	fs.IntVar(&c.DBRestarts, "db-restarts", 1, "database server restarts per database (PostgreSQL, MariaDB)")
	fs.IntVar(&c.Terminations, "terminations", 6, "rounds of server-side connection terminations per database (PostgreSQL, MariaDB)")
	fs.IntVar(&c.Storms, "storms", 1, "termination storms per database (PostgreSQL, MariaDB): the consumers' connections terminated every 50 ms for -storm-length")
	fs.DurationVar(&c.StormLength, "storm-length", 4*time.Second, "length of a termination storm")
	fs.DurationVar(&c.CatchUp, "catch-up", 5*time.Minute, "longest quiet period for the group to catch up")
	fs.Uint64Var(&c.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the orders and of the chaos")
	phases := fs.String("phases", "chaos,faults", "phases to run per database: chaos (kills, restarts, duplicates), faults (handler and configuration faults), chain (the outbox chain under kills and restarts), gap (the chain's aligned outbox losing a message, which must stop its partition), pause (the chain's relays and consumers paused with SIGSTOP, with StoreOffsets off and on; PostgreSQL and MariaDB), partition (a consumer's database link frozen, then healed or cut; PostgreSQL and MariaDB) and rewind (the chain's producer database restored from a backup under load, or failed over with -rewind-failover)")
	var pc chaos.PauseConfig
	fs.IntVar(&pc.Orders, "pause-orders", 2000, "pause phase: orders service A places, per run")
	fs.IntVar(&pc.Pauses, "pauses", 12, "pause phase: SIGSTOPs per run, the roles (relays and consumers of both stages) in turn")
	pauseDuration := fs.Duration("pause-duration", 60*time.Second, "pause phase: length of its chaos, per run")
	fs.DurationVar(&pc.PauseFor, "pause-for", 0, "pause phase: shortest pause (each lasts this to twice this); 0: twice the larger of -session and the relays' lease (3s)")
	var ptc chaos.PartitionConfig
	partitionOrders := fs.Int("partition-orders", 6000, "partition phase: orders, produced at a steady rate while the links freeze, per run")
	fs.IntVar(&ptc.Freezes, "freezes", 4, "partition phase: links frozen per run, one after the other, then healed and cut in turn")
	fs.DurationVar(&ptc.FreezeFor, "freeze-for", 25*time.Second, "partition phase: how long each link stays frozen (at least the bound + 5s)")
	fs.DurationVar(&ptc.DatabaseTimeout, "partition-database-timeout", 2*time.Second, "partition phase: the consumers' DatabaseTimeout")
	fs.DurationVar(&ptc.MaxProcessingStall, "partition-max-stall", 8*time.Second, "partition phase: the consumers' MaxProcessingStall")
	fs.DurationVar(&ptc.IdleTxTimeout, "partition-idle-tx-timeout", 4*time.Second, "partition phase: the server's idle-in-transaction timeout on the consumers' sessions")
	var cc chaos.ChainConfig
	fs.IntVar(&cc.Orders, "chain-orders", 3000, "chain phase: orders service A places")
	chainDuration := fs.Duration("chain-duration", 60*time.Second, "chain phase: length of its chaos")
	chainKills := fs.Int("chain-kills", 30, "chain phase: SIGKILLs of relay and consumer processes")
	fs.IntVar(&cc.CrashAfter, "chain-crash-after", 3, "chain phase: the first relay of each outbox kills itself after this many acknowledged publishes, before marking them published (0: never)")
	var rc chaos.RewindConfig
	fs.IntVar(&rc.Orders, "rewind-orders", 3000, "rewind phase: orders service A places")
	fs.IntVar(&rc.Rewinds, "rewinds", 6, "rewind phase: restores (or failovers) of service A's database, A's relays restarted and running through it in turn")
	rewindDuration := fs.Duration("rewind-duration", 90*time.Second, "rewind phase: length of its chaos")
	rewindFailover := fs.Bool("rewind-failover", false, "rewind phase, PostgreSQL: rewind the chain's database by failovers to an asynchronous standby that lacks the last commits instead of restores (needs scripts/with-services.sh --postgres-standby async; the consumers store their offsets)")
	var gc chaos.GapConfig
	fs.IntVar(&gc.Rounds, "gap-rounds", 5, "gap phase: rounds, each dropping one message of the chain's aligned outbox")
	fs.IntVar(&gc.Orders, "gap-orders", 600, "gap phase: orders service A places per round")
	var fc chaos.FaultConfig
	fs.IntVar(&fc.Healthy, "fault-healthy", 1000, "faults phase: healthy orders per round")
	fs.IntVar(&fc.PerClass, "fault-per-class", 10, "faults phase: messages of each fault class per round")
	fs.IntVar(&fc.MaxAttempts, "fault-max-attempts", 3, "faults phase: the consumer's MaxAttempts")
	faultBatches := fs.String("fault-batches", "1,10", "faults phase: one round per batch size")
	fs.DurationVar(&fc.Budget, "fault-budget", 2*time.Minute, "faults phase: longest a round may take before its unresolved messages are reported stuck")
	fs.DurationVar(&fc.StopBudget, "fault-stop-budget", 30*time.Second, "faults phase: longest wait for the recreated topic's partitions to stop")
	fs.BoolVar(&c.StoreOffsets, "store-offsets", false, "run the consumers with StoreOffsets (offsets in the database, in the effect's transaction)")
	fs.IntVar(&c.Failovers, "failovers", 0, "database failovers: SIGKILL the primary, promote the standby (PostgreSQL: needs scripts/with-services.sh --postgres-standby sync|async, the old primary rejoins; MariaDB: --mariadb-replica semisync|async, one per run, consumers switched by a proxy); replaces -db-restarts")
	fs.DurationVar(&c.LagWindow, "lag-window", time.Second, "before each failover the primary's WAL senders are paused this long (an asynchronous standby then lacks those commits)")
	fs.IntVar(&c.LeaderKills, "leader-kills", 0, "SIGKILLs of Kafka cluster nodes (group coordinator, busy partitions' leaders), each restarted; needs scripts/with-services.sh --kafka-cluster; replaces -broker-restarts")
	allowLoss := fs.Bool("allow-loss", false, "report lost effects without failing: for measuring what an asynchronous failover without -store-offsets loses (effects applied twice still fail)")
	keep := fs.Bool("keep", false, "keep the run's files (consumer logs, event logs)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: inbox-chaos [flags]\n\nRuns the inventory scenario under chaos and checks that every event was applied exactly once.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage(stderr, "unexpected arguments %q", fs.Args())
	case c.Orders < 1 || c.Orders > 1_000_000:
		return usage(stderr, "-orders %d: want 1..1000000", c.Orders)
	case c.DupRate < 0 || c.DupRate > 1:
		return usage(stderr, "-dup %v: want 0..1", c.DupRate)
	case c.Waves < 1 || c.Partitions < 1 || c.Consumers < 1 || c.BatchSize < 0:
		return usage(stderr, "-waves, -partitions and -consumers must be positive, -batch not negative")
	case cc.Orders < 1 || *chainKills < 0 || *chainDuration <= 0 || cc.CrashAfter < 0:
		return usage(stderr, "-chain-orders and -chain-duration must be positive, -chain-kills and -chain-crash-after not negative")
	case c.Kills < 0 || c.BrokerRestarts < 0 || c.DBRestarts < 0 || c.Terminations < 0 || c.Storms < 0 || c.Failovers < 0 || c.LeaderKills < 0:
		return usage(stderr, "disruption counts must not be negative")
	}
	runChaos, runFaults, runChain, runGap, runPause, runPartition, runRewind := false, false, false, false, false, false, false
	for _, p := range strings.Split(*phases, ",") {
		switch strings.TrimSpace(p) {
		case "chaos":
			runChaos = true
		case "faults":
			runFaults = true
		case "chain":
			runChain = true
		case "gap":
			runGap = true
		case "pause":
			runPause = true
		case "partition":
			runPartition = true
		case "rewind":
			runRewind = true
		default:
			return usage(stderr, "-phases %q: want chaos, faults, chain, gap, pause, partition, rewind, comma-separated", *phases)
		}
	}
	if rc.Orders < 1 || rc.Rewinds < 1 || *rewindDuration <= 0 {
		return usage(stderr, "-rewind-orders, -rewinds and -rewind-duration must be positive")
	}
	if gc.Rounds < 1 || gc.Orders < 1 {
		return usage(stderr, "-gap-rounds and -gap-orders must be positive")
	}
	if pc.Orders < 1 || pc.Pauses < 1 || *pauseDuration <= 0 || pc.PauseFor < 0 {
		return usage(stderr, "-pause-orders, -pauses and -pause-duration must be positive, -pause-for not negative")
	}
	if *partitionOrders < 1 || ptc.Freezes < 1 || ptc.FreezeFor <= 0 || ptc.DatabaseTimeout <= 0 || ptc.MaxProcessingStall <= ptc.DatabaseTimeout || ptc.IdleTxTimeout < time.Second {
		return usage(stderr, "-partition-orders, -freezes, -freeze-for and -partition-database-timeout must be positive, -partition-max-stall above -partition-database-timeout, -partition-idle-tx-timeout at least 1s")
	}
	for _, b := range strings.Split(*faultBatches, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(b))
		if err != nil || n < 1 {
			return usage(stderr, "-fault-batches %q: want positive batch sizes, comma-separated", *faultBatches)
		}
		fc.BatchSizes = append(fc.BatchSizes, n)
	}
	if fc.Healthy < 1 || fc.PerClass < 1 || fc.MaxAttempts < 2 {
		return usage(stderr, "-fault-healthy and -fault-per-class must be positive, -fault-max-attempts at least 2")
	}
	fc.DupRate = c.DupRate
	fc.Partitions = c.Partitions
	brokers := strings.TrimSpace(os.Getenv("INBOX_KAFKA_BROKERS"))
	if brokers == "" {
		return usage(stderr, "INBOX_KAFKA_BROKERS is not set; run it with make chaos")
	}
	c.Brokers = strings.Split(brokers, ",")
	c.KafkaDir = os.Getenv("INBOX_KAFKA_DIR")
	c.Strict = os.Getenv("CI") == "true" || os.Getenv("INBOX_REQUIRE_BACKENDS") == "1"
	c.Log = stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	failed := false
	var reports []*chaos.Report
	var faultReports []*chaos.FaultReport
	var chainReports []*chaos.ChainReport
	var gapReports []*chaos.GapReport
	var pauseReports []*chaos.ChainReport
	var partitionReports []*chaos.PartitionReport
	var rewindReports []*chaos.ChainReport
	for _, db := range strings.Split(*dbs, ",") {
		cfg := c
		cfg.Dialect = db
		switch db {
		case "sqlite":
			cfg.Failovers = 0
		case "postgres":
			cfg.DSN, cfg.DBDir = os.Getenv("INBOX_POSTGRES_DSN"), os.Getenv("INBOX_POSTGRES_DIR")
			if cfg.Failovers > 0 {
				cfg.DSN, cfg.StandbyDir = os.Getenv("INBOX_POSTGRES_FAILOVER_DSN"), os.Getenv("INBOX_POSTGRES_STANDBY_DIR")
				cfg.Replication = os.Getenv("INBOX_POSTGRES_REPLICATION")
				if cfg.DSN == "" || cfg.StandbyDir == "" {
					fmt.Fprintln(stderr, "inbox-chaos: -failovers needs a standby: run it with scripts/with-services.sh --postgres-standby sync|async (make chaos-failover)")
					return 1
				}
				cfg.DBRestarts = 0 // the failovers are the database's disruption
			}
		case "mysql":
			cfg.DSN, cfg.DBDir = os.Getenv("INBOX_MYSQL_DSN"), os.Getenv("INBOX_MYSQL_DIR")
			if cfg.Failovers > 0 {
				cfg.StandbyDir, cfg.Replication = os.Getenv("INBOX_MYSQL_REPLICA_DIR"), os.Getenv("INBOX_MYSQL_REPLICATION")
				if cfg.StandbyDir == "" {
					fmt.Fprintln(stderr, "inbox-chaos: -failovers needs a replica: run it with scripts/with-services.sh --mariadb-replica semisync|async")
					return 1
				}
				// The killed primary does not rejoin: one failover per run.
				cfg.Failovers, cfg.DBRestarts = 1, 0
			}
		default:
			return usage(stderr, "-db %q: want sqlite, postgres or mysql", db)
		}
		if cfg.BatchSize == 0 {
			cfg.BatchSize = 1
			if db == "sqlite" {
				cfg.BatchSize = 10
			}
		}
		if db != "sqlite" && cfg.DSN == "" {
			fmt.Fprintf(stderr, "inbox-chaos: no DSN for %s (INBOX_POSTGRES_DSN / INBOX_MYSQL_DSN); run it with make chaos\n", db)
			failed = true
			continue
		}
		dir, err := os.MkdirTemp("", "inbox-chaos-"+db+"-")
		if err != nil {
			fmt.Fprintln(stderr, "inbox-chaos:", err)
			return 1
		}
		cfg.WorkDir = dir
		// A database whose run failed keeps its files (consumer logs) for a look.
		dbFailed := false
		if runChaos {
			rep, err := chaos.Run(ctx, cfg)
			if rep != nil {
				fmt.Fprint(stdout, rep.String())
				reports = append(reports, rep)
			}
			if err != nil {
				fmt.Fprintf(stdout, "  run FAILED: %v\n", err)
			}
			dbFailed = err != nil || (!rep.OK() && (!*allowLoss || rep.Ledger.AppliedTwice != 0 || rep.DeadLetters != 0))
		}
		if runFaults && ctx.Err() == nil {
			frep, err := chaos.RunFaults(ctx, cfg, fc)
			if frep != nil {
				fmt.Fprint(stdout, frep.String())
				faultReports = append(faultReports, frep)
			}
			if err != nil {
				fmt.Fprintf(stdout, "  fault phase FAILED: %v\n", err)
			}
			dbFailed = dbFailed || err != nil || !frep.OK()
		}
		if runChain && ctx.Err() == nil && cfg.Failovers == 0 && cfg.LeaderKills == 0 {
			ccfg := cfg
			ccfg.Duration, ccfg.Kills = *chainDuration, *chainKills
			crep, err := chaos.RunChain(ctx, ccfg, cc)
			if crep != nil {
				fmt.Fprint(stdout, crep.String())
				chainReports = append(chainReports, crep)
			}
			if err != nil {
				fmt.Fprintf(stdout, "  chain phase FAILED: %v\n", err)
			}
			dbFailed = dbFailed || err != nil || !crep.OK()
		}
		if runGap && ctx.Err() == nil && cfg.Failovers == 0 && cfg.LeaderKills == 0 {
			grep, err := chaos.RunGap(ctx, cfg, gc)
			if grep != nil {
				fmt.Fprint(stdout, grep.String())
				gapReports = append(gapReports, grep)
			}
			if err != nil {
				fmt.Fprintf(stdout, "  gap phase FAILED: %v\n", err)
			}
			dbFailed = dbFailed || err != nil || !grep.OK()
		}
		if runPause && ctx.Err() == nil && cfg.Failovers == 0 && cfg.LeaderKills == 0 {
			if db == "sqlite" {
				fmt.Fprintln(stdout, "pause phase: not run on SQLite (it needs a server to tell which paused process holds a transaction open)")
			}
			for _, storeOffsets := range []bool{false, true} {
				if db == "sqlite" || ctx.Err() != nil {
					break
				}
				pcfg := cfg
				pcfg.Duration, pcfg.StoreOffsets = *pauseDuration, storeOffsets
				// Each run's files apart: its judge reads every trace there.
				if pcfg.WorkDir, err = runDir(dir, "pause", storeOffsets); err != nil {
					fmt.Fprintln(stderr, "inbox-chaos:", err)
					return 1
				}
				prep, err := chaos.RunPause(ctx, pcfg, pc)
				if prep != nil {
					fmt.Fprint(stdout, prep.String())
					pauseReports = append(pauseReports, prep)
				}
				if err != nil {
					fmt.Fprintf(stdout, "  pause phase FAILED: %v\n", err)
				}
				dbFailed = dbFailed || err != nil || !prep.OK()
			}
		}
		if runPartition && ctx.Err() == nil && cfg.Failovers == 0 && cfg.LeaderKills == 0 {
			if db == "sqlite" {
				fmt.Fprintln(stdout, "partition phase: not run on SQLite (a local file: no database link to freeze)")
			}
			for _, storeOffsets := range []bool{false, true} {
				if db == "sqlite" || ctx.Err() != nil {
					break
				}
				pcfg := cfg
				pcfg.Orders, pcfg.StoreOffsets = *partitionOrders, storeOffsets
				if pcfg.WorkDir, err = runDir(dir, "partition", storeOffsets); err != nil {
					fmt.Fprintln(stderr, "inbox-chaos:", err)
					return 1
				}
				prep, err := chaos.RunPartition(ctx, pcfg, ptc)
				if prep != nil {
					fmt.Fprint(stdout, prep.String())
					partitionReports = append(partitionReports, prep)
				}
				if err != nil {
					fmt.Fprintf(stdout, "  partition phase FAILED: %v\n", err)
				}
				dbFailed = dbFailed || err != nil || !prep.OK()
			}
		}
		if runRewind && ctx.Err() == nil && cfg.Failovers == 0 && cfg.LeaderKills == 0 && (!*rewindFailover || db == "postgres") {
			rcfg := cfg
			rcfg.Duration = *rewindDuration
			if *rewindFailover {
				rcfg.DSN, rcfg.StandbyDir = os.Getenv("INBOX_POSTGRES_FAILOVER_DSN"), os.Getenv("INBOX_POSTGRES_STANDBY_DIR")
				rcfg.Replication = os.Getenv("INBOX_POSTGRES_REPLICATION")
				if rcfg.DSN == "" || rcfg.StandbyDir == "" || rcfg.Replication != "async" {
					fmt.Fprintln(stderr, "inbox-chaos: -rewind-failover needs an asynchronous standby: run it with scripts/with-services.sh --postgres-standby async")
					return 1
				}
				// The consumers' tables go back with the producer's:
				// they apply again from their stored offsets.
				rcfg.StoreOffsets = true
			}
			// Its files apart from the chain phase's (the event logs).
			rcfg.WorkDir = filepath.Join(dir, "rewind")
			if err := os.Mkdir(rcfg.WorkDir, 0o755); err != nil {
				fmt.Fprintln(stderr, "inbox-chaos:", err)
				return 1
			}
			rrep, err := chaos.RunRewind(ctx, rcfg, rc)
			if rrep != nil {
				fmt.Fprint(stdout, rrep.String())
				rewindReports = append(rewindReports, rrep)
			}
			if err != nil {
				fmt.Fprintf(stdout, "  rewind phase FAILED: %v\n", err)
			}
			dbFailed = dbFailed || err != nil || !rrep.OK()
		}
		failed = failed || dbFailed
		if *keep || dbFailed {
			fmt.Fprintf(stdout, "  files kept in %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(reports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, table(reports))
	}
	if ft := failoverTable(reports); ft != "" {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, ft)
	}
	if lt := leaderTable(reports); lt != "" {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, lt)
	}
	if len(faultReports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, chaos.FaultTable(faultReports))
	}
	if len(chainReports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, chaos.ChainTable(chainReports))
	}
	if len(gapReports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, chaos.GapTable(gapReports))
	}
	if len(pauseReports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, chaos.PauseTable(pauseReports))
	}
	if len(partitionReports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, chaos.PartitionTable(partitionReports))
	}
	if len(rewindReports) > 0 {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, chaos.RewindTable(rewindReports))
	}
	if failed {
		return 1
	}
	return 0
}

// runDir makes the directory of one run of a phase in dir.
func runDir(dir, phase string, storeOffsets bool) (string, error) {
	sub := filepath.Join(dir, fmt.Sprintf("%s-store-offsets-%v", phase, storeOffsets))
	return sub, os.Mkdir(sub, 0o755)
}

// table is the markdown table of docs/RELIABILITY.md.
func table(reps []*chaos.Report) string {
	var b strings.Builder
	b.WriteString("| database | batch | events | messages | duplicates injected | kills | broker restarts | DB restarts | connection terminations | storms | effects applied | lost | applied twice | consumers restarted | wall time |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range reps {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d rounds, %d conns | %d | %d | %d | %d | %d | %.0fs |\n",
			r.Dialect, r.BatchSize, r.Orders, r.InTopic, r.Duplicates, r.Kills, r.BrokerRestarts, r.DBRestarts, r.Terminations, r.ConnsTerminated, r.Storms,
			r.Ledger.Applied, r.Ledger.Lost, r.Ledger.AppliedTwice, r.StoppedConsumers, r.Wall.Seconds())
	}
	return b.String()
}

// failoverTable is the markdown table of docs/RELIABILITY.md's failover
// section, for the runs that had failovers.
func failoverTable(reps []*chaos.Report) string {
	var b strings.Builder
	for _, r := range reps {
		if len(r.FailoverStats) == 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("| database | replication | StoreOffsets | events | failovers | SIGKILLs | lost on the server (at least) | Kafka offset ahead of the DB | repositioned | effects applied | lost | applied twice | promotion (s) | recovery (s) | wall time |\n")
			b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n")
		}
		var lost, ahead int64
		var promote, recovery []time.Duration
		for _, f := range r.FailoverStats {
			lost += f.ServerLost
			ahead += f.KafkaAhead
			promote = append(promote, f.Promote)
			if f.Recovery >= 0 {
				recovery = append(recovery, f.Recovery)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %v | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s | %.0fs |\n",
			r.Dialect, r.Replication, r.StoreOffsets, r.Orders, len(r.FailoverStats), r.Kills, lost, ahead, r.Repositioned,
			r.Ledger.Applied, r.Ledger.Lost, r.Ledger.AppliedTwice, spread(promote), spread(recovery), r.Wall.Seconds())
	}
	return b.String()
}

// leaderTable is the markdown table of the Kafka cluster runs.
func leaderTable(reps []*chaos.Report) string {
	var b strings.Builder
	for _, r := range reps {
		if len(r.LeaderKills) == 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("| database | events | messages | node kills (coordinator / leader) | consumer SIGKILLs | effects applied | lost | applied twice | dead letters | node back (s) | full ISR again (s) | wall time |\n")
			b.WriteString("|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|\n")
		}
		var back, isr []time.Duration
		coord := 0
		for _, k := range r.LeaderKills {
			back = append(back, k.Back)
			isr = append(isr, k.FullISR)
			if strings.HasPrefix(k.Role, "coordinator") {
				coord++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d (%d / %d) | %d | %d | %d | %d | %d | %s | %s | %.0fs |\n",
			r.Dialect, r.Orders, r.InTopic, len(r.LeaderKills), coord, len(r.LeaderKills)-coord, r.Kills,
			r.Ledger.Applied, r.Ledger.Lost, r.Ledger.AppliedTwice, r.DeadLetters, spread(back), spread(isr), r.Wall.Seconds())
	}
	return b.String()
}

// spread is "median (min..max)" in seconds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return fmt.Sprintf("%.2f (%.2f..%.2f)", ds[len(ds)/2].Seconds(), ds[0].Seconds(), ds[len(ds)-1].Seconds())
}

func usage(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "inbox-chaos: "+format+"\n", args...)
	return 2
}
