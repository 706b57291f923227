package franzgo

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/inboxgo/inbox/transport"
)

// Options configures the connections of a Client.
type Options struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID is the client id sent to the brokers; empty means
	// franz-go's default.
	ClientID string
	// TLS, if not nil, makes every connection use TLS with this config.
	TLS *tls.Config
	// SASL, if not nil, authenticates every connection.
	SASL sasl.Mechanism
	// DialTimeout bounds each connection attempt; 0 means franz-go's
	// default (10 s).
	DialTimeout time.Duration
	// Logger takes franz-go's messages of the client's own requests (log
	// offsets, topic lookups, dead letters) and of a Publisher; a Group
	// logs to transport.GroupConfig.Logger. nil discards them.
	Logger *slog.Logger
	// ClientOptions are appended last to the options of every franz-go
	// client this package creates (the group member, the fetcher, the
	// client of the consumer's own requests and dead letters, a
	// Publisher's), so they override this package's choices: an escape
	// hatch for what Options does not name (a custom dialer, metadata
	// ages, a hook). NewPublisher says which of its choices they cannot
	// override.
	ClientOptions []kgo.Opt
}

// requestTimeout bounds the client's own requests (log offsets, topic
// lookups) and each commit, as kafka-go's transport does.
const requestTimeout = 10 * time.Second

// deadLetterTimeout bounds the delivery of one dead letter, retries
// included, when the caller's context has no earlier deadline.
const deadLetterTimeout = 30 * time.Second

// New returns a Client over franz-go. It connects lazily: an unreachable
// broker shows in the first request, not here.
func New(opts Options) (transport.Client, error) {
	log, err := opts.check()
	if err != nil {
		return nil, err
	}
	c := &client{opts: opts, log: log}
	own := append(c.common(log),
		// The dead-letter writer: franz-go's idempotent producer (its
		// default), every in-sync replica, kafka.Hash's partitioning.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
		kgo.ProducerBatchMaxBytes(transport.MaxDeadLetterBytes+1<<20),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordDeliveryTimeout(deadLetterTimeout),
	)
	cl, err := kgo.NewClient(append(own, opts.ClientOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("franzgo: franz-go rejected the options: %w", err)
	}
	c.own = cl
	return c, nil
}

// check returns an error for options no client can be made of, and the
// logger of the client's own messages.
func (opts Options) check() (*slog.Logger, error) {
	if len(opts.Brokers) == 0 {
		return nil, errors.New("franzgo: Options.Brokers is empty")
	}
	for _, b := range opts.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return nil, fmt.Errorf("franzgo: broker %q is not host:port: %w", b, err)
		}
	}
	if opts.DialTimeout < 0 {
		return nil, fmt.Errorf("franzgo: Options.DialTimeout is negative (%s)", opts.DialTimeout)
	}
	if opts.Logger == nil {
		return slog.New(slog.DiscardHandler), nil
	}
	return opts.Logger, nil
}

// fnv32a is kafka.Hash's hash: FNV-1a, 32 bits, of the key.
func fnv32a(key []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(key)
	return h.Sum32()
}

type client struct {
	opts Options
	log  *slog.Logger
	// own carries the consumer's own requests and the dead letters.
	own *kgo.Client

	mu       sync.Mutex
	dlqTaken bool
}

// common returns the connection options every client of this package
// shares, before Options.ClientOptions.
func (c *client) common(log *slog.Logger) []kgo.Opt { return c.opts.common(log) }

// common returns the connection options of opts, before ClientOptions.
func (opts Options) common(log *slog.Logger) []kgo.Opt {
	o := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.WithLogger(kgoLogger{log}),
	}
	if opts.ClientID != "" {
		o = append(o, kgo.ClientID(opts.ClientID))
	}
	if opts.TLS != nil {
		o = append(o, kgo.DialTLSConfig(opts.TLS.Clone()))
	}
	if opts.SASL != nil {
		o = append(o, kgo.SASL(opts.SASL))
	}
	if opts.DialTimeout > 0 {
		o = append(o, kgo.DialTimeout(opts.DialTimeout))
	}
	return o
}

func (c *client) LogOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	starts, err := listOffsets(ctx, c.own, topic, []int{partition}, -2)
	if err != nil {
		return 0, 0, err
	}
	ends, err := listOffsets(ctx, c.own, topic, []int{partition}, -1)
	if err != nil {
		return 0, 0, err
	}
	return starts[partition], ends[partition], nil
}

// listOffsets returns the offsets of topic's partitions at timestamp ts
// (-2 the log start, -1 the log end), asked of each partition's leader
// (franz-go sends each leader its partitions).
func listOffsets(ctx context.Context, cl *kgo.Client, topic string, partitions []int, ts int64) (map[int]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = int32(p)
		rp.Timestamp = ts
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(partitions))
	for _, t := range resp.Topics {
		if t.Topic != topic {
			continue
		}
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("partition %d: %w", p.Partition, kafkaError(err))
			}
			out[int(p.Partition)] = p.Offset
		}
	}
	for _, p := range partitions {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("franzgo: no log offset for %s/%d in the broker's answer", topic, p)
		}
	}
	return out, nil
}

// MissingTopics sends its own Metadata request with AllowAutoTopicCreation
// false: kmsg's default is true, which would create the topics it asks
// about on a broker with auto.create.topics.enable.
func (c *client) MissingTopics(ctx context.Context, topics []string) ([]string, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, c.own)
	if err != nil {
		return nil, err
	}
	known := make(map[string]bool, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		err := kerr.ErrorForCode(t.ErrorCode)
		if !errors.Is(err, kerr.UnknownTopicOrPartition) && !errors.Is(err, kerr.TopicAuthorizationFailed) {
			known[*t.Topic] = true
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

func (c *client) DeadLetterWriter() transport.Writer {
	c.mu.Lock()
	c.dlqTaken = true
	c.mu.Unlock()
	return deadLetterWriter{c.own}
}

func (c *client) Close() {
	c.mu.Lock()
	taken := c.dlqTaken
	c.mu.Unlock()
	if taken {
		ctx, cancel := context.WithTimeout(context.Background(), deadLetterTimeout)
		if err := c.own.Flush(ctx); err != nil {
			c.log.Warn("flushing the dead-letter writer failed", "error", err)
		}
		cancel()
	}
	c.own.Close()
}

// deadLetterWriter produces synchronously: WriteMessages returns once
// every message is acknowledged by all in-sync replicas, or failed.
type deadLetterWriter struct{ cl *kgo.Client }

func (w deadLetterWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		if m.Topic == "" {
			return errors.New("franzgo: a dead letter names no topic")
		}
		recs[i] = recordOf(m)
	}
	err := w.cl.ProduceSync(ctx, recs...).FirstErr()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kgo.ErrClientClosed):
		return io.ErrClosedPipe
	default:
		return kafkaError(err)
	}
}

// recordOf is m as a franz-go record: its topic, key, value, time (zero:
// franz-go stamps the produce time) and headers; the partition is the
// partitioner's.
func recordOf(m kafka.Message) *kgo.Record {
	r := &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Timestamp: m.Time}
	if len(m.Headers) > 0 {
		r.Headers = make([]kgo.RecordHeader, len(m.Headers))
		for i, h := range m.Headers {
			r.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
	}
	return r
}

// messageOf is a fetched record as kafka-go's message, hwm its partition's
// high watermark.
func messageOf(rec *kgo.Record, hwm int64) kafka.Message {
	m := kafka.Message{
		Topic: rec.Topic, Partition: int(rec.Partition), Offset: rec.Offset, HighWaterMark: hwm,
		Key: rec.Key, Value: rec.Value, Time: rec.Timestamp,
	}
	if len(rec.Headers) > 0 {
		m.Headers = make([]kafka.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			m.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}

// kafkaError turns a Kafka error code of franz-go into kafka-go's
// kafka.Error of the same code, the type consumer.MessageWriter's errors
// are classified by; other errors are returned as they are.
func kafkaError(err error) error {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return fmt.Errorf("%w (franz-go: %v)", kafka.Error(ke.Code), err)
	}
	return err
}

// kgoLogger hands franz-go's log lines to slog: its errors and warnings at
// Warn, the rest at Debug; franz-go's own debug level is never asked for.
type kgoLogger struct{ log *slog.Logger }

func (l kgoLogger) Level() kgo.LogLevel {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelDebug
	if level <= kgo.LogLevelWarn {
		lv = slog.LevelWarn
	}
	l.log.Log(context.Background(), lv, "franz-go: "+strings.TrimSpace(msg), keyvals...)
}
