package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/hooklist"
	"github.com/inboxgo/inbox/internal/short"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/transport"
)

var (
	// ErrRunning is returned by Run while another Run of the same Consumer
	// is active, or after Close.
	ErrRunning = errors.New("consumer: Run called twice or after Close")
	// ErrHandlerTimeout is wrapped by the error of a handler call that did
	// not finish within Config.Timeouts.Handler.
	ErrHandlerTimeout = errors.New("consumer: handler timed out")
	// ErrOffsetBeyondLogEnd is wrapped by the error of a partition stopped
	// with ReasonOffsetBeyondLogEnd.
	ErrOffsetBeyondLogEnd = errors.New("consumer: start offset beyond the partition's log end")
	// errTopicRecreated is wrapped by the error of a partition stopped with
	// ReasonTopicRecreated; callers tell that stop by its Reason (the
	// exported API stays small).
	errTopicRecreated = errors.New("consumer: the message before the stored offset is not the one processed there (topic recreated)")
	// ErrPartitionStopped is wrapped by every *PartitionStoppedError.
	ErrPartitionStopped = errors.New("consumer: partition stopped")
	// errClosed is the cancellation cause used by Close.
	errClosed = errors.New("consumer: closed")
)

// PartitionStoppedError reports a partition halted at Offset, which was not
// processed: by the StopPartition policy at a message that cannot be
// processed, under DeadLetter at a message whose dead letter the producer
// refused for good (ReasonDeadLetterFailed), at a start offset past the
// partition's log end (ReasonOffsetBeyondLogEnd), or at a stored offset
// that the message before it shows to belong to a deleted topic
// (ReasonTopicRecreated; for these two EventID is empty and Attempts 0). Nothing at or after Offset is committed to Kafka (or stored
// in the offsets table). The partition stays halted until it is assigned
// again (after a rebalance that revoked it: with kafka-go every rebalance,
// with a cooperative client one that moved it; or the next Run), when it
// is tried again.
type PartitionStoppedError struct {
	Topic     string
	Partition int
	Offset    int64
	EventID   string // empty if none was found
	Reason    string // one of the Reason constants
	Attempts  int
	Err       error
}

func (e *PartitionStoppedError) Error() string {
	return fmt.Sprintf("consumer: partition %s/%d stopped at offset %d (%s after %d attempts): %v",
		e.Topic, e.Partition, e.Offset, e.Reason, e.Attempts, e.Err)
}

// Unwrap returns ErrPartitionStopped and the cause.
func (e *PartitionStoppedError) Unwrap() []error { return []error{ErrPartitionStopped, e.Err} }

type topicPartition struct {
	topic     string
	partition int
}

// Consumer consumes a Kafka consumer group through an inbox: each message's
// effect commits at most once per inbox consumer name, and the group's
// offsets advance only past messages whose effect committed (or that went
// to the dead-letter topic).
//
// One worker runs per assigned partition: messages of a partition are
// processed in order, partitions in parallel. See Config for the options and
// Run for the lifecycle.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	offsets offsetTable     // with Offsets.Store
	knobs   testhooks.Knobs // the tests' (see internal/testhooks), set by Run
	dlq     MessageWriter
	// client is the Kafka client (Config.Kafka.Transport, or kafka-go's): the
	// group, the partition readers, the log offset lookups and the default
	// dead-letter writer.
	client transport.Client

	hooks    *hooklist.List
	contexts []ContextHook

	mu      sync.Mutex
	state   int // 0 new, 1 running, 2 closed
	cancel  context.CancelCauseFunc
	done    chan struct{}
	stopped map[topicPartition]*PartitionStoppedError
	workers map[*worker]struct{} // the running partition workers, for the stall watchdog
	// holders is the latest worker started for each partition (see
	// startGeneration), until it returns.
	holders map[topicPartition]*worker

	watchers sync.WaitGroup // the stall watchdogs (Consumer.watch)

	// trusted holds Config.Sequenced.Sources, watermarks the inbox store
	// that keeps their watermarks (nil without any).
	trusted    map[string]bool
	watermarks storage.WatermarkStore
	// noted holds the sources sequenceOf has logged, once each, as
	// deduplicated by inbox rows.
	notedMu sync.Mutex
	noted   map[string]bool

	// quietDB is Config.DB for the consumer's own statements: they do not
	// go through the application's GORM logger (see txn.Quiet).
	quietDB *gorm.DB
}

// New checks cfg and returns a Consumer. It does not connect to anything.
// Before Run, every table the configuration uses must exist: the inbox
// table (inbox.Inbox.Migrate), and Consumer.Migrate's tables, the stored
// offsets with Offsets.Store and the watermarks with Sequenced.Sources (or
// all of them by inboxctl migrate); Run refuses to start without them
// (ErrNotMigrated). The topics must exist too (Run returns ErrUnknownTopic
// otherwise), and so must Failure.DeadLetterTopic: the consumer never creates a
// topic.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if cfg.DB != nil {
		if err := txn.TrackStatements(cfg.DB); err != nil {
			return nil, err
		}
	}
	hl, err := hooklist.New("consumer.Config.Hooks", cfg.Hooks)
	if err != nil {
		return nil, err
	}
	cfg.Topics = slices.Clone(cfg.Topics)
	var contexts []ContextHook
	for _, h := range cfg.Hooks {
		if ch, ok := h.(ContextHook); ok {
			contexts = append(contexts, ch)
		}
	}
	cfg.Brokers = slices.Clone(cfg.Brokers)
	c := &Consumer{
		cfg:      cfg,
		log:      short.Logger(cfg.Logger).With("component", "inbox-consumer", "group", cfg.GroupID),
		offsets:  offsetTable{store: cfg.offsetStore(), table: cfg.Offsets.Table, group: cfg.GroupID},
		dlq:      cfg.Failure.DeadLetterWriter,
		stopped:  make(map[topicPartition]*PartitionStoppedError),
		workers:  make(map[*worker]struct{}),
		holders:  make(map[topicPartition]*worker),
		done:     make(chan struct{}),
		hooks:    hl,
		contexts: contexts,
		quietDB:  txn.Quiet(cfg.DB),
	}
	if len(cfg.Sequenced.Sources) > 0 {
		c.trusted = make(map[string]bool, len(cfg.Sequenced.Sources))
		for _, src := range cfg.Sequenced.Sources {
			c.trusted[src] = true
		}
		c.watermarks, _ = cfg.Inbox.Store().(storage.WatermarkStore)
	}
	c.client = cfg.Kafka.Transport
	if c.client == nil {
		c.client = newKafkaGo(c.cfg.Brokers, c.cfg.Kafka.Dialer, c.log)
	}
	if cfg.Failure.Policy == DeadLetter && c.dlq == nil {
		c.dlq = c.client.DeadLetterWriter()
	}
	return c, nil
}

// Migrate creates the offsets table when Config.Offsets.Store is set
// (storage.OffsetStore's MigrateOffsets), and the watermark table when
// Config.Sequenced.Sources is (storage.WatermarkStore's MigrateWatermarks),
// and does nothing otherwise. It is idempotent, and safe when several
// processes run it at the same time. On MySQL/MariaDB the offsets table is
// created as InnoDB whatever the server's default engine, and Migrate fails
// if an existing offsets table is on an engine without transactions (a
// stored offset must roll back with its effect). (The inbox's own table is
// created by inbox.Inbox.Migrate.)
func (c *Consumer) Migrate(ctx context.Context) error {
	if c.cfg.Offsets.Store {
		if err := c.offsets.store.MigrateOffsets(ctx, c.db(), c.offsets.table); err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
	}
	if c.watermarks != nil {
		if err := c.watermarks.MigrateWatermarks(ctx, c.db().WithContext(ctx)); err != nil {
			return fmt.Errorf("consumer: migrate the watermarks: %w", err)
		}
	}
	return nil
}

// Run checks the setup, joins the group and consumes until ctx ends or
// Close is called; it then stops every partition worker (a transaction in
// flight is rolled back, a message in retry is abandoned: both are
// redelivered later), commits the offsets of what was done, leaves the
// group and returns.
//
// Everything transient is retried with backoff and logged, never a reason to
// return: an unreachable broker, failed joins, "Rebalance In Progress",
// errors from the group, a database that cannot commit. On a rebalance the
// workers of the partitions revoked from this member stop and commit
// before the revocation completes (with kafka-go's eager rebalancing every
// partition is revoked; with a cooperative client such as franz-go's only
// those that move, and the workers of the partitions this member keeps go
// on undisturbed), and a worker commits only for the partition it was
// started for.
//
// Before joining, Run checks that every topic of Config.Topics exists, and
// the Failure.DeadLetterTopic when the consumer's own writer publishes dead letters
// (the consumer never creates one: create them, with their partition
// counts, before Run) and that each table the configuration needs takes the
// consumer's statements: the inbox table (a claim, rolled back), the
// offsets table with Offsets.Store, the watermark table with
// Sequenced.Sources. It waits while the brokers or the database do not
// answer, and returns at once an error wrapping [ErrUnknownTopic], naming
// the topics, or [ErrNotMigrated], naming the Migrate call to run. (The
// server's durability settings are inboxctl check's to report.)
//
// Run returns ctx's error when ctx ended (nil after Close), joined with a
// *PartitionStoppedError for each partition still stopped; an error wrapping
// ErrUnknownTopic or ErrNotMigrated (see above); an error wrapping
// inbox.ErrInvalidConfig if the Kafka client (Config.Kafka.Transport) or the
// group coordinator rejects the configuration (an invalid session timeout
// or group id, failed authentication or authorization: retrying cannot
// cure these); ErrRunning if called twice. A Consumer runs once.
func (c *Consumer) Run(ctx context.Context) (err error) {
	c.mu.Lock()
	if c.state != 0 {
		c.mu.Unlock()
		return ErrRunning
	}
	c.state = 1
	c.knobs = testhooks.From(ctx)
	runCtx, cancel := context.WithCancelCause(ctx)
	c.cancel = cancel
	c.mu.Unlock()
	defer close(c.done)
	defer cancel(nil)
	// Flushes and closes the default dead-letter writer, then the client's
	// own connections.
	defer c.client.Close()

	// Before the group: a client may join it at once, and a member must not
	// hold partitions while it waits for its database. If runCtx ends
	// during the checks, the loop below ends at once.
	if err := c.checkTopics(runCtx); err != nil {
		c.log.Error("consumer not started", "error", err)
		return err
	}
	if err := c.checkTables(runCtx); err != nil {
		c.log.Error("consumer not started", "error", err)
		return err
	}
	group, err := c.client.Group(c.groupConfig())
	if err != nil {
		return fmt.Errorf("%w: consumer: %w", errInvalidConfig, err)
	}
	c.log.Info("consumer started", "topics", c.cfg.Topics, "batch_size", c.cfg.BatchSize,
		"on_failure", c.cfg.Failure.Policy.String(), "store_offsets", c.cfg.Offsets.Store)

	if c.cfg.Inbox != nil && c.cfg.MaintenanceInterval > 0 {
		maintained := make(chan struct{})
		go func() {
			defer close(maintained)
			c.maintain(runCtx)
		}()
		defer func() {
			cancel(nil)
			<-maintained
		}()
	}

	// member is this membership of the group: the workers run under it, and
	// the stall watchdog ends it to make this member leave the group.
	member, leave := c.join(runCtx)
	defer func() { leave(nil); c.watchers.Wait() }()
	failures := 0
	var fatal error
	for {
		gen, err := group.Next(member)
		if runCtx.Err() != nil {
			break
		}
		if member.Err() != nil {
			// A partition stalled: the workers' contexts ended with member
			// (their database work in flight is cancelled and rolled back);
			// close waits for them, and leaves the group, whose other members
			// take over the partitions. Out of the group until the database
			// answers, then back in.
			c.log.Warn("leaving the consumer group", "cause", context.Cause(member))
			if cerr := group.Close(); cerr != nil {
				c.log.Warn("closing the consumer group failed", "error", cerr)
			}
			group = nil
			c.watchers.Wait()
			if !c.awaitDatabase(runCtx) {
				break
			}
			if group, err = c.client.Group(c.groupConfig()); err != nil {
				// It was accepted before: not expected to happen.
				fatal = fmt.Errorf("%w: consumer: %w", errInvalidConfig, err)
				cancel(fatal)
				break
			}
			member, leave = c.join(runCtx)
			failures = 0
			continue
		}
		if err != nil && group.Rejected(err) {
			c.log.Error("the group rejected this consumer's configuration; stopping", "error", err)
			fatal = fmt.Errorf("%w: consumer: group %q: %w", errInvalidConfig, c.cfg.GroupID, err)
			cancel(fatal)
			break
		}
		if err != nil {
			failures++
			wait := backoff.Wait(c.cfg.Failure.MinBackoff, c.cfg.Failure.MaxBackoff, failures)
			c.log.Warn("consumer group error; retrying", "error", err, "failures", failures, "retry_in", wait)
			if backoff.Sleep(runCtx, wait) != nil {
				break
			}
			continue
		}
		failures = 0
		c.startGeneration(member, gen)
	}
	// Close waits for every worker still running (they commit what they
	// finished) and then leaves the group.
	if group != nil {
		if cerr := group.Close(); cerr != nil {
			c.log.Warn("closing the consumer group failed", "error", cerr)
		}
	}
	c.log.Info("consumer stopped", "cause", context.Cause(runCtx))

	cause := context.Cause(runCtx)
	var errs []error
	switch {
	case fatal != nil:
		errs = append(errs, fatal)
	case errors.Is(cause, errClosed):
	case errors.Is(cause, testhooks.ErrCrash):
		errs = append(errs, testhooks.ErrCrash)
	default:
		errs = append(errs, ctx.Err())
	}
	for _, s := range c.Stopped() {
		errs = append(errs, s)
	}
	return errors.Join(errs...)
}

// maintain runs the inbox's maintenance now and then every
// MaintenanceInterval until ctx ends.
func (c *Consumer) maintain(ctx context.Context) {
	t := time.NewTicker(c.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		report, err := c.cfg.Inbox.Maintain(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Error("inbox maintenance failed; will try again", append([]any{"error", err, "next_in", c.cfg.MaintenanceInterval},
				c.missingTables(ctx, err)...)...)
		}
		c.emit(hooks.Event{Kind: hooks.Maintenance, Offset: -1, Err: err, Maintenance: report})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops Run and waits for it to return. It is safe to call more than
// once and before or without Run; called before Run, it closes the Kafka
// client (Config.Kafka.Transport), which Run would have closed.
func (c *Consumer) Close() error {
	c.mu.Lock()
	state := c.state
	c.state = 2
	cancel := c.cancel
	c.mu.Unlock()
	switch state {
	case 0:
		c.client.Close()
	case 1:
		cancel(errClosed)
		<-c.done
	}
	return nil
}

// Stopped returns the halted partitions (see PartitionStoppedError) not yet
// past the offset they stopped at, by topic and partition. It is safe
// to call at any time, also after Run returned.
func (c *Consumer) Stopped() []*PartitionStoppedError {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*PartitionStoppedError, 0, len(c.stopped))
	for _, s := range c.stopped {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *PartitionStoppedError) int {
		if n := strings.Compare(a.Topic, b.Topic); n != 0 {
			return n
		}
		return a.Partition - b.Partition
	})
	return out
}

func (c *Consumer) setStopped(e *PartitionStoppedError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped[topicPartition{e.Topic, e.Partition}] = e
}

// clearStopped forgets a stop once the partition got past its offset.
func (c *Consumer) clearStopped(topic string, partition int, next int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := topicPartition{topic, partition}
	if s, ok := c.stopped[k]; ok && next > s.Offset {
		delete(c.stopped, k)
	}
}

// crash simulates a process death (tests only): workers return at once
// without committing, Run leaves the group and returns testhooks.ErrCrash.
func (c *Consumer) crash() {
	c.mu.Lock()
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel(testhooks.ErrCrash)
	}
}

// crashed reports whether ctx ended with a simulated process death (see
// Consumer.crash).
func crashed(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), testhooks.ErrCrash)
}

func (c *Consumer) emit(e hooks.Event) {
	if !c.hooks.HasEvents() {
		return
	}
	if e.Consumer == "" {
		e.Consumer = c.cfg.Consumer
	}
	c.hooks.Emit(e)
}

// join starts a membership of the group under runCtx, with the stall
// watchdog (Config.Timeouts.ProcessingStall) that ends it.
func (c *Consumer) join(runCtx context.Context) (context.Context, context.CancelCauseFunc) {
	member, leave := context.WithCancelCause(runCtx)
	if c.cfg.Timeouts.ProcessingStall > 0 {
		c.watchers.Go(func() { c.watch(member, leave) })
	}
	return member, leave
}

// groupConfig is what the group membership takes from the Config.
func (c *Consumer) groupConfig() transport.GroupConfig {
	return transport.GroupConfig{
		GroupID:           c.cfg.GroupID,
		Topics:            c.cfg.Topics,
		SessionTimeout:    c.cfg.Kafka.SessionTimeout,
		HeartbeatInterval: c.cfg.Kafka.HeartbeatInterval,
		RebalanceTimeout:  c.cfg.Kafka.RebalanceTimeout,
		JoinBackoff:       c.cfg.Failure.MinBackoff,
		StartOffset:       c.cfg.Kafka.StartOffset,
		MaxWait:           c.cfg.Kafka.MaxWait,
		Logger:            c.log,
	}
}

// startGeneration starts a worker for each partition gen gives this member
// to start: all of its partitions with an eager client, only the new ones
// with a cooperative client, whose workers of kept partitions go on. A
// worker belongs to the generation that started it: it writes that
// generation's id into the stored offset's row and commits through it.
//
// The client runs no partition in two functions at once; the workers
// make sure of it too: a worker whose partition's previous worker still
// runs waits for it to return before it reads anything.
func (c *Consumer) startGeneration(member context.Context, gen transport.Generation) {
	n := 0
	for _, topic := range c.cfg.Topics {
		for _, a := range gen.Assigned(topic) {
			w := newWorker(c, gen, topic, a)
			prev := c.addWorker(w)
			if prev != nil {
				w.log.Warn("partition started again while its previous worker still runs (the Kafka client did not revoke it first); the new worker waits for it to return",
					"previous_generation", prev.genID())
			}
			gen.Start(a, func(ctx context.Context, r transport.PartitionReader) {
				defer c.removeWorker(w)
				if prev != nil {
					select {
					case <-prev.done:
					case <-ctx.Done():
					case <-member.Done():
					}
					if ctx.Err() != nil || member.Err() != nil {
						return
					}
				}
				w.run(member, ctx, r)
			})
			n++
		}
	}
	c.mu.Lock()
	running := len(c.workers)
	c.mu.Unlock()
	c.log.Info("generation started", "generation", gen.ID(), "member", gen.MemberID(), "partitions_started", n, "partitions_running", running)
}

func (c *Consumer) db() *gorm.DB { return c.quietDB }
