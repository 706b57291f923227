package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

// order is the OrderCreated event's payload.
type order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int64  `json:"qty"`
}

type demo struct {
	out        io.Writer
	stderr     io.Writer
	orders     int
	dupRate    float64
	partitions int
	seed       uint64
	keep       bool
	backend    backend
	brokers    []string
	topic      string
	session    time.Duration
	dir        string
	db         *gorm.DB

	sent      []order // unique orders, in production order
	messages  int     // messages written, producer duplicates included
	producerD int     // orders the producer sent twice
	children  []*exec.Cmd
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inbox-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := &demo{out: stdout, stderr: stderr}
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
	d.backend = backend{Dialect: *dialect, DSN: *dsn, RunID: randomID()}
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
		defer d.backend.dropTables(ctx, d.db)
	}
	if err := d.setupBroker(ctx); err != nil {
		return false, err
	}
	d.say("inbox demo: %d orders, %s database, %s Kafka, topic %q with %d partitions", d.orders, d.backend.Dialect, d.brokerKind(), d.topic, d.partitions)

	d.say("[1/5] producing orders (%.0f%% sent twice by the producer)", d.dupRate*100)
	if err := d.produce(ctx); err != nil {
		return false, fmt.Errorf("produce: %w", err)
	}
	d.say("      %d messages written: %d orders + %d producer duplicates", d.messages, d.orders, d.producerD)

	group := "inventory-" + d.backend.RunID
	live := filepath.Join(dir, "live.log")
	d.say("[2/5] consumer #1 starts; it will be killed with SIGKILL mid-stream")
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
	killedAt, err := d.backend.reservations(ctx, d.db)
	if err != nil {
		return false, err
	}
	d.say("      consumer #1 killed after %d reservations; its uncommitted offsets will be redelivered", killedAt)

	d.say("[3/5] consumer #2 starts; consumer #3 joins the group later (rebalance)")
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

	d.say("[4/5] replaying the whole topic with a new consumer group")
	replayGroup := "inventory-replay-" + d.backend.RunID
	replay := filepath.Join(dir, "replay.log")
	if _, err := d.startChild(ctx, "replay", replayGroup, replay); err != nil {
		return false, err
	}
	if err := d.waitCommitted(ctx, replayGroup); err != nil {
		return false, err
	}
	d.stopChildren()

	d.say("[5/5] verifying")
	return d.report(ctx, live, replay, time.Since(start))
}

func (d *demo) setupDB(ctx context.Context) error {
	db, store, err := d.backend.open()
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
	skus := make([]string, 20)
	for i := range skus {
		skus[i] = fmt.Sprintf("sku-%02d", i+1)
	}
	return d.backend.createTables(ctx, db, skus)
}

func (d *demo) brokerKind() string {
	if d.session == 0 || d.session >= 6*time.Second {
		return "real"
	}
	return "in-process"
}

func (d *demo) setupBroker(ctx context.Context) error {
	d.topic = "orders-" + d.backend.RunID
	if len(d.brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(d.partitions), d.topic), kfake.GroupMinSessionTimeout(500*time.Millisecond))
		if err != nil {
			return fmt.Errorf("in-process Kafka: %w", err)
		}
		go func() { <-ctx.Done(); c.Close() }()
		d.brokers = c.ListenAddrs()
		d.session = 2 * time.Second
		return nil
	}
	d.session = 6 * time.Second
	return createTopic(ctx, d.brokers[0], d.topic, d.partitions)
}

func createTopic(ctx context.Context, broker, topic string, partitions int) error {
	dialer := &kafka.Dialer{Timeout: 10 * time.Second}
	conn, err := dialer.DialContext(ctx, "tcp", broker)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", broker, err)
	}
	defer conn.Close()
	controller, err := conn.Controller()
	if err != nil {
		return err
	}
	cc, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(controller.Host, strconv.Itoa(controller.Port)))
	if err != nil {
		return err
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for {
		if ps, err := conn.ReadPartitions(topic); err == nil && len(ps) == partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s did not appear: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// produce writes the orders, each with the event id and time the producer
// sets, and writes some of them a second time, later, the way a relay resends
// after a crash.
func (d *demo) produce(ctx context.Context) error {
	rng := rand.New(rand.NewPCG(d.seed, 7))
	w := &kafka.Writer{
		Addr:         kafka.TCP(d.brokers...),
		Topic:        d.topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    200,
		BatchTimeout: 5 * time.Millisecond,
	}
	defer w.Close()
	base := time.Now().UTC().Add(-time.Hour)
	var msgs []kafka.Message
	var resend []kafka.Message
	for i := range d.orders {
		o := order{OrderID: fmt.Sprintf("order-%s-%06d", d.backend.RunID, i), SKU: fmt.Sprintf("sku-%02d", 1+rng.IntN(20)), Qty: 1 + rng.Int64N(5)}
		d.sent = append(d.sent, o)
		value, _ := json.Marshal(o)
		m := kafka.Message{Key: []byte(o.OrderID), Value: value, Headers: []kafka.Header{
			{Key: "event_id", Value: []byte(o.OrderID)},
			{Key: "event_time", Value: []byte(base.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano))},
			{Key: "type", Value: []byte("OrderCreated")},
		}}
		msgs = append(msgs, m)
		if rng.Float64() < d.dupRate {
			resend = append(resend, m)
		}
		// Resend a little later, in the same partition (same key).
		if len(resend) > 0 && rng.IntN(4) == 0 {
			msgs = append(msgs, resend[0])
			resend = resend[1:]
			d.producerD++
		}
	}
	msgs = append(msgs, resend...)
	d.producerD += len(resend)
	for lo := 0; lo < len(msgs); lo += 500 {
		hi := min(lo+500, len(msgs))
		if err := writeRetrying(ctx, w, msgs[lo:hi]); err != nil {
			return err
		}
	}
	d.messages = len(msgs)
	return nil
}

func writeRetrying(ctx context.Context, w *kafka.Writer, msgs []kafka.Message) error {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = w.WriteMessages(ctx, msgs...); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

func (d *demo) startChild(ctx context.Context, name, group, eventLog string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(childConfig{Backend: d.backend, Brokers: d.brokers, Topic: d.topic, Group: group, Name: name, EventLog: eventLog, Session: d.session.String()})
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stdout = d.stderr
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
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
		n, err := d.backend.reservations(ctx, d.db)
		return n >= int64(target), fmt.Sprintf("%d/%d orders reserved", n, d.orders), err
	})
}

// waitCommitted waits until the group has committed the end offset of every
// partition: every message was processed (or skipped as a duplicate) and
// acknowledged.
func (d *demo) waitCommitted(ctx context.Context, group string) error {
	client := &kafka.Client{Addr: kafka.TCP(d.brokers...), Timeout: 5 * time.Second}
	parts := make([]int, d.partitions)
	for i := range parts {
		parts[i] = i
	}
	ends := map[int]int64{}
	return d.poll(ctx, func() (bool, string, error) {
		if len(ends) == 0 {
			req := make([]kafka.OffsetRequest, d.partitions)
			for i := range req {
				req[i] = kafka.LastOffsetOf(i)
			}
			res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{d.topic: req}})
			if err != nil {
				return false, "", nil // transient: the broker may be busy
			}
			for _, p := range res.Topics[d.topic] {
				if p.Error != nil {
					return false, "", nil
				}
				ends[p.Partition] = p.LastOffset
			}
		}
		res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{d.topic: parts}})
		if err != nil {
			return false, "waiting for the group's commits", nil
		}
		var done, total int64
		all := len(res.Topics[d.topic]) == d.partitions
		for _, p := range res.Topics[d.topic] {
			total += ends[p.Partition]
			if p.CommittedOffset > 0 {
				done += min(p.CommittedOffset, ends[p.Partition])
			}
			if p.CommittedOffset < ends[p.Partition] {
				all = false
			}
		}
		return all, fmt.Sprintf("%d/%d messages consumed and committed", done, total), nil
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

func countOutcomes(path string) (processed, duplicates, assigned int, err error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch line {
		case "P":
			processed++
		case "D":
			duplicates++
		case "A":
			assigned++
		}
	}
	return processed, duplicates, assigned, nil
}

func (d *demo) report(ctx context.Context, liveLog, replayLog string, took time.Duration) (bool, error) {
	liveP, liveD, liveA, err := countOutcomes(liveLog)
	if err != nil {
		return false, err
	}
	replayP, replayD, _, err := countOutcomes(replayLog)
	if err != nil {
		return false, err
	}
	applied, err := d.backend.reservations(ctx, d.db)
	if err != nil {
		return false, err
	}
	var twice []struct {
		OrderID string
		N       int64
	}
	if err := d.db.WithContext(ctx).Table(d.backend.ledgerTable()).Select("order_id, COUNT(*) AS n").Group("order_id").Having("COUNT(*) > 1").Scan(&twice).Error; err != nil {
		return false, err
	}
	var distinct int64
	if err := d.db.WithContext(ctx).Table(d.backend.ledgerTable()).Distinct("order_id").Count(&distinct).Error; err != nil {
		return false, err
	}
	var reserved int64
	if err := d.db.WithContext(ctx).Table(d.backend.stockTable()).Select("COALESCE(SUM(reserved), 0)").Scan(&reserved).Error; err != nil {
		return false, err
	}
	var ordered int64
	for _, o := range d.sent {
		ordered += o.Qty
	}

	d.say("")
	d.say("  events sent            %7d  (%d orders, %d sent twice by the producer)", d.messages, d.orders, d.producerD)
	d.say("  delivered to consumers %7d  (counted by the consumers; includes redeliveries after the kill and the rebalance)", liveP+liveD)
	d.say("  partition assignments  %7d  (%d partitions; every assignment past the first %d is a hand-over: the kill and the rebalance)", liveA, d.partitions, d.partitions)
	d.say("  duplicates skipped     %7d", liveD)
	d.say("  reservations applied   %7d", applied)
	d.say("  replay, new group      %7d delivered, %d applied, %d skipped as duplicates", replayP+replayD, replayP, replayD)
	d.say("  time                   %7.1fs", took.Seconds())

	var problems []string
	if len(twice) > 0 {
		problems = append(problems, fmt.Sprintf("%d orders reserved more than once (e.g. %s ×%d)", len(twice), twice[0].OrderID, twice[0].N))
	}
	if missing := int64(d.orders) - distinct; missing > 0 {
		problems = append(problems, fmt.Sprintf("%d orders never reserved", missing))
	}
	if reserved != ordered {
		problems = append(problems, fmt.Sprintf("stock reserved %d != %d ordered", reserved, ordered))
	}
	if replayP != 0 {
		problems = append(problems, fmt.Sprintf("the replay applied %d effects again", replayP))
	}
	if replayP+replayD != d.messages {
		problems = append(problems, fmt.Sprintf("the replay saw %d of %d messages", replayP+replayD, d.messages))
	}
	if len(problems) > 0 {
		d.say("  verification           FAILED: %s", strings.Join(problems, "; "))
		return false, nil
	}
	d.say("  verification           OK: stock reserved %d == %d ordered; each of %d orders reserved exactly once", reserved, ordered, d.orders)
	return true, nil
}
