package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/testtransport"
	"github.com/inboxgo/inbox/header"
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
	// Drop, if set, makes the relay of the aligned outbox A lose one
	// message on purpose: the message its cycles stamp with this shard
	// and sequence number is never sent, yet reported to the relay as
	// published, as a broker that acknowledged a write it then lost would.
	// The relay writes InjectedDrop to its output when it first drops it.
	Drop *SeqPos `json:"drop,omitempty"`
	// Consumers: the group, its session timeout, and the event log
	// ("P"/"D" per processed or duplicate message, as Consume writes).
	Group    string        `json:"group"`
	Session  time.Duration `json:"session"`
	EventLog string        `json:"event_log"`
	// StoreOffsets runs a consumer with consumer.Config.Offsets.Store, in
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
		var p relayPublisher = pub
		if cfg.CrashAfter > 0 {
			p = &crashingPublisher{relayPublisher: p, after: cfg.CrashAfter, out: stderr}
		}
		if cfg.Drop != nil {
			if cfg.Stage != StageOrders {
				return fmt.Errorf("drop: only the relay of the aligned outbox %s drops a message on purpose", StageOrders)
			}
			p = &droppingPublisher{relayPublisher: p, at: *cfg.Drop, out: stderr}
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
		var trusted []string
		if Sequenced(cfg.Stage) {
			// The outbox before the stage is the chain's own: its source
			// is trusted. It lives in this database, so the id is read
			// from its table; a deployment configures the id that
			// inboxctl outbox source prints.
			src, err := c.sourceRetrying(ctx, db, publisherOf(cfg.Stage), log)
			if err != nil {
				return err
			}
			trusted = []string{src}
		}
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
		ccfg := consumer.Config{
			Brokers: cfg.Brokers, GroupID: cfg.Group, Topics: []string{topic}, Inbox: ib, Consumer: cfg.Stage, Handler: h,
			BatchWait: 20 * time.Millisecond, Kafka: consumer.KafkaConfig{
				SessionTimeout:    cfg.Session,
				HeartbeatInterval: cfg.Session / 4,
				RebalanceTimeout:  2 * cfg.Session,
			},
			Logger: log, Hooks: hks, Offsets: consumer.OffsetsConfig{
				Store: cfg.StoreOffsets,
				Table: c.OffsetsTable(cfg.Stage),
			},
			Sequenced: consumer.SequencedConfig{Sources: trusted},
		}
		if err := testtransport.Apply(&ccfg); err != nil {
			return err
		}
		cons, err := consumer.New(ccfg)
		if err != nil {
			return err
		}
		if cfg.StoreOffsets || len(trusted) > 0 {
			if err := migrateConsumer(ctx, cons, store, db, log); err != nil {
				return err
			}
		}
		return cons.Run(ctx)
	}
	return fmt.Errorf("unknown chain role %q", cfg.Role)
}

// publisherOf is the publishing stage whose outbox a consuming stage
// reads.
func publisherOf(stage string) string {
	if stage == StageReserve {
		return StageOrders
	}
	return StageReserve
}

// sourceRetrying reads the source id of a stage's outbox (Chain.Source),
// waiting while the database cannot be reached (it may be restarting).
func (c Chain) sourceRetrying(ctx context.Context, db *gorm.DB, stage string, log *slog.Logger) (string, error) {
	store, err := c.Outbox(stage)
	if err != nil {
		return "", err
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		src, _, err := c.Source(ctx, db, stage)
		if err == nil {
			return src, nil
		}
		if !store.IsRetryable(err) && reachable(ctx, db) {
			return "", fmt.Errorf("source of the %s outbox: %w", stage, err)
		}
		log.Warn("database not reachable for the outbox's source; waiting", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// relayPublisher is what a chain relay publishes through: KafkaPublisher,
// or one of the wrappers below around it. It pins partitions, for the
// aligned outbox A, reads its partitions back, and keeps the writer's Limits.
type relayPublisher interface {
	outbox.PinningPublisher
	outbox.Limited
	outbox.Witness
}

// InjectedCrash starts the line a relay writes before it kills itself
// (ChainProcessConfig.CrashAfter).
const InjectedCrash = "INJECTED CRASH"

// crashingPublisher publishes through relayPublisher and kills its own
// process after the after-th acknowledged publish.
type crashingPublisher struct {
	relayPublisher
	after, n int
	out      io.Writer
}

func (p *crashingPublisher) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := p.relayPublisher.Publish(ctx, msgs); err != nil {
		return err
	}
	p.acknowledged(len(msgs))
	return nil
}

func (p *crashingPublisher) PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error {
	if err := p.relayPublisher.PublishPinned(ctx, msgs, partitions, count); err != nil {
		return err
	}
	p.acknowledged(len(msgs))
	return nil
}

func (p *crashingPublisher) acknowledged(msgs int) {
	if p.n++; p.n == p.after {
		fmt.Fprintf(p.out, "%s: SIGKILL to itself after publish %d (%d messages acknowledged by the broker, not marked published)\n", InjectedCrash, p.n, msgs)
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// SeqPos names a message of an outbox by the sequence headers its relay
// stamps: its shard and its number there.
type SeqPos struct {
	Shard int32 `json:"shard"`
	Seq   int64 `json:"seq"`
}

// InjectedDrop starts the line a relay writes when it first drops the
// message of ChainProcessConfig.Drop.
const InjectedDrop = "INJECTED DROP"

// droppingPublisher leaves out every copy of the message at its shard and
// number and reports it sent: the relay marks it published, so no relay
// ever sends it again, and its stream has a hole for good. It hides the
// hole from the relay's check of the partitions too (each partition's end
// offset reads one higher per message left out), as a message the broker
// loses after the relay saw it land (an unclean leader election).
type droppingPublisher struct {
	relayPublisher
	at      SeqPos
	out     io.Writer
	dropped bool
	hidden  map[int]int64 // partition → messages left out
}

func (p *droppingPublisher) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	ends, err := p.relayPublisher.EndOffsets(ctx, topic, partitions)
	for pt := range ends {
		ends[pt] += p.hidden[pt]
	}
	return ends, err
}

func (p *droppingPublisher) ReadPartition(ctx context.Context, topic string, partition int, from, end int64, fn func(kafka.Message) error) (int64, error) {
	return p.relayPublisher.ReadPartition(ctx, topic, partition, from, end-p.hidden[partition], fn)
}

func (p *droppingPublisher) PublishPinned(ctx context.Context, msgs []kafka.Message, partitions []int, count int) error {
	keep := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if !p.chosen(m) {
			keep = append(keep, i)
			continue
		}
		if p.hidden == nil {
			p.hidden = map[int]int64{}
		}
		p.hidden[partitions[i]]++
		if !p.dropped {
			p.dropped = true
			fmt.Fprintf(p.out, "%s: shard %d seq %d (event %s, partition %d) reported published, never sent\n",
				InjectedDrop, p.at.Shard, p.at.Seq, headerValue(m, header.EventID), partitions[i])
		}
	}
	if len(keep) == len(msgs) {
		return p.relayPublisher.PublishPinned(ctx, msgs, partitions, count)
	}
	if len(keep) == 0 {
		return nil
	}
	sent, sentParts := make([]kafka.Message, len(keep)), make([]int, len(keep))
	for j, i := range keep {
		sent[j], sentParts[j] = msgs[i], partitions[i]
	}
	err := p.relayPublisher.PublishPinned(ctx, sent, sentParts, count)
	var perMessage kafka.WriteErrors
	if err != nil && errors.As(err, &perMessage) && len(perMessage) == len(sent) {
		// The relay reads one entry per message it handed over: the
		// dropped one "succeeded".
		all := make(kafka.WriteErrors, len(msgs))
		for j, i := range keep {
			all[i] = perMessage[j]
		}
		return all
	}
	return err
}

func (p *droppingPublisher) chosen(m kafka.Message) bool {
	return headerValue(m, header.SeqShard) == strconv.Itoa(int(p.at.Shard)) && headerValue(m, header.Seq) == strconv.FormatInt(p.at.Seq, 10)
}

// headerValue is the value of m's first header named key, "" if none.
func headerValue(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
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
	// Aligned counts the messages that carry an aligned outbox's sequence
	// headers (header.SeqPartitions). Each of its streams (source, epoch,
	// partition) must hold the numbers 1, 2, 3... in order, copies aside:
	// StreamGaps are the places where a number came before the next one
	// expected, what a consumer with gap detection stops at. A stream of an
	// epoch that a partition's first message does not carry starts at its
	// first number instead: the relay raised the epoch after the outbox's
	// database went back, and publishes on from where the outbox is.
	Aligned    int64
	StreamGaps []StreamGap
	Epochs     int // distinct epochs among the aligned messages
	// Renumbered lists the aligned copies of an event whose epoch or number
	// differs from its first copy's (at most 10): a consumer deduplicating
	// by watermark takes such a copy for a new event.
	Renumbered []string

	seen   map[string]bool    // the event ids
	firsts map[string][]int64 // per key, the N of its first copies in order
}

// Published reports whether the topic holds event id.
func (s TopicScan) Published(id string) bool { return s.seen[id] }

// MissingOf counts the events of ids that the topic does not hold.
func (s TopicScan) MissingOf(ids []string) int {
	n := 0
	for _, id := range ids {
		if !s.seen[id] {
			n++
		}
	}
	return n
}

// ReorderedSkipping counts the first copies that do not follow their
// key's previous one, as Reordered does, but with the numbers that skip
// reports for their key taken as never placed: a first copy may follow a
// hole of them.
func (s TopicScan) ReorderedSkipping(skip func(key string, n int64) bool) int {
	n := 0
	for key, firsts := range s.firsts {
		last := int64(0)
		for _, got := range firsts {
			want := last + 1
			for skip(key, want) && want < got {
				want++
			}
			if got != want {
				n++
			}
			last = got
		}
	}
	return n
}

// StreamGap is a hole in an aligned stream of a topic: on Partition, the
// first number after Want-1 was Got, at Offset.
type StreamGap struct {
	Source    string
	Epoch     string
	Partition int
	Offset    int64
	Got, Want int64
}

func (g StreamGap) String() string {
	return fmt.Sprintf("partition %d offset %d: seq %d where %d was next (source %s epoch %s)", g.Partition, g.Offset, g.Got, g.Want, g.Source, g.Epoch)
}

// ScanTopic reads every message of topic's partitions (up to their end
// offsets now) and checks that each of want's ids is there, counting the
// duplicates and the keys whose first copies are out of order.
func ScanTopic(ctx context.Context, brokers []string, topic string, partitions int, want []string) (TopicScan, error) {
	s := TopicScan{seen: map[string]bool{}, firsts: map[string][]int64{}}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	req := make([]kafka.OffsetRequest, partitions)
	for i := range req {
		req[i] = kafka.LastOffsetOf(i)
	}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: req}})
	if err != nil {
		return s, err
	}
	seen := s.seen
	lastFirst := map[string]int64{} // key -> N of its last first copy
	type stream struct {
		source, epoch string
		partition     int
	}
	highest := map[stream]int64{}   // the highest number seen on a stream
	firstPos := map[string]string{} // event id -> "epoch/seq" of its first aligned copy
	firstEpoch := map[int]string{}  // the epoch of each partition's first aligned message
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
			if headerValue(m, header.SeqPartitions) != "" {
				s.Aligned++
				st := stream{headerValue(m, header.SeqSource), headerValue(m, header.SeqEpoch), m.Partition}
				seq, err := strconv.ParseInt(headerValue(m, header.Seq), 10, 64)
				if err != nil {
					rd.Close()
					return s, fmt.Errorf("%s/%d offset %d: sequence header: %w", topic, m.Partition, m.Offset, err)
				}
				if _, ok := firstEpoch[m.Partition]; !ok {
					firstEpoch[m.Partition] = st.epoch
				}
				if _, ok := highest[st]; !ok && st.epoch != firstEpoch[m.Partition] {
					highest[st] = seq - 1
				}
				if want := highest[st] + 1; seq > want {
					s.StreamGaps = append(s.StreamGaps, StreamGap{Source: st.source, Epoch: st.epoch, Partition: m.Partition, Offset: m.Offset, Got: seq, Want: want})
				}
				highest[st] = max(highest[st], seq)
			}
			id := headerValue(m, header.EventID)
			if pos := headerValue(m, header.SeqEpoch) + "/" + headerValue(m, header.Seq); id != "" && headerValue(m, header.SeqPartitions) != "" {
				if first, ok := firstPos[id]; !ok {
					firstPos[id] = pos
				} else if first != pos && len(s.Renumbered) < 10 {
					s.Renumbered = append(s.Renumbered, fmt.Sprintf("%s at %d/%d as epoch/seq %s, first copy %s", id, m.Partition, m.Offset, pos, first))
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
				s.firsts[string(m.Key)] = append(s.firsts[string(m.Key)], ev.N)
			}
			if m.Offset+1 >= p.LastOffset {
				break
			}
		}
		rd.Close()
	}
	s.Distinct = len(seen)
	epochs := map[string]bool{}
	for st := range highest {
		epochs[st.epoch] = true
	}
	s.Epochs = len(epochs)
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
	for _, g := range s.StreamGaps {
		p = append(p, fmt.Sprintf("%s: a gap in an aligned stream, %s", topic, g))
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
