package consumer

// The transport.Client over github.com/segmentio/kafka-go, the default when
// Config.Kafka.Transport is nil: its ConsumerGroup and Generation (eager
// rebalancing), a partition-pinned Reader per started partition, a Client
// for the log offsets and the topics, and a Writer for the default dead
// letters.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/transport"
)

// transportMetadataTTL is how long the consumer's own transport (log-offset
// lookups, the default dead-letter writer) trusts its view of the
// partitions' leaders: one metadata request per interval in the background.
const transportMetadataTTL = time.Second

// kafkaGo is the transport.Client over kafka-go, on Config.Brokers and
// Config.Kafka.Dialer.
type kafkaGo struct {
	brokers []string
	dialer  *kafka.Dialer
	log     *slog.Logger
	// transport carries the consumer's own requests (the default dead-letter
	// writer's, the log offset lookups). Its connections and metadata
	// goroutine live until CloseIdleConnections, which Close calls when Run
	// ends: kafka.Writer.Close does not.
	transport *kafka.Transport
	ownDLQ    *kafka.Writer
}

func newKafkaGo(brokers []string, dialer *kafka.Dialer, log *slog.Logger) *kafkaGo {
	return &kafkaGo{
		brokers: brokers,
		dialer:  dialer,
		log:     log,
		transport: &kafka.Transport{
			Dial:     dialer.DialFunc,
			TLS:      dialer.TLS,
			SASL:     dialer.SASLMechanism,
			ClientID: dialer.ClientID,
			// kafka-go refreshes a transport's metadata only when this
			// expires (default 6 s), not when a leader is unreachable:
			// after a broker dies, every log-offset lookup of a partition
			// starting up (and every dead letter) went to the dead leader
			// until then (seen as ERROR lines in the cluster run).
			MetadataTTL: transportMetadataTTL,
		},
	}
}

func (k *kafkaGo) Group(cfg transport.GroupConfig) (transport.Group, error) {
	log := cmp.Or(cfg.Logger, k.log)
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                cfg.GroupID,
		Brokers:           k.brokers,
		Dialer:            k.dialer,
		Topics:            cfg.Topics,
		SessionTimeout:    cfg.SessionTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		RebalanceTimeout:  cfg.RebalanceTimeout,
		JoinGroupBackoff:  cfg.JoinBackoff,
		StartOffset:       cfg.StartOffset,
		Logger:            kafkaLogger(log, slog.LevelDebug),
		ErrorLogger:       kafkaLogger(log, slog.LevelWarn),
	})
	if err != nil {
		return nil, fmt.Errorf("kafka-go rejected the group configuration: %w", err)
	}
	return kafkaGoGroup{g: g, k: k, maxWait: cfg.MaxWait, log: log}, nil
}

func (k *kafkaGo) LogOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error) {
	cl := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport, Timeout: 10 * time.Second}
	resp, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
		topic: {kafka.FirstOffsetOf(partition), kafka.LastOffsetOf(partition)},
	}})
	if err != nil {
		return 0, 0, err
	}
	for _, p := range resp.Topics[topic] {
		if p.Partition != partition {
			continue
		}
		if p.Error != nil {
			return 0, 0, p.Error
		}
		return p.FirstOffset, p.LastOffset, nil
	}
	return 0, 0, fmt.Errorf("consumer: no log offsets for %s/%d in the broker's answer", topic, partition)
}

// MissingTopics asks the transport, whose metadata cache (all topics,
// refreshed every transportMetadataTTL) answers without a request that
// could create a topic: kafka-go sets no AllowAutoTopicCreation.
func (k *kafkaGo) MissingTopics(ctx context.Context, topics []string) ([]string, error) {
	cl := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport, Timeout: 10 * time.Second}
	resp, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, err
	}
	known := make(map[string]bool, len(resp.Topics))
	for _, t := range resp.Topics {
		if !errors.Is(t.Error, kafka.UnknownTopicOrPartition) && !errors.Is(t.Error, kafka.TopicAuthorizationFailed) {
			known[t.Name] = true
		}
	}
	var missing []string
	for _, t := range topics {
		if !known[t] {
			missing = append(missing, t)
		}
	}
	return missing, nil
}

func (k *kafkaGo) DeadLetterWriter() transport.Writer {
	k.ownDLQ = &kafka.Writer{
		Addr:         kafka.TCP(k.brokers...),
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		MaxAttempts:  3,
		BatchTimeout: 5 * time.Millisecond,
		BatchBytes:   transport.MaxDeadLetterBytes,
		Transport:    k.transport,
	}
	return k.ownDLQ
}

func (k *kafkaGo) Close() {
	if k.ownDLQ != nil {
		if err := k.ownDLQ.Close(); err != nil {
			k.log.Warn("closing the dead-letter writer failed", "error", err)
		}
	}
	// After the writer's Close, which flushes and needs the transport.
	k.transport.CloseIdleConnections()
}

type kafkaGoGroup struct {
	g       *kafka.ConsumerGroup
	k       *kafkaGo
	maxWait time.Duration
	log     *slog.Logger
}

// Next: kafka-go's rebalancing is eager, and its Next returns only after
// every function of the previous generation returned.
func (g kafkaGoGroup) Next(ctx context.Context) (transport.Generation, error) {
	gen, err := g.g.Next(ctx)
	if err != nil {
		return nil, err
	}
	return &kafkaGoGeneration{gen: gen, g: g}, nil
}

// Rejected tells the errors of the group protocol that retrying cannot
// cure: the configuration (or the credentials and ACLs behind it) must
// change.
func (kafkaGoGroup) Rejected(err error) bool {
	for _, e := range []kafka.Error{
		kafka.InvalidSessionTimeout,
		kafka.InvalidGroupId,
		kafka.GroupAuthorizationFailed,
		kafka.TopicAuthorizationFailed,
		kafka.SASLAuthenticationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Close ends the current generation, waits for its functions (which commit
// what they finished) and then leaves the group.
func (g kafkaGoGroup) Close() error { return g.g.Close() }

// kafkaGoGeneration: the context kafka-go's Start passes ends with
// kafka.ErrGenerationEnded as its error (and so its Cause), and kafka-go
// ends the generation when any started function returns, which is the
// rejoin the contract asks for when a function returns on its own.
type kafkaGoGeneration struct {
	gen *kafka.Generation
	g   kafkaGoGroup
	// commitMu serialises the generation's commits, which share its
	// connection to the coordinator.
	commitMu sync.Mutex
}

func (g *kafkaGoGeneration) ID() int32 { return g.gen.ID }

func (g *kafkaGoGeneration) MemberID() string { return g.gen.MemberID }

func (g *kafkaGoGeneration) Assigned(topic string) []transport.Assignment {
	pas := g.gen.Assignments[topic]
	out := make([]transport.Assignment, len(pas))
	for i, pa := range pas {
		out[i] = transport.Assignment{Topic: topic, Partition: pa.ID, Offset: pa.Offset}
	}
	return out
}

// Start runs fn with a partition-pinned kafka.Reader (no GroupID: the
// generation commits), closed when fn returns. Its OffsetOutOfRangeError
// is left unset, so an offset past the log end is retried silently, as
// transport.PartitionReader allows.
func (g *kafkaGoGeneration) Start(a transport.Assignment, fn func(ctx context.Context, r transport.PartitionReader)) {
	g.gen.Start(func(ctx context.Context) {
		log := g.g.log.With("topic", a.Topic, "partition", a.Partition, "generation", g.gen.ID)
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:     g.g.k.brokers,
			Topic:       a.Topic,
			Partition:   a.Partition,
			Dialer:      g.g.k.dialer,
			MinBytes:    1,
			MaxBytes:    transport.MaxFetchBytes,
			MaxWait:     g.g.maxWait,
			Logger:      kafkaLogger(log, slog.LevelDebug),
			ErrorLogger: kafkaLogger(log, slog.LevelWarn),
		})
		defer r.Close()
		fn(ctx, kafkaGoReader{r})
	})
}

func (g *kafkaGoGeneration) Commit(topic string, partition int, next int64) error {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	return g.gen.CommitOffsets(map[string]map[int]int64{topic: {partition: next}})
}

// Over: kafka-go returns the OffsetCommit response's error code as a
// kafka.Error. REBALANCE_IN_PROGRESS is not among them: the coordinator
// answers it to a member of the current generation while the next one
// forms.
func (*kafkaGoGeneration) Over(err error) bool {
	return errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.FencedInstanceID)
}

// kafkaGoReader is the transport.PartitionReader of a kafka.Reader.
type kafkaGoReader struct{ r *kafka.Reader }

func (r kafkaGoReader) SetOffset(offset int64) error { return r.r.SetOffset(offset) }

func (r kafkaGoReader) Fetch(ctx context.Context) (kafka.Message, error) {
	return r.r.FetchMessage(ctx)
}

func (r kafkaGoReader) Close() error { return r.r.Close() }

// CaughtUp reads the reader's lag: the high watermark of the last
// message's fetch response past that message.
func (r kafkaGoReader) CaughtUp() bool { return r.r.Lag() == 0 }

func kafkaLogger(log *slog.Logger, level slog.Level) kafka.Logger {
	return kafka.LoggerFunc(func(format string, args ...any) {
		if log.Enabled(context.Background(), level) {
			log.Log(context.Background(), level, "kafka-go: "+strings.TrimSpace(fmt.Sprintf(format, args...)))
		}
	})
}
