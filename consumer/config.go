package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
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
// and counts one of its Config.MaxAttempts: the consumer owns every retry,
// so marking an error with inbox.Retryable changes nothing here. An error
// marked with inbox.Permanent (also inside further wrapping) sends msg to
// Config.OnFailure at once, with reason ReasonPermanent.
type Handler func(ctx context.Context, tx *gorm.DB, msg Message) error

// BatchHandler applies the effect of msgs, all seen for the first time and
// of one partition, in offset order, inside tx, in one call. Like a Handler
// it writes through tx only and must not commit or roll back tx. Several
// messages of a batch can change one row: combine their changes per row
// before one set-based statement, which would change a row it lists twice
// only once (inbox.BatchHandler says why, per database). A failed batch is
// split until the failing messages run alone; an error marked
// inbox.Permanent then sends such a message to Config.OnFailure at once.
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
	// DeadLetter publishes the message to Config.DeadLetterTopic, with its
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

// Config configures a [Consumer]. Brokers (unless Transport is set),
// GroupID, Topics, Handler and either Inbox with Consumer or
// NaturallyIdempotent with DB are required.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port) of the default
	// kafka-go client; unused when Transport is set.
	Brokers []string
	// GroupID is the Kafka consumer group.
	GroupID string
	// Topics are consumed by the group; each may be listed once.
	Topics []string

	// Inbox deduplicates messages. Required unless NaturallyIdempotent.
	Inbox *inbox.Inbox
	// Consumer is the inbox consumer name: it names the effect Handler
	// applies, and with the event id forms the inbox key. Keep it when the
	// group changes (a replay under a new GroupID must find the rows of the
	// old one). Required with Inbox.
	Consumer string
	// Handler applies each message. Required, unless BatchHandler is set.
	Handler Handler
	// BatchHandler, instead of Handler, applies all the new messages of a
	// batch in one call (through inbox.ProcessBatchFunc), so that the effect
	// can be one set-based statement: up to BatchSize messages of one
	// partition, duplicates left out, in offset order. When it fails, the
	// batch is split until the failing message is alone; that message's
	// attempts then count as with Handler. HandlerTimeout bounds one call.
	// With NaturallyIdempotent, a batch runs in one transaction without
	// inbox rows; if it fails for a message, its messages are run one by
	// one.
	BatchHandler BatchHandler
	// NaturallyIdempotent declares that Handler's effect is the same however
	// often it runs (an upsert, a set-to-state, a version check): no inbox
	// row is written and Inbox may be nil. Messages are then processed one by
	// one, each in its own transaction on DB, and a message without event id
	// is processed all the same (Message.EventID is then empty). Never set it
	// for increments.
	NaturallyIdempotent bool
	// DB is the database the transactions run on. Default Inbox.DB().
	DB *gorm.DB
	// Classifier decides which database errors are transient (a deadlock,
	// a lost connection): those are retried without counting an attempt
	// (see inbox.IsDatabaseFailure). Pass the adapter's Store. Default
	// Inbox.Store(); required with NaturallyIdempotent when Inbox is nil.
	Classifier interface{ IsRetryable(err error) bool }

	// Extract finds the event id and time of a message. Default
	// HeaderExtractor(nil, nil): event_id/event_time, then ce_id/ce_time.
	Extract Extractor

	// BatchSize is the most messages of one partition processed in one
	// transaction (through inbox.ProcessBatch). Default 1, which keeps a
	// partition's order also for a message whose handler failed and is
	// retried; above 1 such a message is retried after the rest of its
	// batch committed (see "Batches" in the package doc). With a
	// per-message Handler, 100 runs several times faster than 1 (one
	// transaction and one claim per batch; docs/BENCHMARKS.md). With
	// NaturallyIdempotent it applies to BatchHandler only.
	BatchSize int
	// BatchWait is the longest a batch waits to fill up once its first
	// message is there; it goes at once (after a millisecond's grace) when
	// its last message was the partition's last as the broker last said,
	// so a batch waits only for messages already in the partition. Default
	// 50ms; ignored when BatchSize is 1.
	BatchWait time.Duration

	// MaxAttempts bounds how often a failing message is tried before
	// OnFailure applies, counting the first try. Default 5. Invalid
	// messages, expired ones (inbox.ErrExpired) and messages without id or
	// time are not retried. A database that cannot commit at all is not a
	// failing message: the whole batch is retried without limit.
	MaxAttempts int
	// HandlerTimeout, if positive, bounds one call of Handler. Its context
	// and transaction handle carry the deadline, so the handler's statements
	// are cancelled when it passes; a handler still running or returning
	// after it fails with an error wrapping ErrHandlerTimeout, its writes are
	// rolled back, and the message counts an attempt (then OnFailure). Go
	// code that ignores its context cannot be interrupted: the partition
	// waits for it to return. Zero means no limit.
	//
	// One case is the database's, not the message's: the deadline cut short
	// a statement the handler sent through tx, and a ping of the database on
	// another connection gets no answer either (within 5 s, or
	// DatabaseTimeout if shorter). The handler was then waiting on a
	// database that does not answer (a link that drops every packet): the
	// batch is retried as a database failure, without counting an attempt,
	// and logged at Warn. A handler cannot make that ping fail: it carries
	// no SQL of the handler's, waits on none of its locks, and a slow query
	// of the handler's has been cancelled by then; only a server (or the way
	// to it) that does not answer, or a pool with no connection to give,
	// fails it, and then no transaction of the consumer could run either.
	// A handler that times out in its own code, or on anything but tx,
	// counts an attempt as always.
	HandlerTimeout time.Duration
	// DatabaseTimeout bounds each of the consumer's own steps on the
	// database: BEGIN (with taking or opening a connection), the inbox's
	// claim, the stored offset's write and read, COMMIT and ROLLBACK. A
	// step past it is a database failure: rolled back and retried without
	// limit and without counting an attempt, as a lost connection is (see
	// inbox.IsDatabaseFailure). A COMMIT given up this way has an unknown
	// outcome: it may still commit once the database gets it. The retry then
	// finds the message's inbox row and skips it as a duplicate, so each
	// effect still commits once (a naturally idempotent handler runs again,
	// which its effect allows). The handler's own statements are bounded
	// by HandlerTimeout, not by this.
	//
	// Without a bound, a database link that drops every packet (no RST)
	// holds the statement, and the partition, until the kernel gives up on
	// the connection, about 15 minutes later. Drivers bound little of it
	// themselves: see the package documentation ("Database timeouts") for
	// the DSN settings to add. Choose it above the longest the inbox's own
	// statements may wait for a lock: during a rebalance a claim waits for
	// the previous owner's transaction on the same message. Default 30s;
	// negative means no bound.
	DatabaseTimeout time.Duration
	// MaxProcessingStall bounds how long a partition may wait for the
	// database to answer its work: from the start of a batch (its handlers
	// included) until the batch commits or fails for a reason of a
	// message's own, with every retry of a database failure in between,
	// and the same for reading and writing the stored offset. A member with a
	// partition stalled longer leaves the group, so that the other members
	// take over its partitions, as Kafka's max.poll.interval.ms makes a
	// consumer that stops polling do; the work in flight is cancelled and
	// rolled back (redelivered to the new owner, where the inbox absorbs
	// what had committed). It rejoins as soon as a ping of its database
	// succeeds. Its partitions move to the other members within
	// MaxProcessingStall plus SessionTimeout plus the group's rebalance.
	// Without it, a member whose database link freezes keeps heartbeating
	// and keeps its partitions for as long as the freeze lasts.
	//
	// It must exceed DatabaseTimeout and HandlerTimeout, and should exceed
	// the longest a batch may take (BatchSize × HandlerTimeout): a member
	// leaves the group over a slow batch too. Default the larger of 2
	// minutes and 2 × DatabaseTimeout + BatchSize × HandlerTimeout;
	// negative turns it off.
	MaxProcessingStall time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts and between reconnection tries. Defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// OnFailure is the policy for a message that cannot be processed.
	// Default StopPartition.
	OnFailure Policy
	// DeadLetterTopic receives dead letters. Required with DeadLetter.
	DeadLetterTopic string
	// DeadLetterWriter publishes dead letters; each one names
	// DeadLetterTopic, so a *kafka.Writer given here must leave its Topic
	// empty (New rejects it otherwise) and should accept messages as large
	// as the source topics hold (its BatchBytes). Default the Transport's
	// dead-letter writer (kafka-go's: a *kafka.Writer on Brokers), requiring
	// all in-sync replicas, accepting messages of up to 11 MiB (the 10 MiB
	// the partition readers accept plus room for the dead-letter headers);
	// Run closes it and its connections when it returns.
	DeadLetterWriter MessageWriter

	// StoreOffsets writes each partition's next offset into OffsetsTable
	// in the same transaction as the effect, and starts each assigned
	// partition at that stored offset whenever the database has one, ahead
	// of the group's committed offset or behind it: a crash between the
	// database commit and the Kafka commit redelivers nothing, and a
	// database failover that lost commits applies them again, exactly once.
	// The Inbox's Store (with NaturallyIdempotent and no Inbox, the
	// Classifier) must implement storage.OffsetStore. Call Migrate first.
	// The package doc, "Offsets in the database", says how it works:
	// zombies fenced by generation, frozen transactions, the checks against
	// the partition's log, how to reset a group.
	StoreOffsets bool
	// OffsetsTable is the table of stored offsets. Default "inbox_offsets".
	OffsetsTable string

	// SequencedSources turns sequenced dedup on for the messages of these
	// outbox sources (their header.SeqSource ids: inboxctl outbox source
	// prints a table's, and in code the producer's outbox store tells it,
	// storage.Sequenced's Source) whose shards are aligned with the topic's
	// partitions (outbox.Config.AlignedTopic): instead of an inbox row per
	// event, the consumer keeps per stream (source, epoch, topic,
	// partition) the highest sequence number it applied, and a message at
	// or below it is a duplicate (see the package doc, "Sequenced dedup").
	// List only sources published by this library's relay: the numbers are
	// trusted. The Inbox's Store must implement storage.WatermarkStore.
	// Messages of other sources, of a listed source that is not aligned
	// (logged once per source at Warn), and without sequence headers take
	// the inbox row as before, in the same batches; sequence headers of a
	// well-formed source id that is not listed are logged once per source
	// at Info.
	SequencedSources []string
	// SequencedRowsUntil is for a stream switched from inbox rows to
	// sequenced dedup: until then, a sequenced message also claims its
	// inbox row, so that a copy of a message first applied through a row
	// is not applied again. Set it to the time of the switch plus the
	// inbox's RetentionDays; leave it zero for sources this consumer never
	// took through rows.
	SequencedRowsUntil time.Time
	// AcceptSequenceGaps makes a gap in an aligned sequenced stream (a
	// message lost or reordered upstream; see package outbox, "Aligned
	// shards") an ERROR log instead of a stopped partition. A missing
	// message that arrives after the gap was accepted is then taken for a
	// duplicate and skipped.
	AcceptSequenceGaps bool

	// CommitInterval is how often processed offsets are committed to Kafka.
	// Default 1s; a negative value commits after every batch. Offsets are
	// also committed when a partition is revoked and when Run ends.
	CommitInterval time.Duration
	// StartOffset is where a partition without a committed (or stored)
	// offset starts: kafka.FirstOffset (the default), its log start, or
	// kafka.LastOffset, its log end. The offset it resolves to is committed
	// to the group at once, so that a restart begins there even if nothing
	// was consumed: with LastOffset, messages produced while the consumer
	// was down are then processed, not skipped.
	StartOffset int64
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are passed to
	// the Kafka client's group (transport.GroupConfig); zero keeps the
	// client's defaults.
	SessionTimeout, HeartbeatInterval, RebalanceTimeout time.Duration
	// MaxWait is the longest a fetch waits for new data. Default 500ms; it
	// also bounds how long a revoked partition takes to let go.
	MaxWait time.Duration
	// Dialer connects the default kafka-go client to the brokers; unused
	// when Transport is set. Default kafka.DefaultDialer.
	Dialer *kafka.Dialer
	// Transport is the Kafka client the consumer runs on (see package
	// transport). Nil means kafka-go (github.com/segmentio/kafka-go, eager
	// rebalancing) over Brokers and Dialer. franzgo.New of the module
	// github.com/inboxgo/inbox/transport/franzgo gives franz-go's, with
	// cooperative-sticky rebalancing. A Client serves one Consumer; Run
	// closes it when it returns (Close, if Run never ran).
	Transport transport.Client

	// MaintenanceInterval is how often Run runs the inbox's maintenance
	// (inbox.Inbox.Maintain: prepare the coming days' partitions, expire
	// the days past the retention window): at start and then every
	// interval, logging a failure at Error and reporting every run as an
	// EventMaintenance. Default an hour, so that a missed run costs
	// nothing (partitions are prepared days ahead); negative turns it off (run Maintain yourself then, for example with inboxctl). Several
	// consumers running it on one inbox is safe (the Store serialises it),
	// only redundant. Without Inbox nothing is maintained.
	MaintenanceInterval time.Duration

	// Logger receives the consumer's logs. Default slog.Default(). The
	// values a message brings (its event id, its key) are logged shortened
	// to 64 bytes, as error texts show them.
	Logger *slog.Logger
	// Hooks receive the consumer's events (hooks.EventHook: outcomes once
	// they are decided, retries, dead letters, commits, lag, assignments,
	// maintenance) and give each message the context it is processed under
	// ([ContextHook]). Give the same hooks to the inbox's Config: it then
	// traces each message's claim and handler, and leaves reporting the
	// outcomes to the consumer (see package hooks). Hooks stack: each is
	// called, in order.
	Hooks []hooks.Hook
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
	if len(c.Brokers) == 0 && c.Transport == nil {
		bad("no brokers")
	}
	if c.GroupID == "" {
		bad("no group id")
	}
	if len(c.Topics) == 0 {
		bad("no topics")
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
		if t == c.DeadLetterTopic {
			bad("topic %q is also the dead-letter topic", t)
		}
	}
	if empty {
		bad("empty topic name in Topics")
	}
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		bad("no handler")
	case c.Handler != nil && c.BatchHandler != nil:
		bad("both Handler and BatchHandler are set; give one")
	}
	if c.NaturallyIdempotent {
		if c.DB == nil && c.Inbox == nil {
			bad("a naturally idempotent consumer needs DB (or Inbox)")
		}
		if c.Classifier == nil && c.Inbox == nil {
			bad("a naturally idempotent consumer without Inbox needs Classifier (the adapter's Store) to tell a failing database from a failing message")
		}
	} else {
		if c.Inbox == nil {
			bad("no inbox (set NaturallyIdempotent only for handlers whose effect is idempotent)")
		}
		if err := (inbox.Message{Consumer: c.Consumer, ID: "x", Time: time.Unix(0, 0)}).Validate(); err != nil {
			bad("consumer name: %w", err)
		}
	}
	if c.BatchSize < 0 || c.BatchWait < 0 || c.MaxAttempts < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 || c.MaxWait < 0 || c.HandlerTimeout < 0 {
		bad("negative size, count or duration")
	}
	if c.MaxProcessingStall > 0 {
		dbTimeout := c.DatabaseTimeout
		if dbTimeout == 0 {
			dbTimeout = defaultDatabaseTimeout
		}
		if c.MaxProcessingStall <= dbTimeout || c.MaxProcessingStall <= c.HandlerTimeout {
			// A single slow statement or handler call would make the member
			// leave the group.
			bad("MaxProcessingStall (%v) must exceed DatabaseTimeout (%v) and HandlerTimeout (%v)", c.MaxProcessingStall, dbTimeout, c.HandlerTimeout)
		}
	}
	switch c.OnFailure {
	case StopPartition:
	case DeadLetter:
		if c.DeadLetterTopic == "" {
			bad("the dead-letter policy needs DeadLetterTopic")
		}
	default:
		bad("unknown failure policy %d", int(c.OnFailure))
	}
	if w, ok := c.DeadLetterWriter.(*kafka.Writer); ok && w != nil && w.Topic != "" {
		// Every dead letter names DeadLetterTopic, and a Writer with a Topic
		// of its own rejects every message that names one: each write would
		// fail.
		bad("DeadLetterWriter is a *kafka.Writer with Topic %q set; leave its Topic empty (dead letters name DeadLetterTopic)", w.Topic)
	}
	if c.StartOffset != 0 && c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset {
		bad("StartOffset must be kafka.FirstOffset or kafka.LastOffset, not %d", c.StartOffset)
	}
	if c.OffsetsTable != "" {
		if err := storage.ValidateIdentifier("offsets table", c.OffsetsTable); err != nil {
			errs = append(errs, err)
		}
	}
	for _, src := range c.SequencedSources {
		if err := storage.ValidSource(src); err != nil {
			bad("SequencedSources: %w", err)
		}
	}
	if len(c.SequencedSources) > 0 {
		if c.NaturallyIdempotent {
			bad("SequencedSources needs the inbox: a naturally idempotent consumer deduplicates nothing")
		} else if c.Inbox != nil {
			if _, ok := c.Inbox.Store().(storage.WatermarkStore); !ok {
				bad("SequencedSources needs an inbox store that implements storage.WatermarkStore (%T does not)", c.Inbox.Store())
			}
		}
	}
	if c.StoreOffsets && c.offsetStore() == nil {
		switch {
		case c.Inbox != nil:
			bad("StoreOffsets needs an inbox store that implements storage.OffsetStore (%T does not)", c.Inbox.Store())
		case c.Classifier != nil:
			bad("StoreOffsets needs an inbox store that implements storage.OffsetStore: without Inbox, the Classifier (the adapter's Store; %T does not)", c.Classifier)
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

func (c *Config) setDefaults() {
	if c.Inbox != nil {
		c.DB = cmp.Or(c.DB, c.Inbox.DB())
		if c.Classifier == nil {
			c.Classifier = c.Inbox.Store()
		}
	}
	if c.Extract == nil {
		c.Extract = HeaderExtractor(nil, nil)
	}
	c.BatchSize = cmp.Or(c.BatchSize, defaultBatchSize)
	c.BatchWait = cmp.Or(c.BatchWait, defaultBatchWait)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, defaultMaxAttempts)
	c.MinBackoff = cmp.Or(c.MinBackoff, defaultMinBackoff)
	c.MaxBackoff = max(cmp.Or(c.MaxBackoff, defaultMaxBackoff), c.MinBackoff)
	c.OffsetsTable = cmp.Or(c.OffsetsTable, DefaultOffsetsTable)
	c.CommitInterval = cmp.Or(c.CommitInterval, defaultCommitInterval)
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.MaxWait = cmp.Or(c.MaxWait, defaultMaxWait)
	c.MaintenanceInterval = cmp.Or(c.MaintenanceInterval, defaultMaintenanceInterval)
	c.DatabaseTimeout = cmp.Or(c.DatabaseTimeout, defaultDatabaseTimeout)
	if c.MaxProcessingStall == 0 {
		c.MaxProcessingStall = max(defaultMaxProcessingStall,
			2*max(c.DatabaseTimeout, 0)+time.Duration(c.BatchSize)*c.HandlerTimeout)
	}
	c.Dialer = cmp.Or(c.Dialer, kafka.DefaultDialer)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}
