package consumer

// The transport over github.com/segmentio/kafka-go: its ConsumerGroup and
// Generation, a partition-pinned Reader per assigned partition, a Client
// for the log offsets and a Writer for the default dead letters.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// transportMetadataTTL is how long the consumer's own transport (log-offset
// lookups, the default dead-letter writer) trusts its view of the
// partitions' leaders: one metadata request per interval in the background.
const transportMetadataTTL = time.Second

// kafkaGo is the transport over kafka-go.
type kafkaGo struct {
	cfg *Config
	log *slog.Logger
	// transport carries the consumer's own requests (the default dead-letter
	// writer's, the log offset lookups). Its connections and metadata
	// goroutine live until CloseIdleConnections, which close calls when Run
	// ends: kafka.Writer.Close does not.
	transport *kafka.Transport
	ownDLQ    *kafka.Writer
}

func newKafkaGo(cfg *Config, log *slog.Logger) *kafkaGo {
	return &kafkaGo{
		cfg: cfg,
		log: log,
		transport: &kafka.Transport{
			Dial:     cfg.Dialer.DialFunc,
			TLS:      cfg.Dialer.TLS,
			SASL:     cfg.Dialer.SASLMechanism,
			ClientID: cfg.Dialer.ClientID,
			// kafka-go refreshes a transport's metadata only when this
			// expires (default 6 s), not when a leader is unreachable:
			// after a broker dies, every log-offset lookup of a partition
			// starting up (and every dead letter) went to the dead leader
			// until then (seen as ERROR lines in the cluster run).
			MetadataTTL: transportMetadataTTL,
		},
	}
}

func (k *kafkaGo) group() (consumerGroup, error) {
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                k.cfg.GroupID,
		Brokers:           k.cfg.Brokers,
		Dialer:            k.cfg.Dialer,
		Topics:            k.cfg.Topics,
		SessionTimeout:    k.cfg.SessionTimeout,
		HeartbeatInterval: k.cfg.HeartbeatInterval,
		RebalanceTimeout:  k.cfg.RebalanceTimeout,
		JoinGroupBackoff:  k.cfg.MinBackoff,
		StartOffset:       k.cfg.StartOffset,
		Logger:            kafkaLogger(k.log, slog.LevelDebug),
		ErrorLogger:       kafkaLogger(k.log, slog.LevelWarn),
	})
	if err != nil {
		return nil, fmt.Errorf("kafka-go rejected the group configuration: %w", err)
	}
	return kafkaGoGroup{g}, nil
}

func (k *kafkaGo) reader(topic string, partition int, log *slog.Logger) partitionReader {
	return kafkaGoReader{kafka.NewReader(kafka.ReaderConfig{
		Brokers:     k.cfg.Brokers,
		Topic:       topic,
		Partition:   partition,
		Dialer:      k.cfg.Dialer,
		MinBytes:    1,
		MaxBytes:    readerMaxBytes,
		MaxWait:     k.cfg.MaxWait,
		Logger:      kafkaLogger(log, slog.LevelDebug),
		ErrorLogger: kafkaLogger(log, slog.LevelWarn),
	})}
}

func (k *kafkaGo) logOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error) {
	cl := &kafka.Client{Addr: kafka.TCP(k.cfg.Brokers...), Transport: k.transport, Timeout: 10 * time.Second}
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

// missingTopics asks the transport, whose metadata cache (all topics,
// refreshed every transportMetadataTTL) answers without a request that
// could create a topic: kafka-go sets no AllowAutoTopicCreation.
func (k *kafkaGo) missingTopics(ctx context.Context, topics []string) ([]string, error) {
	cl := &kafka.Client{Addr: kafka.TCP(k.cfg.Brokers...), Transport: k.transport, Timeout: 10 * time.Second}
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

func (k *kafkaGo) deadLetterWriter() MessageWriter {
	k.ownDLQ = &kafka.Writer{
		Addr:         kafka.TCP(k.cfg.Brokers...),
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		MaxAttempts:  3,
		BatchTimeout: 5 * time.Millisecond,
		BatchBytes:   deadLetterMaxBytes,
		Transport:    k.transport,
	}
	return k.ownDLQ
}

func (k *kafkaGo) close() {
	if k.ownDLQ != nil {
		if err := k.ownDLQ.Close(); err != nil {
			k.log.Warn("closing the dead-letter writer failed", "error", err)
		}
	}
	// After the writer's Close, which flushes and needs the transport.
	k.transport.CloseIdleConnections()
}

type kafkaGoGroup struct{ g *kafka.ConsumerGroup }

func (g kafkaGoGroup) next(ctx context.Context) (generation, error) {
	gen, err := g.g.Next(ctx)
	if err != nil {
		return nil, err
	}
	return kafkaGoGeneration{gen}, nil
}

// rejected tells the errors of the group protocol that retrying cannot
// cure: the configuration (or the credentials and ACLs behind it) must
// change.
func (kafkaGoGroup) rejected(err error) bool {
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

// close waits for the workers of the current generation (which commit what
// they finished) and then leaves the group.
func (g kafkaGoGroup) close() error { return g.g.Close() }

// kafkaGoGeneration: the context kafka-go's Start passes ends with
// kafka.ErrGenerationEnded as its error (and so its Cause), and kafka-go
// ends the generation when any started function returns.
type kafkaGoGeneration struct{ gen *kafka.Generation }

func (g kafkaGoGeneration) id() int32 { return g.gen.ID }

func (g kafkaGoGeneration) memberID() string { return g.gen.MemberID }

func (g kafkaGoGeneration) assignments(topic string) []assignment {
	pas := g.gen.Assignments[topic]
	out := make([]assignment, len(pas))
	for i, pa := range pas {
		out[i] = assignment{partition: pa.ID, offset: pa.Offset}
	}
	return out
}

func (g kafkaGoGeneration) start(fn func(ctx context.Context)) { g.gen.Start(fn) }

func (g kafkaGoGeneration) commit(topic string, partition int, next int64) error {
	return g.gen.CommitOffsets(map[string]map[int]int64{topic: {partition: next}})
}

// over: kafka-go returns the OffsetCommit response's error code as a
// kafka.Error. REBALANCE_IN_PROGRESS is not among them: the coordinator
// answers it to a member of the current generation while the next one
// forms.
func (kafkaGoGeneration) over(err error) bool {
	return errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.FencedInstanceID)
}

// kafkaGoReader is a partition-pinned kafka.Reader (no GroupID: the
// generation commits). Its OffsetOutOfRangeError is left unset, so an
// offset past the log end is retried silently; checkLog and pastLogEnd
// catch that case.
type kafkaGoReader struct{ r *kafka.Reader }

func (r kafkaGoReader) seek(offset int64) error { return r.r.SetOffset(offset) }

func (r kafkaGoReader) fetch(ctx context.Context) (kafka.Message, error) {
	return r.r.FetchMessage(ctx)
}

func (r kafkaGoReader) close() error { return r.r.Close() }

// caughtUp reads the reader's lag: the high watermark of the last
// message's fetch response past that message.
func (r kafkaGoReader) caughtUp() bool { return r.r.Lag() == 0 }

func kafkaLogger(log *slog.Logger, level slog.Level) kafka.Logger {
	return kafka.LoggerFunc(func(format string, args ...any) {
		if log.Enabled(context.Background(), level) {
			log.Log(context.Background(), level, "kafka-go: "+strings.TrimSpace(fmt.Sprintf(format, args...)))
		}
	})
}
