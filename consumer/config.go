package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport"
)

// Message is one Kafka message with the event id and time the consumer
// found in it (see [Extractor]).
type Message struct {
	kafka.Message
	EventID   string
	EventTime time.Time
}

// Handler applies the business effect of msg inside tx. With an inbox, tx
// also holds msg's inbox row and the handler runs only for a message seen
// for the first time; with Config.NaturallyIdempotent it runs for every
// delivery. Every write that must be atomic with the inbox row (and the
// stored offset) has to go through tx; the handler must not commit or roll
// back tx. Returning an error (or panicking) rolls back everything of msg
// and counts one of its Config.Failure.MaxAttempts: the consumer owns every retry,
// so marking an error with inbox.Retryable changes nothing here. An error
// marked with inbox.Permanent (also inside further wrapping) sends msg to
// Config.Failure.Policy at once, with reason ReasonPermanent.
type Handler func(ctx context.Context, tx *gorm.DB, msg Message) error

// BatchHandler applies the effect of msgs, all seen for the first time and
// of one partition, in offset order, inside tx, in one call. Like a Handler
// it writes through tx only and must not commit or roll back tx. Several
// messages of a batch can change one row: combine their changes per row
// before one set-based statement, which would change a row it lists twice
// only once (inbox.BatchHandler says why, per database). A failed batch is
// split until the failing messages run alone; an error marked
// inbox.Permanent then sends such a message to Config.Failure.Policy at once.
type BatchHandler func(ctx context.Context, tx *gorm.DB, msgs []Message) error

// Policy is what happens to a message that cannot be processed: its
// retries are used up, its handler failed with an error marked
// inbox.Permanent, its id or time is missing, it is invalid, or it is
// older than the inbox's retention window.
type Policy int

const (
	// StopPartition halts the message's partition at it: the partition's
	// worker stops fetching, commits the offsets before the message and
	// nothing after it, logs an error, reports [EventPartitionStopped] and
	// holds the partition until it is revoked (with kafka-go at the next
	// rebalance; with a cooperative client at one that moves it) or Run
	// ends; when it is assigned again the message is tried again. Other
	// partitions go on. The default.
	StopPartition Policy = iota
	// DeadLetter publishes the message to Config.Failure.DeadLetterTopic, with its
	// key, value and headers and headers saying why (see DLQ header
	// constants), and then moves on. Its sequence headers are renamed
	// (header.DLQSequencePrefix), so a copy of the dead letter put back on
	// the topic as it is is deduplicated by its inbox row and applied once. The offset passes the message only
	// after Kafka acknowledged the dead letter; the message is never
	// dropped. Transient producer errors (no leader, timeouts, an
	// unreachable broker) are retried until publishing succeeds or the
	// partition is revoked (logged at Warn, at Error from the 5th attempt).
	// Errors retrying cannot cure (the dead letter is too large, the topic
	// is invalid, not authorized, a misconfigured or closed writer; the
	// dead-letter topic unknown on 10 attempts in a row) stop the partition
	// at the message as StopPartition does, with Reason
	// ReasonDeadLetterFailed and the producer's error (and the message's
	// failure) as the cause.
	DeadLetter
)

func (p Policy) String() string {
	switch p {
	case StopPartition:
		return "stop-partition"
	case DeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// MessageWriter publishes messages; *kafka.Writer implements it. Under the
// DeadLetter policy an error of WriteMessages that is (or wraps, also inside
// kafka.WriteErrors) one of kafka-go's permanent errors, such as
// kafka.MessageSizeTooLarge, kafka.InvalidTopic, kafka.TopicAuthorizationFailed
// or io.ErrClosedPipe, stops the partition at the message; any other error
// is retried.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Config configures a [Consumer]. GroupID, Topics, Handler (or
// BatchHandler), Brokers (unless Kafka.Transport is set), and either Inbox
// with Consumer or NaturallyIdempotent with DB are required. The rest is
// grouped (Kafka, Failure, Timeouts, Offsets, Sequenced); a field left zero
// takes the default its comment gives. The package documentation explains
// the settings' reasons and interplay.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port) of the default
	// kafka-go client. Required unless Kafka.Transport is set, which
	// ignores them.
	Brokers []string
	// GroupID is the Kafka consumer group.
	GroupID string
	// Topics are consumed by the group; each may be listed once.
	Topics []string

	// Inbox deduplicates messages. Required unless NaturallyIdempotent.
	Inbox *inbox.Inbox
	// Consumer is the inbox consumer name: with the event id it forms the
	// inbox key, so keep it when GroupID changes (see "Event ids").
	// Required with Inbox.
	Consumer string
	// Handler applies each message. Required unless BatchHandler is set.
	Handler Handler
	// BatchHandler, instead of Handler, applies the new messages of a batch
	// (up to BatchSize of one partition, in offset order) in one call, for
	// a set-based effect (see "Batches").
	BatchHandler BatchHandler

	// NaturallyIdempotent declares that the handler's effect is the same
	// however often it runs: no inbox row is written, Inbox may be nil, and
	// DB and Classifier take its place (see "Naturally idempotent handlers").
	NaturallyIdempotent bool
	// DB is the database the transactions run on. Default Inbox.DB().
	DB *gorm.DB
	// Classifier tells a failing database (retried without counting an
	// attempt) from a failing message: pass the adapter's Store. Default
	// Inbox.Store(); required with NaturallyIdempotent when Inbox is nil.
	Classifier interface{ IsRetryable(err error) bool }

	// Extract finds the event id and time of a message. Default
	// HeaderExtractor(nil, nil): event_id/event_time, then ce_id/ce_time.
	Extract Extractor
	// BatchSize is the most messages of one partition processed in one
	// transaction. Default 1; see "Batches" for what more changes. With
	// NaturallyIdempotent it applies to BatchHandler only.
	BatchSize int
	// BatchWait is the longest a batch waits to fill up once its first
	// message is there; a batch that reached the partition's end goes at
	// once. Default 50ms; ignored when BatchSize is 1.
	BatchWait time.Duration
	// MaintenanceInterval is how often Run runs the inbox's Maintain: at
	// start, then every interval (see "Maintenance"). Default an hour;
	// negative turns it off. Without Inbox nothing is maintained.
	MaintenanceInterval time.Duration

	// Logger receives the consumer's logs. Default the Inbox's
	// (inbox.Config.Logger), else slog.Default().
	Logger *slog.Logger
	// Hooks receive the consumer's events and give each message its context
	// ([ContextHook]); they are called in order. Nil takes the Inbox's
	// (inbox.Config.Hooks), so hooks are given once (see "Observability").
	Hooks []hooks.Hook

	// Kafka configures the Kafka client.
	Kafka KafkaConfig
	// Failure is what happens to a message that fails: its retries, then
	// its policy.
	Failure FailureConfig
	// Timeouts bound the handler and the database.
	Timeouts TimeoutsConfig
	// Offsets stores each partition's offset in the database.
	Offsets OffsetsConfig
	// Sequenced deduplicates the messages of this library's outbox relays
	// by a per-stream watermark instead of inbox rows.
	Sequenced SequencedConfig
}

// KafkaConfig is the Kafka client of a [Config]: which one, and its
// settings.
type KafkaConfig struct {
	// Transport is the Kafka client the consumer runs on (see package
	// transport, and "Transport"). Nil means kafka-go over Brokers and
	// Dialer. A Client serves one Consumer, and Run (or Close) closes it.
	Transport transport.Client
	// Dialer connects the default kafka-go client to Brokers; unused with
	// Transport. Default kafka.DefaultDialer.
	Dialer *kafka.Dialer
	// StartOffset is where a partition without a committed or stored offset
	// starts: kafka.FirstOffset (the default) or kafka.LastOffset. The
	// offset it resolves to is committed at once (see "Start offsets").
	StartOffset int64
	// CommitInterval is how often processed offsets are committed to Kafka
	// (also when a partition is revoked and when Run ends). Default 1s;
	// negative commits after every batch.
	CommitInterval time.Duration
	// MaxWait is the longest a fetch waits for new data; it also bounds how
	// long a revoked partition takes to let go. Default 500ms.
	MaxWait time.Duration
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout go to the
	// client's group (transport.GroupConfig); zero keeps the client's
	// defaults.
	SessionTimeout, HeartbeatInterval, RebalanceTimeout time.Duration
}

// FailureConfig is what a [Config]'s consumer does with a failing message.
// It owns every retry of the consumer's messages: the MaxAttempts,
// MinBackoff and MaxBackoff of the inbox.Config of the Inbox it drives do
// not apply to them (see "What is retried, and how often").
type FailureConfig struct {
	// MaxAttempts bounds how often a failing message is tried, the first
	// try included, before Policy applies. Default 5. A failing database
	// counts no attempt and is retried without limit.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts, between retries of a failing database, and between
	// reconnection tries. Defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// Policy is what happens to a message that cannot be processed.
	// Default StopPartition.
	Policy Policy
	// DeadLetterTopic receives dead letters. Required with DeadLetter; it
	// must not be one of Topics.
	DeadLetterTopic string
	// DeadLetterWriter publishes dead letters. Default the Transport's (see
	// "Dead letters"), which Run closes when it returns. A *kafka.Writer
	// given here must leave its Topic empty.
	DeadLetterWriter MessageWriter
}

// TimeoutsConfig bounds how long a [Config]'s consumer waits for its
// handler and its database (see "Database timeouts").
type TimeoutsConfig struct {
	// Handler, if positive, bounds one call of Handler or BatchHandler:
	// its context and tx carry the deadline, and a call past it fails with
	// ErrHandlerTimeout and counts an attempt. Zero means no limit.
	Handler time.Duration
	// Database bounds each of the consumer's own steps on the database
	// (BEGIN, the claim, the stored offset, COMMIT, ROLLBACK): past it, the
	// step is a database failure. Default 30s; negative means no bound.
	Database time.Duration
	// ProcessingStall bounds how long a partition may wait for the database;
	// a member stalled longer leaves the group until its database answers.
	// It must exceed Database and Handler. Default the larger of 2 minutes
	// and 2 × Database + BatchSize × Handler; negative turns it off.
	ProcessingStall time.Duration
}

// OffsetsConfig stores each partition's offset in the database, with the
// effects (see "Offsets in the database").
type OffsetsConfig struct {
	// Store writes each partition's next offset in the transaction of its
	// effect, and starts each assigned partition at the stored offset. The
	// inbox's Store (without Inbox, the Classifier) must implement
	// storage.OffsetStore; call Consumer.Migrate first.
	Store bool
	// Table is the table of stored offsets. Default DefaultOffsetsTable.
	Table string
}

// SequencedConfig turns sequenced dedup on (see "Sequenced dedup"): a
// per-stream watermark instead of an inbox row per event.
type SequencedConfig struct {
	// Sources are the outbox sources (header.SeqSource ids; inboxctl outbox
	// source prints a table's) whose aligned messages are deduplicated by
	// watermark. List only sources published by this library's relay. The
	// inbox's Store must implement storage.WatermarkStore.
	Sources []string
	// RowsUntil is for a stream switched from inbox rows: until then a
	// sequenced message also claims its inbox row. Set it to the switch plus
	// the inbox's RetentionDays; zero for sources never taken through rows.
	RowsUntil time.Time
	// AcceptGaps makes a gap in a sequenced stream an ERROR log instead of
	// a stopped partition; a missing message arriving later is then
	// skipped as a duplicate.
	AcceptGaps bool
}

var errInvalidConfig = inbox.ErrInvalidConfig

// The defaults of the Config fields of the same names, used where a field is
// left zero; each field's comment states its own.
const (
	defaultMaintenanceInterval = time.Hour
	defaultBatchSize           = 1
	defaultBatchWait           = 50 * time.Millisecond
	defaultMaxAttempts         = 5
	defaultMinBackoff          = 100 * time.Millisecond
	defaultMaxBackoff          = 10 * time.Second
	defaultCommitInterval      = time.Second
	defaultMaxWait             = 500 * time.Millisecond
	defaultDatabaseTimeout     = 30 * time.Second
	defaultMaxProcessingStall  = 2 * time.Minute
)

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	if len(c.Brokers) == 0 && c.Kafka.Transport == nil {
		bad("no Brokers (and no Kafka.Transport)")
	}
	if c.GroupID == "" {
		bad("no GroupID")
	}
	if len(c.Topics) == 0 {
		bad("no Topics")
	}
	seen := make(map[string]bool, len(c.Topics))
	empty := false
	for _, t := range c.Topics {
		if t == "" {
			empty = true
			continue
		}
		if seen[t] {
			// startGeneration would start two workers on each of its
			// partitions, processing and committing over each other.
			bad("topic %q listed twice in Topics", t)
		}
		seen[t] = true
		if t == c.Failure.DeadLetterTopic {
			bad("topic %q of Topics is also Failure.DeadLetterTopic", t)
		}
	}
	if empty {
		bad("empty topic name in Topics")
	}
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		bad("no Handler (or BatchHandler)")
	case c.Handler != nil && c.BatchHandler != nil:
		bad("both Handler and BatchHandler are set; give one")
	}
	if c.NaturallyIdempotent {
		if c.DB == nil && c.Inbox == nil {
			bad("NaturallyIdempotent needs DB (or Inbox)")
		}
		if c.Classifier == nil && c.Inbox == nil {
			bad("NaturallyIdempotent without Inbox needs Classifier (the adapter's Store) to tell a failing database from a failing message")
		}
	} else {
		if c.Inbox == nil {
			bad("no Inbox (set NaturallyIdempotent only for handlers whose effect is idempotent)")
		}
		if err := (inbox.Message{Consumer: c.Consumer, ID: "x", Time: time.Unix(0, 0)}).Validate(); err != nil {
			bad("Consumer: %w", err)
		}
	}
	for _, f := range []struct {
		name  string
		value int64
	}{
		{"BatchSize", int64(c.BatchSize)},
		{"BatchWait", int64(c.BatchWait)},
		{"Failure.MaxAttempts", int64(c.Failure.MaxAttempts)},
		{"Failure.MinBackoff", int64(c.Failure.MinBackoff)},
		{"Failure.MaxBackoff", int64(c.Failure.MaxBackoff)},
		{"Kafka.MaxWait", int64(c.Kafka.MaxWait)},
		{"Timeouts.Handler", int64(c.Timeouts.Handler)},
	} {
		if f.value < 0 {
			bad("negative %s", f.name)
		}
	}
	if c.Timeouts.ProcessingStall > 0 {
		dbTimeout := c.Timeouts.Database
		if dbTimeout == 0 {
			dbTimeout = defaultDatabaseTimeout
		}
		if c.Timeouts.ProcessingStall <= dbTimeout || c.Timeouts.ProcessingStall <= c.Timeouts.Handler {
			// A single slow statement or handler call would make the member
			// leave the group.
			bad("Timeouts.ProcessingStall (%v) must exceed Timeouts.Database (%v) and Timeouts.Handler (%v)", c.Timeouts.ProcessingStall, dbTimeout, c.Timeouts.Handler)
		}
	}
	switch c.Failure.Policy {
	case StopPartition:
	case DeadLetter:
		if c.Failure.DeadLetterTopic == "" {
			bad("Failure.Policy DeadLetter needs Failure.DeadLetterTopic")
		}
	default:
		bad("unknown Failure.Policy %d", int(c.Failure.Policy))
	}
	if w, ok := c.Failure.DeadLetterWriter.(*kafka.Writer); ok && w != nil && w.Topic != "" {
		// Every dead letter names its topic, and a Writer with a Topic
		// of its own rejects every message that names one: each write would
		// fail.
		bad("Failure.DeadLetterWriter is a *kafka.Writer with Topic %q set; leave its Topic empty (dead letters name Failure.DeadLetterTopic)", w.Topic)
	}
	if c.Kafka.StartOffset != 0 && c.Kafka.StartOffset != kafka.FirstOffset && c.Kafka.StartOffset != kafka.LastOffset {
		bad("Kafka.StartOffset must be kafka.FirstOffset or kafka.LastOffset, not %d", c.Kafka.StartOffset)
	}
	if c.Offsets.Table != "" {
		if err := storage.ValidateIdentifier("offsets table", c.Offsets.Table); err != nil {
			bad("Offsets.Table: %w", err)
		}
	}
	for _, src := range c.Sequenced.Sources {
		if err := storage.ValidSource(src); err != nil {
			bad("Sequenced.Sources: %w", err)
		}
	}
	if len(c.Sequenced.Sources) > 0 {
		if c.NaturallyIdempotent {
			bad("Sequenced.Sources needs the inbox: a NaturallyIdempotent consumer deduplicates nothing")
		} else if c.Inbox != nil {
			if _, ok := c.Inbox.Store().(storage.WatermarkStore); !ok {
				bad("Sequenced.Sources needs an inbox store that implements storage.WatermarkStore (%T does not)", c.Inbox.Store())
			}
		}
	}
	if c.Offsets.Store && c.offsetStore() == nil {
		switch {
		case c.Inbox != nil:
			bad("Offsets.Store needs an inbox store that implements storage.OffsetStore (%T does not)", c.Inbox.Store())
		case c.Classifier != nil:
			bad("Offsets.Store needs an inbox store that implements storage.OffsetStore: without Inbox, the Classifier (the adapter's Store; %T does not)", c.Classifier)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: consumer: %w", errInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// offsetStore is the store of the stored offsets: the inbox's Store, or
// without an inbox the Classifier (the adapter's Store); nil if it is no
// storage.OffsetStore.
func (c *Config) offsetStore() storage.OffsetStore {
	var s any = c.Classifier
	if c.Inbox != nil {
		s = c.Inbox.Store()
	}
	os, _ := s.(storage.OffsetStore)
	return os
}

// inboxShared tells the logger and hooks an inbox was given.
var inboxShared = batchopt.LookupShared[*inbox.Inbox]()

func (c *Config) setDefaults() {
	if c.Inbox != nil {
		c.DB = cmp.Or(c.DB, c.Inbox.DB())
		if c.Classifier == nil {
			c.Classifier = c.Inbox.Store()
		}
		// Under a consumer the inbox reports no outcome and the consumer
		// reports every event, so the hooks given once, to the inbox, see
		// each event once.
		shared := inboxShared(c.Inbox)
		c.Logger = cmp.Or(c.Logger, shared.Logger)
		if c.Hooks == nil {
			c.Hooks = slices.Clone(shared.Hooks)
		}
	}
	if c.Extract == nil {
		c.Extract = HeaderExtractor(nil, nil)
	}
	c.BatchSize = cmp.Or(c.BatchSize, defaultBatchSize)
	c.BatchWait = cmp.Or(c.BatchWait, defaultBatchWait)
	c.Failure.MaxAttempts = cmp.Or(c.Failure.MaxAttempts, defaultMaxAttempts)
	c.Failure.MinBackoff = cmp.Or(c.Failure.MinBackoff, defaultMinBackoff)
	c.Failure.MaxBackoff = max(cmp.Or(c.Failure.MaxBackoff, defaultMaxBackoff), c.Failure.MinBackoff)
	c.Offsets.Table = cmp.Or(c.Offsets.Table, DefaultOffsetsTable)
	c.Kafka.CommitInterval = cmp.Or(c.Kafka.CommitInterval, defaultCommitInterval)
	c.Kafka.StartOffset = cmp.Or(c.Kafka.StartOffset, kafka.FirstOffset)
	c.Kafka.MaxWait = cmp.Or(c.Kafka.MaxWait, defaultMaxWait)
	c.MaintenanceInterval = cmp.Or(c.MaintenanceInterval, defaultMaintenanceInterval)
	c.Timeouts.Database = cmp.Or(c.Timeouts.Database, defaultDatabaseTimeout)
	if c.Timeouts.ProcessingStall == 0 {
		c.Timeouts.ProcessingStall = max(defaultMaxProcessingStall,
			2*max(c.Timeouts.Database, 0)+time.Duration(c.BatchSize)*c.Timeouts.Handler)
	}
	c.Kafka.Dialer = cmp.Or(c.Kafka.Dialer, kafka.DefaultDialer)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}
