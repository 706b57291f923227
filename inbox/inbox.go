package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/hooklist"
	"github.com/inboxgo/inbox/internal/short"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// Handler applies the business effect of one message inside tx, the
// transaction that also holds the message's inbox row. It must use tx (not
// another connection) for every write that has to be atomic with the inbox
// row, and must not commit or roll back tx. It runs only for a message seen
// for the first time; if it returns an error or panics, the inbox row and
// everything written through tx are rolled back.
type Handler func(ctx context.Context, tx *gorm.DB, msg Message) error

// Outcome is what happened to a message.
type Outcome int

const (
	// Processed: the inbox row was new, the handler ran and its effect
	// committed together with the row.
	Processed Outcome = iota + 1
	// Duplicate: the inbox already held the row; the handler did not run.
	Duplicate
	// Failed: nothing of this message was committed; see the error.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ExpiredPolicy decides what happens to an event older than the retention
// window, whose inbox row may already have been removed.
type ExpiredPolicy int

const (
	// RejectExpired returns an error wrapping [ErrExpired] and applies
	// nothing: no effect is ever applied twice, and the caller must decide
	// (dead-letter the message, or inspect it by hand). The default.
	RejectExpired ExpiredPolicy = iota
	// ProcessExpired processes the event as usual. If its day was already
	// removed, a redelivery of an event that was processed long ago is
	// applied again: use it only where the effect is naturally idempotent.
	ProcessExpired
)

// The defaults of the Config fields of the same names, used where a field is
// left zero.
const (
	DefaultRetentionDays = 30
	DefaultPrepareDays   = 7
	DefaultMaxFutureDays = 3660
	DefaultMaxAttempts   = 10
	DefaultMinBackoff    = 5 * time.Millisecond
	DefaultMaxBackoff    = time.Second
)

// Config tunes an Inbox. The zero value is usable.
type Config struct {
	// RetentionDays is how many days before today (UTC) the inbox keeps
	// rows and therefore can detect duplicates. Choose it longer than the
	// broker's retention plus any replay horizon. Default 30.
	RetentionDays int
	// PrepareDays is how many days after today Maintain prepares storage
	// for. Default 7.
	PrepareDays int
	// MaxFutureDays is how many days after today (UTC) an event's day may
	// lie: a later one is invalid (ErrInvalidMessage), never stored. Each
	// distinct day gets storage of its own on a storage.InboxStore that partitions by
	// day (storage.DayPreparer), so without a bound a producer's clock error or a
	// hostile payload could make a table of thousands of partitions, or,
	// past the database's limit (MariaDB: 8192), a claim that can never
	// succeed and would be retried as a database failure. Default 3660.
	MaxFutureDays int
	// Expired is the policy for events older than RetentionDays.
	Expired ExpiredPolicy
	// MaxAttempts bounds how often one transaction is run in all, when it
	// fails with a transient error. Default 10. Under a consumer.Consumer
	// it does not apply to the consumer's messages, whose retries its
	// consumer.Config.Failure owns; it still bounds Migrate and Maintain.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts. Defaults 5ms and 1s. Like MaxAttempts, they do not apply to
	// the messages of a consumer.Consumer (see its Config.Failure).
	MinBackoff, MaxBackoff time.Duration
	// TxOptions are passed to BeginTx (isolation level, read-only is not
	// allowed). Nil uses the database default.
	TxOptions *sql.TxOptions
	// Logger receives retries (Warn), failures (Error) and duplicates
	// (Debug). Under a consumer.Consumer, which owns the retries, the
	// consumer logs each failed attempt (a retry at Warn, the final failure
	// at Error) and the inbox logs none of its calls' failures or
	// duplicates. Default slog.Default(). The values a message brings (its
	// event id, its consumer) are logged shortened to 64 bytes, as error
	// texts show them. A consumer.Consumer without a Logger of its own logs
	// here too.
	Logger *slog.Logger
	// Hooks receive every outcome and retry (hooks.EventHook) and are
	// called around each message's processing, its claim and its handler
	// call (hooks.MessageTracer, ClaimTracer, HandlerTracer), so that a
	// metrics or tracing system (the module github.com/inboxgo/inbox/otel)
	// can count and open nested spans. Hooks stack: each is called, in
	// order. None costs nothing. A consumer.Consumer without Hooks of its
	// own reports its events to these: under it the inbox reports no
	// outcome, the consumer does, so each event reaches a hook once.
	Hooks []hooks.Hook
	// Now is the clock used for the retention window and maintenance.
	// Default time.Now. Tests set it to move days.
	Now func() time.Time
}

// Inbox processes messages exactly once per consumer on top of a storage.InboxStore. It
// is safe for concurrent use.
type Inbox struct {
	db       *gorm.DB // db, quiet (txn.Quiet): the inbox's own statements
	app      *gorm.DB // db as given
	store    storage.InboxStore
	cfg      Config
	log      *slog.Logger
	hooks    *hooklist.List
	counters counters
}

// New returns an Inbox writing through db with store. It does not touch the
// database; call Migrate once at start-up.
//
// The inbox's own statements (claims, watermarks, migrations, maintenance;
// a consumer.Consumer's stored offsets too) are not logged by db's GORM
// logger, which would show them among the application's ("record not
// found", "SLOW SQL"); the statements of a handler, in the same
// transaction, are.
func New(db *gorm.DB, store storage.InboxStore, cfg Config) (*Inbox, error) {
	if db == nil || store == nil {
		return nil, fmt.Errorf("%w: nil db or store", ErrInvalidConfig)
	}
	if cfg.RetentionDays < 0 || cfg.PrepareDays < 0 || cfg.MaxFutureDays < 0 || cfg.MaxAttempts < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0 {
		return nil, fmt.Errorf("%w: negative value in %+v", ErrInvalidConfig, cfg)
	}
	if cfg.Expired != RejectExpired && cfg.Expired != ProcessExpired {
		return nil, fmt.Errorf("%w: unknown expired policy %d", ErrInvalidConfig, cfg.Expired)
	}
	if cfg.TxOptions != nil && cfg.TxOptions.ReadOnly {
		return nil, fmt.Errorf("%w: read-only transactions cannot hold inbox rows", ErrInvalidConfig)
	}
	cfg.RetentionDays = cmp.Or(cfg.RetentionDays, DefaultRetentionDays)
	cfg.PrepareDays = cmp.Or(cfg.PrepareDays, DefaultPrepareDays)
	cfg.MaxFutureDays = cmp.Or(cfg.MaxFutureDays, DefaultMaxFutureDays)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, DefaultMinBackoff)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, DefaultMaxBackoff), cfg.MinBackoff)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = short.Logger(log)
	if c, ok := db.Statement.ConnPool.(gorm.TxCommitter); ok && c != nil {
		return nil, fmt.Errorf("%w: New needs the database, not a transaction (use ProcessTx to process inside one)", ErrInvalidConfig)
	}
	hl, err := hooklist.New("inbox.Config.Hooks", cfg.Hooks)
	if err != nil {
		return nil, err
	}
	if err := txn.TrackStatements(db); err != nil {
		return nil, err
	}
	return &Inbox{db: txn.Quiet(db), app: db, store: store, cfg: cfg, log: log.With("component", "inbox"), hooks: hl}, nil
}

// Store returns the store the inbox writes through.
func (ib *Inbox) Store() storage.InboxStore { return ib.store }

// DB returns the database handle the inbox opens transactions on, as it
// was given to New. (The inbox's own statements do not go through its GORM
// logger; a handler's do.)
func (ib *Inbox) DB() *gorm.DB { return ib.app }

// Migrate creates or upgrades the inbox table, retrying transient errors.
// It does not prepare partitions: call Maintain (or start RunMaintenance)
// after it. A claim on a table that does not exist (Migrate never ran, or
// the table was dropped) fails with an error that names Migrate, when the
// store tells a missing table apart (storage.MissingTableReporter).
func (ib *Inbox) Migrate(ctx context.Context) error {
	err := ib.retry(ctx, func(int) error { return txn.DatabaseFailure("migrate", ib.store.Migrate(ctx, ib.db.WithContext(ctx))) })
	if err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	return nil
}

// Process runs h for msg inside one transaction together with the insert of
// msg's inbox row, and commits both, or neither. It returns Duplicate without
// running h if the row already exists. Transient database failures (see
// [IsDatabaseFailure]), and handler errors marked with [Retryable], run the
// whole transaction again, up to Config.MaxAttempts. A handler panic rolls
// back and returns a *PanicError; a COMMIT the database refuses (a deferred
// constraint) returns a *CommitError.
//
// Commit the broker offset of msg only after Process returns a nil error.
func (ib *Inbox) Process(ctx context.Context, msg Message, h Handler) (Outcome, error) {
	start := time.Now()
	ctx, end := ib.startMessage(ctx, msg)
	if err := ib.admit(msg, ib.cfg.Now()); err != nil {
		ib.record(ctx, msg, Failed, err, start, end, true)
		return Failed, err
	}
	var out Outcome
	rows := []storage.InboxRow{msg.row()}
	days := ib.newDays(rows)
	err := ib.retry(ctx, func(attempt int) error {
		return days.run(ctx, func() error {
			return ib.claimTx(ctx, rows, func(tx *gorm.DB, inserted []bool) error {
				var err error
				out, err = ib.handleClaimed(ctx, tx, msg, h, inserted[0])
				return err
			})
		})
	})
	if err != nil {
		err = fmt.Errorf("inbox: consumer %q event %q: %w", msg.Consumer, msg.ID, err)
		ib.record(ctx, msg, Failed, err, start, end, true)
		return Failed, err
	}
	ib.record(ctx, msg, out, nil, start, end, true)
	return out, nil
}

// ProcessTx is Process inside a transaction the caller holds. The inbox row
// and h's writes go into a savepoint of tx that ProcessTx issues itself
// (also when tx's GORM configuration disables nested transactions): if
// ProcessTx returns an error, they are rolled back and tx stays usable,
// unless the error says that rolling back to the savepoint failed too; if
// the caller later rolls tx back, the inbox row goes with it. tx must be a
// transaction: a plain *gorm.DB is refused with an error wrapping
// ErrInvalidConfig, since a savepoint outside a transaction protects
// nothing.
//
// ProcessTx never retries, since only the owner of tx can run it again; use
// [Inbox.IsRetryable] on the error to decide. When it reports a database
// failure ([IsDatabaseFailure]), roll tx back: on MySQL and MariaDB a
// deadlock has already ended the whole transaction. The caller commits tx,
// and only then the broker offset.
func (ib *Inbox) ProcessTx(ctx context.Context, tx *gorm.DB, msg Message, h Handler) (Outcome, error) {
	start := time.Now()
	ctx, end := ib.startMessage(ctx, msg)
	if err := ib.admit(msg, ib.cfg.Now()); err != nil {
		ib.record(ctx, msg, Failed, err, start, end, true)
		return Failed, err
	}
	if tx == nil {
		err := fmt.Errorf("%w: ProcessTx needs a transaction, got nil", ErrInvalidConfig)
		ib.record(ctx, msg, Failed, err, start, end, true)
		return Failed, err
	}
	var out Outcome
	// A day without storage is made on the inbox's own handle while tx
	// stays open, and the claim runs again in a new savepoint.
	err := ib.newDays([]storage.InboxRow{msg.row()}).run(ctx, func() error {
		return txn.InSavepoint(ctx, tx, ib.store, func(sp *gorm.DB) error {
			var err error
			out, err = ib.claimAndHandle(ctx, sp, msg, h)
			return err
		})
	})
	if err != nil {
		err = fmt.Errorf("inbox: consumer %q event %q: %w", msg.Consumer, msg.ID, err)
		ib.record(ctx, msg, Failed, err, start, end, true)
		return Failed, err
	}
	ib.record(ctx, msg, out, nil, start, end, true)
	return out, nil
}

// IsRetryable reports whether running the transaction again may cure err:
// a handler error marked with [Retryable] (and not with [Permanent]), or a
// database failure ([IsDatabaseFailure]) that the storage.InboxStore
// classifies as transient. A handler's own errors are never retryable
// unless marked, whatever they wrap.
func (ib *Inbox) IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if IsPermanent(err) && !IsDatabaseFailure(err) {
		return false
	}
	if isMarkedRetryable(err) || errors.As(err, new(dayUnseenError)) {
		return true
	}
	var f *txn.Failure
	return errors.As(err, &f) && ib.store.IsRetryable(f.Err)
}

// admit reports the error Process returns for msg, as of now, before
// opening a transaction: an invalid message (wrapping ErrInvalidMessage),
// or, under the RejectExpired policy, an event older than the retention
// window (wrapping ErrExpired). A nil error means msg reaches the database.
func (ib *Inbox) admit(msg Message, now time.Time) error {
	if err := msg.Validate(); err != nil {
		return err
	}
	day, today := msg.Day(), storage.DayOf(now)
	if latest := today.AddDate(0, 0, ib.cfg.MaxFutureDays); day.After(latest) {
		return &ValidationError{Field: "event time", Value: msg.Time.UTC().Format(time.RFC3339),
			Reason: fmt.Sprintf("its day is more than %d days after today (Config.MaxFutureDays)", ib.cfg.MaxFutureDays)}
	}
	if oldest := today.AddDate(0, 0, -ib.cfg.RetentionDays); day.Before(oldest) {
		if ib.cfg.Expired == RejectExpired {
			return &ExpiredError{Day: day, Oldest: oldest}
		}
		ib.log.Warn("processing an event older than the retention window; a redelivery of it may be applied twice",
			"consumer", msg.Consumer, "event_id", msg.ID, "day", day.Format(time.DateOnly))
	}
	return nil
}

// oldestCheckedDay is the oldest event day, as of now, whose inbox rows are
// guaranteed to be kept: events of earlier days are expired.
func (ib *Inbox) oldestCheckedDay(now time.Time) time.Time {
	return storage.DayOf(now).AddDate(0, 0, -ib.cfg.RetentionDays)
}

func (ib *Inbox) claimAndHandle(ctx context.Context, tx *gorm.DB, msg Message, h Handler) (Outcome, error) {
	rows := []storage.InboxRow{msg.row()}
	cctx, endClaim := ib.startClaim(ctx, rows)
	inserted, err := ib.claim(cctx, tx, rows)
	endClaim(inserted, err)
	if err != nil {
		return Failed, err
	}
	return ib.handleClaimed(ctx, tx, msg, h, inserted[0])
}

// dayRuns makes missing days' storage on demand for one call (see
// storage.DayPreparer): at most storage.MaxDayPreparations times in all, however often the
// call's transaction is retried.
type dayRuns struct {
	ib       *Inbox
	dp       storage.DayPreparer // nil: the storage.InboxStore has no such capability
	rows     []storage.InboxRow
	prepared int
}

func (ib *Inbox) newDays(rows []storage.InboxRow) *dayRuns {
	dp, _ := ib.store.(storage.DayPreparer)
	return &dayRuns{ib: ib, dp: dp, rows: rows}
}

// run runs fn, and while fn's claim fails for a day without storage, makes
// the days of the rows and runs fn again, within the call's bound.
func (d *dayRuns) run(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil || d.dp == nil || !d.missingDay(err) || ctx.Err() != nil {
			return err
		}
		if d.prepared >= storage.MaxDayPreparations {
			return dayUnseenError{err}
		}
		// Only a preparation that succeeded counts: one that failed (a
		// retryable "being detached" goes back to the retry loop, which
		// counts its attempts) made nothing.
		if perr := d.prepare(ctx); perr != nil {
			return perr
		}
		d.prepared++
	}
}

// dayUnseenError is a claim that still finds no storage for a row's day
// after its days were made storage.MaxDayPreparations times without error. The days
// exist, so running the transaction again later is what cures it: on
// PostgreSQL at READ COMMITTED, while a partition of another day is being
// detached concurrently, claims were seen failing for a day attached since,
// every one of them until the detach ended (TestMaintainUnderLoad, about 1
// run in 60). The retry loop bounds how often it is run again; it is still
// a database failure for the consumer.
type dayUnseenError struct{ err error }

func (e dayUnseenError) Error() string { return e.err.Error() }
func (e dayUnseenError) Unwrap() error { return e.err }

// missingDay reports whether err is the inbox's own claim failing because
// a row's day has no storage (the storage.InboxStore decides, by error code), with
// nothing of the caller's transaction left in doubt.
func (d *dayRuns) missingDay(err error) bool {
	var f *txn.Failure
	if errors.Is(err, txn.ErrRollbackToFailed) || !errors.As(err, &f) || (f.Op != "claim" && f.Op != "begin and claim") {
		return false
	}
	return d.dp.IsMissingDay(f.Err)
}

func (d *dayRuns) prepare(ctx context.Context) error {
	var days []time.Time
	seen := make(map[time.Time]bool, 1)
	for _, r := range d.rows {
		if day := storage.DayOf(r.Day); !seen[day] {
			seen[day] = true
			days = append(days, day)
		}
	}
	slices.SortFunc(days, time.Time.Compare)
	start := time.Now()
	if err := d.dp.PrepareDays(ctx, d.ib.db.WithContext(ctx), days); err != nil {
		return txn.DatabaseFailure("prepare days", err)
	}
	d.ib.log.Info("inbox: made storage for days a claim found none for", "days", len(days),
		"first", days[0].Format(time.DateOnly), "last", days[len(days)-1].Format(time.DateOnly), "took", time.Since(start))
	return nil
}

// handleClaimed runs h for msg if its claim inserted the row.
func (ib *Inbox) handleClaimed(ctx context.Context, tx *gorm.DB, msg Message, h Handler, inserted bool) (Outcome, error) {
	if !inserted {
		return Duplicate, nil
	}
	if err := ib.handle(ctx, tx, msg, h); err != nil {
		return Failed, err
	}
	return Processed, nil
}

// claimTx runs fn in a new transaction that holds the claim of rows, and
// commits it (see txn.Transact). A storage.InboxStore that is a storage.ClaimBeginner opens the
// transaction and claims in one round trip.
//
// The ClaimTracer hooks surround the claim, with BEGIN when the
// two go together; its context reaches the storage.InboxStore's claim, not the
// transaction, whose statements belong to the message.
func (ib *Inbox) claimTx(ctx context.Context, rows []storage.InboxRow, fn func(tx *gorm.DB, inserted []bool) error) error {
	return ib.claimTxAt(ctx, ctx, 0, rows, nil, fn)
}

// claimTxAt is claimTx with the claim traced under traceCtx, and, if bound
// is positive, BEGIN, the claim, COMMIT and ROLLBACK each bounded by it
// (see txn.TimeoutError), and writes saved after the claim (with BEGIN, in
// one round trip, when there are no rows and the store can).
func (ib *Inbox) claimTxAt(ctx, traceCtx context.Context, bound time.Duration, rows []storage.InboxRow, writes []storage.WatermarkWrite, fn func(tx *gorm.DB, inserted []bool) error) error {
	var ws storage.WatermarkStore
	if len(writes) > 0 {
		var ok bool
		if ws, ok = ib.store.(storage.WatermarkStore); !ok {
			return fmt.Errorf("%w: watermarks to write, and %T is no storage.WatermarkStore", ErrInvalidConfig, ib.store)
		}
	}
	saved := len(writes) == 0
	var inserted []bool
	cctx, ct := ctx, (*claimTrace)(nil)
	if len(rows) == 0 {
		// Nothing to claim (every message is deduplicated by a watermark).
		inserted = []bool{}
	} else if ib.hooks.HasClaimTracers() {
		var end func([]bool, error)
		cctx, end = ib.startClaim(traceCtx, rows)
		ct = &claimTrace{end: end}
		// BEGIN can fail before the claim runs.
		defer ct.done(nil, errClaimNotRun)
	}
	// tctx is ctx carrying the transaction's statement state (see
	// txn.RunFrom): the transaction's own context.
	open := func(tctx context.Context) (*gorm.DB, func(), error) {
		if wb, ok := ws.(storage.WatermarkBeginner); ok && len(rows) == 0 {
			bctx, bounded, cancel := txn.WithBound(ctx, "BEGIN and the watermarks' write", bound)
			tx, ok, err := wb.BeginSaveWatermarks(bctx, ib.db.WithContext(tctx), ib.cfg.TxOptions, writes)
			cancel()
			if err != nil {
				return nil, nil, txn.DatabaseFailure("begin and save watermarks", bounded(err))
			}
			if ok {
				saved = true
				return tx, nil, nil
			}
		}
		if cb, ok := ib.store.(storage.ClaimBeginner); ok && len(rows) > 0 {
			bctx, bounded, cancel := txn.WithBound(cctx, "BEGIN and the claim", bound)
			tx, ins, ok, err := cb.BeginClaim(bctx, ib.db.WithContext(tctx), ib.cfg.TxOptions, rows)
			cancel()
			if err != nil {
				err = txn.DatabaseFailure("begin and claim", ib.noTable(bounded(err)))
				ct.done(nil, err)
				return nil, nil, err
			}
			if ok {
				if len(ins) != len(rows) {
					_ = tx.Rollback().Error
					err := txn.DatabaseFailure("claim", fmt.Errorf("%w: %d answers for %d rows", errStoreContract, len(ins), len(rows)))
					ct.done(nil, err)
					return nil, nil, err
				}
				inserted = ins
				ct.done(ins, nil)
				return tx, nil, nil
			}
		}
		tx, release, err := txn.Begin(tctx, ib.db, ib.cfg.TxOptions, bound)
		if err != nil {
			ct.done(nil, err)
		}
		return tx, release, err
	}
	return fromTxn(txn.RunFrom(ctx, bound, open, ib.store, func(tx *gorm.DB) error {
		if inserted == nil {
			var err error
			inserted, err = ib.claimWithin(cctx, tx, rows, bound)
			ct.done(inserted, err)
			if err != nil {
				return err
			}
		}
		if !saved {
			wctx, bounded, cancel := txn.WithBound(ctx, "the watermarks' write", bound)
			err := ws.SaveWatermarks(wctx, tx, writes)
			cancel()
			if err != nil {
				return txn.DatabaseFailure("save watermarks", bounded(err))
			}
		}
		return fn(tx, inserted)
	}))
}

// noTable is err, a claim's failure, with the call that makes the inbox
// table when the store reports that it does not exist
// (storage.MissingTableReporter): Migrate never ran, or the table was
// dropped.
func (ib *Inbox) noTable(err error) error {
	if mt, ok := ib.store.(storage.MissingTableReporter); ok && mt.IsMissingTable(err) {
		return &noTableError{err}
	}
	return err
}

type noTableError struct{ err error }

func (e *noTableError) Error() string {
	return e.err.Error() + " (the inbox table does not exist: run Inbox.Migrate, or inboxctl migrate)"
}

func (e *noTableError) Unwrap() error { return e.err }

// claimTrace ends a claim's Trace hook once, whichever step ends the claim
// first. A nil *claimTrace (no hook) does nothing.
type claimTrace struct {
	end   func([]bool, error)
	ended bool
}

func (c *claimTrace) done(inserted []bool, err error) {
	if c == nil || c.ended {
		return
	}
	c.ended = true
	c.end(inserted, err)
}

// errClaimNotRun ends a claim's trace when the transaction ended before the
// claim ran; it is never returned.
var errClaimNotRun = errors.New("inbox: the claim did not run")

// errStoreContract reports a storage.InboxStore that broke the Claim contract.
var errStoreContract = errors.New("inbox: store broke the Claim contract")

func (ib *Inbox) claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	return ib.claimWithin(ctx, tx, rows, 0)
}

// claimWithin is claim bounded by bound, if positive.
func (ib *Inbox) claimWithin(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow, bound time.Duration) ([]bool, error) {
	cctx, bounded, cancel := txn.WithBound(ctx, "the claim", bound)
	inserted, err := ib.store.Claim(cctx, tx, rows)
	cancel()
	if err != nil {
		return nil, txn.DatabaseFailure("claim", ib.noTable(bounded(err)))
	}
	if len(inserted) != len(rows) {
		return nil, txn.DatabaseFailure("claim", fmt.Errorf("%w: %d answers for %d rows", errStoreContract, len(inserted), len(rows)))
	}
	return inserted, nil
}

func callBatchHandler(ctx context.Context, tx *gorm.DB, msgs []Message, h BatchHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = newPanicError(r)
		}
	}()
	return h(ctx, txn.ForApplication(tx), msgs)
}

// handle calls h for msg inside the HandlerTracer hooks, if any.
func (ib *Inbox) handle(ctx context.Context, tx *gorm.DB, msg Message, h Handler) error {
	if !ib.hooks.HasHandlerTracers() {
		return callHandler(ctx, tx, msg, h)
	}
	hctx, end := ib.startHandler(ctx, []Message{msg})
	err := callHandler(hctx, tx, msg, h)
	end(err)
	return err
}

// handleBatch calls h for msgs inside the HandlerTracer hooks, if
// any.
func (ib *Inbox) handleBatch(ctx context.Context, tx *gorm.DB, msgs []Message, h BatchHandler) error {
	hctx, end := ib.startHandler(ctx, msgs)
	err := callBatchHandler(hctx, tx, msgs, h)
	end(err)
	return err
}

func callHandler(ctx context.Context, tx *gorm.DB, msg Message, h Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = newPanicError(r)
		}
	}()
	return h(ctx, txn.ForApplication(tx), msg)
}

// retry runs fn until it succeeds, fails with a permanent error, the context
// ends or the attempts are used up.
func (ib *Inbox) retry(ctx context.Context, fn func(attempt int) error) error {
	return ib.retryUnless(ctx, false, fn)
}

// retryUnless is retry, or, when callerRetries, one run of fn whose error
// is returned as it is, for the caller to retry.
func (ib *Inbox) retryUnless(ctx context.Context, callerRetries bool, fn func(attempt int) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(attempt)
		if err == nil {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			if errors.Is(err, cerr) {
				return err
			}
			// One line: errors.Join would add a newline.
			return fmt.Errorf("%w; not retried, the context ended: %w", err, cerr)
		}
		if callerRetries || !ib.IsRetryable(err) {
			return err
		}
		if attempt >= ib.cfg.MaxAttempts {
			return fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		}
		ib.counters.retries.Add(1)
		ib.log.Warn("transient failure, retrying the transaction", "attempt", attempt, "error", err)
		ib.hooks.Emit(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryTransaction, Attempt: attempt, Err: err, Offset: -1})
		if err := backoff.Sleep(ctx, backoff.Wait(ib.cfg.MinBackoff, ib.cfg.MaxBackoff, attempt)); err != nil {
			return err
		}
	}
}
