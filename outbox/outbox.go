package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// Defaults for Config.
const (
	defaultRetentionDays = 3
	defaultPrepareDays   = 7
)

// Config tunes an Outbox. The zero value is usable.
type Config struct {
	// Headers picks the event id and time headers, and the names of the
	// sequence headers. Default EventHeaders.
	Headers HeaderStyle
	// NoSequenceHeaders turns the sequence headers off (see "Sequence
	// headers" in the package doc): the relay stamps none, and Enqueue
	// accepts messages that carry headers of their names, which are then
	// sent as they are. By default the relay stamps them whenever the
	// store implements storage.Sequenced.
	NoSequenceHeaders bool
	// AlignedTopic, if set, makes the outbox aligned (see "Aligned shards"
	// in the package doc): every message must go to this topic, a
	// message's shard is the partition Kafka's default partitioner gives
	// its key (its event id when it has none), and the relay publishes it
	// to that partition with the partitions header. The topic must have as
	// many partitions as the store has shards, and the store must say how
	// many (storage.Sharded) and stamp sequence headers (storage.Sequenced,
	// with NoSequenceHeaders false). Turn it on only for an outbox table
	// that holds no unpublished rows of another mode.
	AlignedTopic string
	// RetentionDays is how many days before today published rows are kept
	// (for diagnosis and replays by hand). Default 3.
	RetentionDays int
	// PrepareDays is how many days after today Maintain prepares storage
	// for. Default 7.
	PrepareDays int
	// MaxAttempts, MinBackoff and MaxBackoff bound the retries of the
	// outbox's own transactions (Migrate, Maintain, and the relay's).
	// Defaults 10, 5ms and 1s.
	MaxAttempts            int
	MinBackoff, MaxBackoff time.Duration
	// Logger receives retries (Warn) and failures (Error). Default
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock for event times, row days and maintenance. Default
	// time.Now.
	Now func() time.Time
}

// Outbox stores messages inside the application's transactions. It is safe
// for concurrent use.
type Outbox struct {
	db    *gorm.DB
	store storage.OutboxStore
	seq   storage.Sequenced // nil: no sequence headers
	// shards is the store's shard count if the outbox is aligned
	// (Config.AlignedTopic), else 0.
	shards int
	cfg    Config
	log    *slog.Logger

	enqueued, refused, failed atomic.Uint64
	// wakers are this process's relays of the outbox, woken by Enqueue.
	wakers wakers
}

// Counters are an Outbox's totals since it was made.
type Counters struct {
	Enqueued uint64 // messages handed to the storage.OutboxStore (they commit with their transactions, or not)
	Refused  uint64 // calls refused before anything was written: invalid messages, no transaction
	Failed   uint64 // calls whose statements failed (the caller's transaction must roll back)
}

// Counters returns the totals so far, for a metrics system.
func (o *Outbox) Counters() Counters {
	return Counters{Enqueued: o.enqueued.Load(), Refused: o.refused.Load(), Failed: o.failed.Load()}
}

// New returns an Outbox over db and store. It does not touch the database;
// call Migrate once at start-up.
func New(db *gorm.DB, store storage.OutboxStore, cfg Config) (*Outbox, error) {
	if db == nil || store == nil {
		return nil, fmt.Errorf("%w: outbox needs a db and a store", inbox.ErrInvalidConfig)
	}
	if c, ok := db.Statement.ConnPool.(gorm.TxCommitter); ok && c != nil {
		return nil, fmt.Errorf("%w: outbox.New needs the database, not a transaction", inbox.ErrInvalidConfig)
	}
	if cfg.RetentionDays < 0 || cfg.PrepareDays < 0 || cfg.MaxAttempts < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0 {
		return nil, fmt.Errorf("%w: negative value in the outbox configuration", inbox.ErrInvalidConfig)
	}
	if cfg.Headers != EventHeaders && cfg.Headers != CloudEventsHeaders {
		return nil, fmt.Errorf("%w: unknown header style %d", inbox.ErrInvalidConfig, cfg.Headers)
	}
	cfg.RetentionDays = cmp.Or(cfg.RetentionDays, defaultRetentionDays)
	cfg.PrepareDays = cmp.Or(cfg.PrepareDays, defaultPrepareDays)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 10)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 5*time.Millisecond)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, time.Second), cfg.MinBackoff)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// Enqueue's statements run in the caller's transaction; tracked, a
	// transient failure of one dooms that transaction (see txn.Transact).
	if err := txn.TrackStatements(db); err != nil {
		return nil, err
	}
	o := &Outbox{db: txn.Quiet(db), store: store, cfg: cfg, log: log.With("component", "outbox")}
	if sq, ok := store.(storage.Sequenced); ok && !cfg.NoSequenceHeaders {
		o.seq = sq
	}
	if cfg.AlignedTopic != "" {
		shards, err := alignedShards(cfg.AlignedTopic, store, o.seq != nil)
		if err != nil {
			return nil, err
		}
		o.shards = shards
	}
	return o, nil
}

// alignedShards returns the shard count of store for an outbox aligned to
// topic, or why it cannot be aligned. sequenced says that its relays stamp
// sequence headers: the mode is there for them.
func alignedShards(topic string, store storage.OutboxStore, sequenced bool) (int, error) {
	if err := validTopic(topic); err != nil {
		return 0, fmt.Errorf("%w: AlignedTopic: %v", inbox.ErrInvalidConfig, err)
	}
	if !sequenced {
		return 0, fmt.Errorf("%w: an aligned outbox needs sequence headers: a store that implements storage.Sequenced, and NoSequenceHeaders false", inbox.ErrInvalidConfig)
	}
	sh, ok := store.(storage.Sharded)
	if !ok {
		return 0, fmt.Errorf("%w: an aligned outbox needs a store that tells its shard count (storage.Sharded), to match it to the partitions of %q", inbox.ErrInvalidConfig, topic)
	}
	n := sh.Shards()
	if n < 1 || n > math.MaxInt32 {
		return 0, fmt.Errorf("%w: the store says it has %d shards", inbox.ErrInvalidConfig, n)
	}
	return n, nil
}

// Sequenced reports whether the relays of o stamp sequence headers: its
// store implements storage.Sequenced and Config.NoSequenceHeaders is
// false.
func (o *Outbox) Sequenced() bool { return o.seq != nil }

// Migrate creates or checks the outbox tables, retrying transient errors.
// Call Maintain after it.
func (o *Outbox) Migrate(ctx context.Context) error {
	if err := o.retry(ctx, "migrate", func() error { return o.store.Migrate(ctx, o.db.WithContext(ctx)) }); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// Enqueue stores msgs inside tx, the caller's transaction: they are
// published if and only if tx commits, after every message enqueued for the
// same topic and key by transactions that committed before. tx must be a
// transaction (from db.Begin or db.Transaction, or an inbox handler's); a
// plain *gorm.DB is refused with an error wrapping inbox.ErrInvalidConfig,
// since the messages would then commit on their own.
//
// Each message gets its event id and time headers (see [Message]); a
// message that is invalid (for an aligned outbox, also one for another
// topic than Config.AlignedTopic) fails the whole call with an error
// wrapping inbox.ErrInvalidMessage before anything is written; one on a
// table that does not exist (Migrate never ran) names Migrate, when the
// store tells a missing table apart (storage.MissingTableReporter). If a statement fails,
// roll tx back: part of the call may be in it. Enqueue does not retry; a
// transient failure (the store's IsRetryable) means running the whole
// transaction again. It locks the shards of the messages' keys until tx
// ends, so concurrent transactions enqueuing for keys of one shard take
// turns; enqueue all of a transaction's messages in one call, as late in
// the transaction as possible.
func (o *Outbox) Enqueue(ctx context.Context, tx *gorm.DB, msgs ...Message) error {
	err := o.enqueue(ctx, tx, msgs)
	if err != nil {
		if mt, ok := o.store.(storage.MissingTableReporter); ok && mt.IsMissingTable(err) {
			err = fmt.Errorf("%w (a table of the outbox does not exist: run Outbox.Migrate, or inboxctl outbox migrate)", err)
		}
		o.log.LogAttrs(ctx, slog.LevelWarn, "enqueue failed", slog.Int("messages", len(msgs)), slog.Any("error", err))
	}
	return err
}

func (o *Outbox) enqueue(ctx context.Context, tx *gorm.DB, msgs []Message) error {
	if tx == nil {
		o.refused.Add(1)
		return fmt.Errorf("%w: Enqueue needs the caller's transaction, got nil", inbox.ErrInvalidConfig)
	}
	if c, ok := tx.Statement.ConnPool.(gorm.TxCommitter); !ok || c == nil {
		o.refused.Add(1)
		return fmt.Errorf("%w: Enqueue needs a *gorm.DB inside a transaction (db.Begin or db.Transaction): outside one the messages would commit without the effect", inbox.ErrInvalidConfig)
	}
	if len(msgs) == 0 {
		return nil
	}
	now := o.cfg.Now()
	day := storage.DayOf(now)
	rows := make([]storage.OutboxRow, len(msgs))
	for i, m := range msgs {
		p, err := prepare(m, o.cfg.Headers, o.seq != nil, now)
		if err == nil && o.shards > 0 && m.Topic != o.cfg.AlignedTopic {
			err = invalid("topic", m.Topic, fmt.Sprintf("the outbox is aligned to topic %q: every message must go there", o.cfg.AlignedTopic))
		}
		if err != nil {
			o.refused.Add(1)
			return fmt.Errorf("outbox: message %d of %d: %w", i+1, len(msgs), err)
		}
		hs, err := encodeHeaders(p.headers)
		if err != nil {
			return fmt.Errorf("outbox: message %d of %d: %w", i+1, len(msgs), err)
		}
		hash := keyHash(m.Topic, m.Key, p.id)
		if o.shards > 0 {
			hash = partitionHash(m.Key, p.id)
		}
		rows[i] = storage.OutboxRow{KeyHash: hash, Day: day, EventID: p.id, Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: hs}
		if rows[i].Value == nil {
			rows[i].Value = []byte{}
		}
	}
	if err := o.store.Append(ctx, tx.WithContext(ctx), rows); err != nil {
		o.failed.Add(1)
		return fmt.Errorf("outbox: enqueue %d messages: %w", len(rows), err)
	}
	o.enqueued.Add(uint64(len(rows)))
	o.wakers.wakeAfter(tx)
	return nil
}

// Plan returns the maintenance plan for today: prepare today through
// PrepareDays ahead, expire published rows of days before the retention
// window.
func (o *Outbox) Plan() storage.MaintenancePlan {
	today := storage.DayOf(o.cfg.Now())
	return storage.MaintenancePlan{
		Today:          today,
		PrepareThrough: today.AddDate(0, 0, o.cfg.PrepareDays),
		ExpireBefore:   today.AddDate(0, 0, -o.cfg.RetentionDays),
	}
}

// Maintain runs [Outbox.MaintainPlan] for [Outbox.Plan].
func (o *Outbox) Maintain(ctx context.Context) (storage.MaintenanceReport, error) {
	return o.MaintainPlan(ctx, o.Plan())
}

// MaintainPlan prepares the coming days and removes the published rows of
// expired days. A day that still holds unpublished rows is kept and logged
// as an error on every run until its rows are published: nothing
// unpublished is ever removed.
func (o *Outbox) MaintainPlan(ctx context.Context, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	if plan.PrepareThrough.Before(plan.Today) || !plan.ExpireBefore.Before(plan.Today) {
		return storage.MaintenanceReport{}, fmt.Errorf("%w: maintenance plan must prepare from today on and expire only days before today", inbox.ErrInvalidConfig)
	}
	var report storage.MaintenanceReport
	err := o.retry(ctx, "maintain", func() error {
		var err error
		report, err = o.store.Maintain(ctx, o.db.WithContext(ctx), plan)
		return err
	})
	if err != nil {
		return report, fmt.Errorf("outbox: maintain: %w", err)
	}
	report.DryRun = plan.DryRun
	for _, d := range report.Held {
		o.log.Error("outbox day is past retention but still holds unpublished messages; it is kept until they are published: is a relay running?",
			"day", d.Format(time.DateOnly))
	}
	o.log.Info("outbox maintenance done", "prepared", len(report.Prepared), "expired_days", len(report.Expired),
		"rows_removed", report.RowsRemoved, "held_days", len(report.Held), "dry_run", plan.DryRun)
	return report, nil
}

// RunMaintenance calls Maintain now and then every interval until ctx ends;
// it returns ctx's error.
func (o *Outbox) RunMaintenance(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: maintenance interval %v", inbox.ErrInvalidConfig, interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := o.Maintain(ctx); err != nil && ctx.Err() == nil {
			o.log.Error("outbox maintenance failed; will try again", "error", err, "next_in", interval)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// retry runs fn until it succeeds, fails with an error the storage.OutboxStore does not
// call transient, ctx ends, or the attempts are used up.
func (o *Outbox) retry(ctx context.Context, op string, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		if !o.store.IsRetryable(err) {
			return err
		}
		if attempt >= o.cfg.MaxAttempts {
			return fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		}
		o.log.Warn("transient database failure, retrying", "op", op, "attempt", attempt, "error", err)
		if err := backoff.Sleep(ctx, backoff.Wait(o.cfg.MinBackoff, o.cfg.MaxBackoff, attempt)); err != nil {
			return err
		}
	}
}
