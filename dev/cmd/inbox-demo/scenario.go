package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/inbox"
)

type demo struct {
	out        io.Writer
	stderr     io.Writer
	childOut   io.Writer // stderr, shared by the consumer processes
	orders     int
	dupRate    float64
	partitions int
	seed       uint64
	keep       bool
	backend    inventory.Backend
	brokers    []string
	inProcess  bool
	topic      string
	session    time.Duration
	dir        string
	db         *gorm.DB
	batch      inventory.Batch
	children   []*exec.Cmd
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inbox-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := &demo{out: stdout, stderr: stderr, childOut: inventory.SyncWriter(stderr)}
	fs.IntVar(&d.orders, "orders", 2000, "orders to produce")
	fs.Float64Var(&d.dupRate, "dup", 0.1, "share of orders the producer sends twice (0..1)")
	fs.IntVar(&d.partitions, "partitions", 4, "partitions of the orders topic")
	dialect := fs.String("db", "sqlite", "database: sqlite, postgres or mysql")
	dsn := fs.String("dsn", "", "database DSN (postgres, mysql); default for sqlite: a file in a temporary directory")
	brokers := fs.String("brokers", "", "Kafka bootstrap brokers, comma-separated; default: an in-process broker")
	fs.BoolVar(&d.keep, "keep", false, "keep the demo's tables and files afterwards")
	seed := fs.Uint64("seed", 1, "seed of the order generator")
	timeout := fs.Duration("timeout", 3*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: inbox-demo [flags]\n\nRuns the inventory scenario through the inbox and verifies every order is reserved exactly once.\n\n")
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
		return usageError(stderr, "unexpected arguments %q", fs.Args())
	case d.orders < 1 || d.orders > 1_000_000:
		return usageError(stderr, "-orders %d: want 1..1000000", d.orders)
	case d.dupRate < 0 || d.dupRate > 1:
		return usageError(stderr, "-dup %v: want 0..1", d.dupRate)
	case d.partitions < 1 || d.partitions > 64:
		return usageError(stderr, "-partitions %d: want 1..64", d.partitions)
	case *dialect != "sqlite" && *dialect != "postgres" && *dialect != "mysql":
		return usageError(stderr, "-db %q: want sqlite, postgres or mysql", *dialect)
	case *dialect != "sqlite" && *dsn == "":
		return usageError(stderr, "-db %s needs -dsn", *dialect)
	}
	d.seed = *seed
	d.backend = inventory.Backend{Dialect: *dialect, DSN: *dsn, RunID: randomID()}
	if *brokers != "" {
		d.brokers = strings.Split(*brokers, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	ok, err := d.run(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "inbox-demo:", err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

func (d *demo) run(ctx context.Context) (bool, error) {
	start := time.Now()
	dir, err := os.MkdirTemp("", "inbox-demo-")
	if err != nil {
		return false, err
	}
	d.dir = dir
	defer func() {
		d.stopChildren()
		if !d.keep {
			os.RemoveAll(dir)
		} else {
			d.say("kept files in %s and tables with suffix %s", dir, d.backend.RunID)
		}
	}()
	if d.backend.Dialect == "sqlite" && d.backend.DSN == "" {
		d.backend.DSN = filepath.Join(dir, "inventory.db")
	}
	if err := d.setupDB(ctx); err != nil {
		return false, err
	}
	if !d.keep {
		defer d.backend.DropTables(ctx, d.db)
	}
	if err := d.setupBroker(ctx); err != nil {
		return false, err
	}
	kind := "real"
	if d.inProcess {
		kind = "in-process"
	}
	d.say("inbox demo: %d orders, %s database, %s Kafka, topic %q with %d partitions", d.orders, d.backend.Dialect, kind, d.topic, d.partitions)

	d.say("[1/7] producing orders (%.0f%% sent twice by the producer)", d.dupRate*100)
	d.batch = inventory.Generate(d.backend.RunID, d.orders, d.dupRate, d.seed)
	w := inventory.Writer(d.brokers, d.topic)
	err = inventory.Write(ctx, w, d.batch.Messages)
	w.Close()
	if err != nil {
		return false, err
	}
	d.say("      %d messages written: %d orders + %d producer duplicates", len(d.batch.Messages), d.orders, d.batch.Duplicates)

	group := "inventory-" + d.backend.RunID
	live := filepath.Join(dir, "live.log")
	d.say("[2/7] consumer #1 starts; it will be killed with SIGKILL mid-stream")
	first, err := d.startChild(ctx, "consumer-1", group, live)
	if err != nil {
		return false, err
	}
	if err := d.waitReserved(ctx, d.orders*35/100); err != nil {
		return false, err
	}
	_ = first.Process.Kill()
	_ = first.Wait()
	d.children = d.children[:0]
	killedAt, err := d.backend.Reservations(ctx, d.db)
	if err != nil {
		return false, err
	}
	d.say("      consumer #1 killed after %d reservations; its uncommitted offsets will be redelivered", killedAt)

	d.say("[3/7] consumer #2 starts; consumer #3 joins the group later (rebalance)")
	if _, err := d.startChild(ctx, "consumer-2", group, live); err != nil {
		return false, err
	}
	if err := d.waitReserved(ctx, d.orders*65/100); err != nil {
		return false, err
	}
	if _, err := d.startChild(ctx, "consumer-3", group, live); err != nil {
		return false, err
	}
	if err := d.waitCommitted(ctx, group); err != nil {
		return false, err
	}
	d.stopChildren()

	d.say("[4/7] replaying the whole topic with a new consumer group")
	replayGroup := "inventory-replay-" + d.backend.RunID
	replay := filepath.Join(dir, "replay.log")
	if _, err := d.startChild(ctx, "replay", replayGroup, replay); err != nil {
		return false, err
	}
	if err := d.waitCommitted(ctx, replayGroup); err != nil {
		return false, err
	}
	d.stopChildren()

	d.say("[5/7] verifying")
	ok, err := d.report(ctx, live, replay, time.Since(start))
	if err != nil {
		return false, err
	}
	chainOK, err := d.runChain(ctx)
	if err != nil {
		return false, fmt.Errorf("chain: %w", err)
	}
	d.say("")
	d.say("total time %.1fs", time.Since(start).Seconds())
	return ok && chainOK, nil
}

func (d *demo) setupDB(ctx context.Context) error {
	db, store, err := d.backend.Open()
	if err != nil {
		return err
	}
	d.db = db
	quiet := slog.New(slog.NewTextHandler(d.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ib, err := inbox.New(db, store, inbox.Config{Logger: quiet})
	if err != nil {
		return err
	}
	if err := ib.Migrate(ctx); err != nil {
		return err
	}
	if _, err := ib.Maintain(ctx); err != nil {
		return err
	}
	return d.backend.CreateTables(ctx, db, inventory.SKUs)
}

func (d *demo) setupBroker(ctx context.Context) error {
	d.topic = "orders-" + d.backend.RunID
	if len(d.brokers) == 0 {
		// kfake hangs on a fetch of a topic it does not know: the chain's
		// topics are seeded here too.
		chain := inventory.Chain{Backend: d.backend}
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(d.partitions), d.topic, chain.OrdersTopic(), chain.StockTopic()), kfake.GroupMinSessionTimeout(500*time.Millisecond))
		if err != nil {
			return fmt.Errorf("in-process Kafka: %w", err)
		}
		go func() { <-ctx.Done(); c.Close() }()
		d.brokers = c.ListenAddrs()
		d.inProcess = true
		d.session = 2 * time.Second
		return nil
	}
	// A real broker's group.min.session.timeout.ms is 6 s by default.
	d.session = 6 * time.Second
	return inventory.CreateTopic(ctx, d.brokers[0], d.topic, d.partitions)
}

func (d *demo) startChild(ctx context.Context, name, group, eventLog string) (*exec.Cmd, error) {
	cmd, err := inventory.StartProcess(ctx, inventory.ProcessConfig{
		Backend: d.backend, Brokers: d.brokers, Topic: d.topic, Group: group, Name: name,
		EventLog: eventLog, Session: d.session, BatchSize: 10,
	}, d.childOut)
	if err != nil {
		return nil, err
	}
	d.children = append(d.children, cmd)
	return cmd, nil
}

// stopChildren asks every running consumer to shut down cleanly and waits.
func (d *demo) stopChildren() {
	for _, c := range d.children {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range d.children {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	d.children = nil
}

func (d *demo) waitReserved(ctx context.Context, target int) error {
	return d.poll(ctx, func() (bool, string, error) {
		n, err := d.backend.Reservations(ctx, d.db)
		return n >= int64(target), fmt.Sprintf("%d/%d orders reserved", n, d.orders), err
	})
}

// waitCommitted waits until the group has committed the end offset of every
// partition: every message was processed (or skipped as a duplicate) and
// acknowledged.
func (d *demo) waitCommitted(ctx context.Context, group string) error {
	return d.poll(ctx, func() (bool, string, error) {
		p, err := inventory.GroupProgress(ctx, d.brokers, group, d.topic, d.partitions)
		if err != nil {
			return false, "waiting for the group's commits", nil // the group may be rebalancing
		}
		return p.Done, p.String(), nil
	})
}

// poll calls check until it reports done, printing its progress every two
// seconds.
func (d *demo) poll(ctx context.Context, check func() (bool, string, error)) error {
	last := time.Now()
	for {
		done, progress, err := check()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Since(last) >= 2*time.Second && progress != "" {
			d.say("      ... %s", progress)
			last = time.Now()
		}
		for _, c := range d.children {
			if c.ProcessState != nil {
				return fmt.Errorf("a consumer process exited early: %v", c.ProcessState)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting (%s): %w", progress, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (d *demo) report(ctx context.Context, liveLog, replayLog string, took time.Duration) (bool, error) {
	live, err := inventory.CountOutcomes(liveLog)
	if err != nil {
		return false, err
	}
	replay, err := inventory.CountOutcomes(replayLog)
	if err != nil {
		return false, err
	}
	ledger, err := d.backend.Check(ctx, d.db, d.batch.Orders)
	if err != nil {
		return false, err
	}
	messages := len(d.batch.Messages)
	d.say("")
	d.say("  events sent            %7d  (%d orders, %d sent twice by the producer)", messages, d.orders, d.batch.Duplicates)
	d.say("  delivered to consumers %7d  (counted by the consumers; includes redeliveries after the kill and the rebalance)", live.Processed+live.Duplicates)
	d.say("  partition assignments  %7d  (%d partitions; every assignment past the first %d is a hand-over: the kill and the rebalance)", live.Assigned, d.partitions, d.partitions)
	// Every order is applied once, so each other delivery is a duplicate:
	// a producer's second copy, or a message Kafka delivered again because
	// its offset was not committed before the kill or the hand-over.
	d.say("  duplicates skipped     %7d  (%d sent twice by the producer + %d redelivered by Kafka after the kill and the rebalance)",
		live.Duplicates, d.batch.Duplicates, live.Duplicates-d.batch.Duplicates)
	d.say("  reservations applied   %7d  (with the inbox: once per order)", ledger.Applied)
	d.say("  replay, new group      %7d delivered, %d applied, %d skipped as duplicates", replay.Processed+replay.Duplicates, replay.Processed, replay.Duplicates)
	// A consumer without the inbox applies every delivery it commits: each
	// order once, every duplicate the consumers skipped, and every delivery
	// of the replay. Counted from what was applied, not from the processed
	// outcomes logged: a consumer killed with SIGKILL may have committed an
	// effect whose outcome it never logged.
	naive := int(ledger.Applied) + live.Duplicates + replay.Processed + replay.Duplicates
	d.say("  without the inbox      %7d  reservations the same deliveries would have applied: %d too many (%d duplicates in the first group, %d by the replay)",
		naive, naive-int(ledger.Applied), live.Duplicates, replay.Processed+replay.Duplicates)
	d.say("  time                   %7.1fs", took.Seconds())

	problems := ledger.Problems()
	if replay.Processed != 0 {
		problems = append(problems, fmt.Sprintf("the replay applied %d effects again", replay.Processed))
	}
	if replay.Processed+replay.Duplicates != messages {
		problems = append(problems, fmt.Sprintf("the replay saw %d of %d messages", replay.Processed+replay.Duplicates, messages))
	}
	if len(problems) > 0 {
		d.say("  verification           FAILED: %s", strings.Join(problems, "; "))
		return false, nil
	}
	d.say("  verification           OK: stock reserved %d == %d ordered; each of %d orders reserved exactly once", ledger.Reserved, ledger.Ordered, d.orders)
	return true, nil
}
