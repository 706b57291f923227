package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
)

// ChainProcessEnv carries a chain process's configuration, as ProcessEnv
// does for the inventory consumer; RunProcessFromEnv runs either.
const ChainProcessEnv = "INBOX_CHAIN_PROCESS"

// Roles of a chain process.
const (
	RoleRelay    = "relay"    // publishes a stage's outbox (StageOrders or StageReserve)
	RoleConsumer = "consumer" // consumes into a stage (StageReserve or StageLedger)
)

// ChainProcessConfig configures one process of the chain.
type ChainProcessConfig struct {
	Chain   Chain    `json:"chain"`
	Role    string   `json:"role"`
	Stage   string   `json:"stage"`
	Name    string   `json:"name"`
	Brokers []string `json:"brokers"`
	// Relays: the relay's id (a replacement under the same id resumes its
	// shards at once, under another it waits for the leases) and lease.
	RelayID   string        `json:"relay_id"`
	Lease     time.Duration `json:"lease"`
	MaxShards int           `json:"max_shards"` // shards one relay leases at a time; 0: no limit
	// CrashAfter, if positive, makes the relay kill itself with SIGKILL
	// right after its CrashAfter-th publish was acknowledged by the broker,
	// before it marks the messages published: the crash that makes a relay
	// publish again. It first writes InjectedCrash to its output.
	CrashAfter int `json:"crash_after"`
	// Consumers: the group, its session timeout, and the event log
	// ("P"/"D" per processed or duplicate message, as Consume writes).
	Group    string        `json:"group"`
	Session  time.Duration `json:"session"`
	EventLog string        `json:"event_log"`
	// StoreOffsets runs a consumer with consumer.Config.StoreOffsets, in
	// its stage's Chain.OffsetsTable.
	StoreOffsets bool `json:"store_offsets"`
	// Warnings and Trace are ProcessConfig's.
	Warnings bool   `json:"warnings"`
	Trace    string `json:"trace"`
}

// StartChainProcess starts this binary again as a chain process with cfg.
func StartChainProcess(ctx context.Context, cfg ChainProcessConfig, output io.Writer) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), ChainProcessEnv+"="+string(raw))
	cmd.Stdout = output
	cmd.Stderr = output
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Name, err)
	}
	return cmd, nil
}

// RunChainProcess runs one relay or consumer of the chain until ctx ends.
// A database that cannot be reached at start is waited for.
func RunChainProcess(ctx context.Context, cfg ChainProcessConfig, stderr io.Writer) error {
	log := processLogger(stderr, cfg.Warnings).With("process", cfg.Name)
	db, _, err := openRetrying(ctx, cfg.Chain.Backend, log)
	if err != nil {
		return err
	}
	c := cfg.Chain
	switch cfg.Role {
	case RoleRelay:
		ob, err := c.NewOutbox(db, cfg.Stage, log)
		if err != nil {
			return err
		}
		w := outbox.NewKafkaWriter(cfg.Brokers...)
		defer w.Close()
		pub, err := outbox.NewKafkaPublisher(w)
		if err != nil {
			return err
		}
		var p outbox.Publisher = pub
		if cfg.CrashAfter > 0 {
			p = &crashingPublisher{KafkaPublisher: pub, after: cfg.CrashAfter, out: stderr}
		}
		// Small cycles: a SIGKILL then often lands between a publish and
		// its acknowledgement in the database.
		r, err := ob.NewRelay(p, outbox.RelayConfig{ID: cfg.RelayID, Lease: cfg.Lease, MaxShards: cfg.MaxShards, MaxMessages: 5, PollInterval: 20 * time.Millisecond})
		if err != nil {
			return err
		}
		return r.Run(ctx)
	case RoleConsumer:
		store, err := c.Inbox(cfg.Stage)
		if err != nil {
			return err
		}
		ib, err := inbox.New(db, store, inbox.Config{Logger: log, MaxAttempts: 20})
		if err != nil {
			return err
		}
		var topic string
		var h consumer.Handler
		switch cfg.Stage {
		case StageReserve:
			ob, err := c.NewOutbox(db, StageReserve, log)
			if err != nil {
				return err
			}
			topic, h = c.OrdersTopic(), c.ReserveHandler(ob)
		case StageLedger:
			topic, h = c.StockTopic(), c.LedgerHandler()
		default:
			return fmt.Errorf("no consumer for stage %q", cfg.Stage)
		}
		events, err := os.OpenFile(cfg.EventLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer events.Close()
		hks, closeTrace, err := outcomeHooks(events, cfg.Trace)
		if err != nil {
			return err
		}
		defer closeTrace()
		cons, err := consumer.New(consumer.Config{
			Brokers: cfg.Brokers, GroupID: cfg.Group, Topics: []string{topic}, Inbox: ib, Consumer: cfg.Stage, Handler: h,
			BatchWait: 20 * time.Millisecond, SessionTimeout: cfg.Session, HeartbeatInterval: cfg.Session / 4, RebalanceTimeout: 2 * cfg.Session,
			Logger: log, Hooks: hks, StoreOffsets: cfg.StoreOffsets, OffsetsTable: c.OffsetsTable(cfg.Stage),
		})
		if err != nil {
			return err
		}
		if cfg.StoreOffsets {
			if err := migrateOffsets(ctx, cons, store, db, log); err != nil {
				return err
			}
		}
		return cons.Run(ctx)
	}
	return fmt.Errorf("unknown chain role %q", cfg.Role)
}

// InjectedCrash starts the line a relay writes before it kills itself
// (ChainProcessConfig.CrashAfter).
const InjectedCrash = "INJECTED CRASH"

// crashingPublisher publishes through KafkaPublisher (keeping its Limits)
// and kills its own process after the after-th acknowledged publish.
type crashingPublisher struct {
	*outbox.KafkaPublisher
	after, n int
	out      io.Writer
}

func (p *crashingPublisher) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := p.KafkaPublisher.Publish(ctx, msgs); err != nil {
		return err
	}
	if p.n++; p.n == p.after {
		fmt.Fprintf(p.out, "%s: SIGKILL to itself after publish %d (%d messages acknowledged by the broker, not marked published)\n", InjectedCrash, p.n, len(msgs))
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	return nil
}

func runChainFromEnv(ctx context.Context, raw string, stderr io.Writer) (bool, int) {
	var cfg ChainProcessConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(stderr, "chain process: bad %s: %v\n", ChainProcessEnv, err)
		return true, 2
	}
	if err := RunChainProcess(ctx, cfg, stderr); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "chain process %s: %v\n", cfg.Name, err)
		return true, 1
	}
	return true, 0
}

// TopicScan is what a chain topic holds, read from the start to its end.
type TopicScan struct {
	Messages   int64 // messages in the topic
	Distinct   int   // distinct event ids
	Duplicates int64 // Messages - Distinct: copies published again after a relay lost its acknowledgement
	Missing    int   // expected event ids not in the topic
	// Reordered counts first copies that do not follow their key's previous
	// first copy (N+1): the order the downstream inbox applies.
	Reordered int
	NoID      int // messages without an event id header
}

// ScanTopic reads every message of topic's partitions (up to their end
// offsets now) and checks that each of want's ids is there, counting the
// duplicates and the keys whose first copies are out of order.
func ScanTopic(ctx context.Context, brokers []string, topic string, partitions int, want []string) (TopicScan, error) {
	var s TopicScan
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	req := make([]kafka.OffsetRequest, partitions)
	for i := range req {
		req[i] = kafka.LastOffsetOf(i)
	}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: req}})
	if err != nil {
		return s, err
	}
	seen := map[string]bool{}
	lastFirst := map[string]int64{} // key -> N of its last first copy
	for _, p := range offs.Topics[topic] {
		if p.Error != nil {
			return s, p.Error
		}
		if p.LastOffset == 0 {
			continue
		}
		rd := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p.Partition, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 200 * time.Millisecond})
		for {
			m, err := rd.ReadMessage(ctx)
			if err != nil {
				rd.Close()
				return s, fmt.Errorf("read %s/%d: %w", topic, p.Partition, err)
			}
			s.Messages++
			id := ""
			for _, h := range m.Headers {
				if h.Key == "event_id" {
					id = string(h.Value)
				}
			}
			if id == "" {
				s.NoID++
			} else if !seen[id] {
				seen[id] = true
				var ev ChainEvent
				if err := json.Unmarshal(m.Value, &ev); err != nil {
					rd.Close()
					return s, fmt.Errorf("%s: event %s: %w", topic, id, err)
				}
				if ev.N != lastFirst[string(m.Key)]+1 {
					s.Reordered++
				}
				lastFirst[string(m.Key)] = ev.N
			}
			if m.Offset+1 >= p.LastOffset {
				break
			}
		}
		rd.Close()
	}
	s.Distinct = len(seen)
	s.Duplicates = s.Messages - int64(s.Distinct)
	for _, id := range want {
		if !seen[id] {
			s.Missing++
		}
	}
	return s, nil
}

// Problems lists what is wrong with the topic.
func (s TopicScan) Problems(topic string) []string {
	var p []string
	if s.Missing > 0 {
		p = append(p, fmt.Sprintf("%s: %d events never published", topic, s.Missing))
	}
	if s.Reordered > 0 {
		p = append(p, fmt.Sprintf("%s: %d first copies out of their key's order", topic, s.Reordered))
	}
	if s.NoID > 0 {
		p = append(p, fmt.Sprintf("%s: %d messages without an event id", topic, s.NoID))
	}
	return p
}

// EventIDs returns the ids of OrderCreated (stage StageOrders) or
// StockReserved (StageReserve) for orders.
func EventIDs(stage string, orders []ChainEvent) []string {
	prefix := "order-created-"
	if stage == StageReserve {
		prefix = "stock-reserved-"
	}
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = prefix + o.Order
	}
	return ids
}
