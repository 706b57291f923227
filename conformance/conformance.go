// Package conformance is the executable contract of package storage: a
// suite of checks that shows a storage.InboxStore keeps the inbox row and
// the business effect atomic and catches duplicates, under concurrency,
// failure, expiry and hostile ids, and that a storage.OutboxStore publishes
// what committed, once, in commit order per key, across relays that fail,
// restart or take over (and, if it implements storage.Sequenced, keeps one
// source id per table and an epoch, which the relay's sequence headers
// carry with each row's shard and seq). An inbox Store that implements
// storage.WatermarkStore, for sequenced dedup, runs the watermark checks
// too: values stored byte for byte, written atomically with the effect,
// by a compare-and-set that two members of a group cannot both win. One
// that implements storage.OffsetStore, for the consumer's stored offsets,
// runs the offsets checks: offsets written atomically with the effect,
// refused when the row went back behind the writer's floor or was written
// by a newer generation of the group, and tables of earlier versions
// upgraded with their rows.
//
// It is for adapter authors, ours and third parties': an adapter's test
// hands Run a HarnessMaker, which returns a fresh, isolated database and
// stores for every check. Operators run the same checks against a live
// database with inboxctl check.
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(ctx context.Context) (*conformance.Harness, error) {
//			path := filepath.Join(t.TempDir(), "check.db") // a database per check
//			open := func(context.Context) (*gorm.DB, error) {
//				return gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
//			}
//			db, err := open(ctx)
//			if err != nil {
//				return nil, err
//			}
//			store, err := inboxsqlite.New(inboxsqlite.Options{})
//			if err != nil {
//				return nil, err
//			}
//			ob, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
//			if err != nil {
//				return nil, err
//			}
//			return &conformance.Harness{
//				DB:       db,
//				Open:     open, // another connection pool, as another process has
//				Store:    store,
//				Outbox:   ob, // nil skips the outbox checks
//				Features: conformance.Features{ExpiryCountsRows: true},
//				Close: func() error {
//					sqlDB, err := db.DB()
//					if err != nil {
//						return err
//					}
//					return sqlDB.Close()
//				},
//			}, nil
//		})
//	}
//
// Each check returns an error rather than failing a *testing.T, so the suite
// can be run outside tests (RunCheck; inboxctl check does) and can itself be
// tested against deliberately broken stores.
package conformance

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// Harness is one isolated environment for one check.
type Harness struct {
	// DB is a connection to a database in which the suite may create and
	// drop its own scratch tables.
	DB *gorm.DB
	// Store is a fresh inbox Store whose table no other harness uses; nil
	// skips the inbox checks. The suite calls Migrate itself.
	Store storage.InboxStore
	// Outbox is a fresh outbox Store whose tables no other harness uses; nil
	// skips the outbox checks. The suite calls Migrate itself.
	Outbox storage.OutboxStore
	// TxOptions are used for every inbox transaction (e.g. an isolation
	// level); nil for the database default.
	TxOptions *sql.TxOptions
	// Open, if set, opens another independent connection pool to the same
	// database, as a second process (or another relay) would. Checks of
	// concurrent migration and of several relays use it; without it they
	// share DB.
	Open func(ctx context.Context) (*gorm.DB, error)
	// Features describes what the Store does, for checks whose expectations
	// depend on it.
	Features Features
	// CheckTimeout bounds the check, from its setup to its end; zero means
	// 3 minutes.
	CheckTimeout time.Duration
	// Concurrency is how many deliveries the concurrency checks run at once;
	// zero means 16.
	Concurrency int
	// Close releases the harness; it may drop the stores' tables.
	Close func() error
}

// Features is plain data about a Store.
type Features struct {
	// ExpiryCountsRows is true if Maintain reports the exact number of rows
	// it removed (a batched DELETE); false if it may report -1 (a dropped
	// partition).
	ExpiryCountsRows bool
	// Watermarks is true if the Store must implement
	// storage.WatermarkStore: the watermark checks then fail on a Store
	// that does not (one hidden behind a wrapper, say), rather than being
	// skipped.
	Watermarks bool
	// Offsets is true if the Store must implement storage.OffsetStore: the
	// offsets checks then fail on a Store that does not, rather than being
	// skipped.
	Offsets bool
}

// HarnessMaker returns a fresh harness. It is called once per check.
type HarnessMaker func(ctx context.Context) (*Harness, error)

// Check is one named property of an inbox Store or, for an outbox check,
// of an outbox Store.
type Check struct {
	Area string
	Name string
	// What it proves, in one sentence.
	Doc string
	// Outbox checks run against the harness's Outbox, the others against
	// its Store.
	Outbox bool
	// Unmigrated checks start before the store's Migrate has run.
	Unmigrated bool
	// Sequenced outbox checks are about the optional storage.Sequenced
	// capability: they run only against an Outbox store that implements
	// it, and are skipped otherwise.
	Sequenced bool
	// Watermarks checks are about the optional storage.WatermarkStore
	// capability of the inbox Store: they run only against a Store that
	// implements it, and are skipped otherwise (unless
	// Features.Watermarks says it must). The suite migrates the watermark
	// table with the inbox table.
	Watermarks bool
	// Offsets checks are about the optional storage.OffsetStore capability
	// of the inbox Store: they run only against a Store that implements
	// it, and are skipped otherwise (unless Features.Offsets says it
	// must). The suite migrates an offsets table of its own, named
	// conformance_offsets_ and a random suffix, and drops it afterwards.
	Offsets bool
	Run     func(ctx context.Context, env *Env) error
}

// ID returns the stable name of the check: "area/name", and
// "outbox-area/name" for an outbox check.
func (c Check) ID() string {
	if c.Outbox {
		return "outbox-" + c.Area + "/" + c.Name
	}
	return c.Area + "/" + c.Name
}

// Checks returns every check in its fixed order: the inbox checks, then the
// outbox checks.
func Checks() []Check {
	return slices.Concat(schemaChecks, atomicityChecks, scopeChecks, idChecks, concurrencyChecks, batchChecks, retentionChecks,
		watermarkChecks, offsetChecks, outboxEnqueueChecks, outboxOrderChecks, outboxRelayChecks, outboxSequenceChecks, outboxExpiryChecks)
}

// ErrSkipped is wrapped by the error of RunCheck for a check of a store the
// harness does not have, or of a capability its store lacks.
var ErrSkipped = errors.New("skipped")

// Run runs every check as a subtest named by its ID, each with a fresh
// harness; a check of a store the harness does not have is skipped.
func Run(t *testing.T, newHarness HarnessMaker) {
	t.Helper()
	for _, c := range Checks() {
		t.Run(c.ID(), func(t *testing.T) {
			err := RunCheck(t.Context(), newHarness, c)
			if errors.Is(err, ErrSkipped) {
				t.Skip(err)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// RunCheck runs one check with a fresh harness and returns what the check
// found wrong, or nil; an error wrapping ErrSkipped if the harness does not
// have the store the check is about, or the store lacks the capability.
func RunCheck(ctx context.Context, newHarness HarnessMaker, c Check) (err error) {
	h, err := newHarness(ctx)
	if err != nil {
		return fmt.Errorf("%s: harness: %w", c.ID(), err)
	}
	h.CheckTimeout = cmp.Or(h.CheckTimeout, 3*time.Minute)
	h.Concurrency = cmp.Or(h.Concurrency, 16)
	ctx, cancel := context.WithTimeout(ctx, h.CheckTimeout)
	defer cancel()
	defer closeHarness(c.ID(), h.Close, &err)
	if err := c.runsOn(h); err != nil {
		return fmt.Errorf("%s: %w", c.ID(), err)
	}
	now := time.Now().UTC()
	env := &Env{H: h, Clock: &Clock{now: now}, Today: storage.DayOf(now), effects: "conformance_effects_" + randomHex(6),
		offsetsTable: "conformance_offsets_" + randomHex(6)}
	if err := h.DB.WithContext(ctx).Table(env.effects).Migrator().CreateTable(&effectRow{}); err != nil {
		return fmt.Errorf("%s: setup: create effects table %s: %w", c.ID(), env.effects, err)
	}
	defer func() { _ = h.DB.Migrator().DropTable(env.effects) }()
	if c.Offsets {
		defer func() { _ = h.DB.Migrator().DropTable(env.offsetsTable) }()
	}
	if !c.Unmigrated {
		if err := env.migrate(ctx, c); err != nil {
			return fmt.Errorf("%s: setup: migrate: %w", c.ID(), err)
		}
	}
	return runRecovered(c.ID(), func() error { return c.Run(ctx, env) })
}

// runsOn returns why c cannot run on h, or nil.
func (c Check) runsOn(h *Harness) error {
	switch {
	case h.DB == nil:
		return errors.New("setup: harness without DB")
	case h.Store == nil && h.Outbox == nil:
		return errors.New("setup: harness with neither Store nor Outbox")
	case c.Outbox && h.Outbox == nil:
		return fmt.Errorf("%w: the harness has no Outbox store", ErrSkipped)
	case !c.Outbox && h.Store == nil:
		return fmt.Errorf("%w: the harness has no inbox Store", ErrSkipped)
	case c.Sequenced && !isSequenced(h.Outbox):
		return fmt.Errorf("%w: the Outbox store does not implement storage.Sequenced (no source id and epoch: the relay stamps no sequence headers)", ErrSkipped)
	case c.Watermarks && !isWatermarkStore(h.Store) && h.Features.Watermarks:
		return fmt.Errorf("setup: the harness's Features say the Store implements storage.WatermarkStore; its type %T does not", h.Store)
	case c.Watermarks && !isWatermarkStore(h.Store):
		return fmt.Errorf("%w: the inbox Store does not implement storage.WatermarkStore (no sequenced dedup)", ErrSkipped)
	case c.Offsets && !isOffsetStore(h.Store) && h.Features.Offsets:
		return fmt.Errorf("setup: the harness's Features say the Store implements storage.OffsetStore; its type %T does not", h.Store)
	case c.Offsets && !isOffsetStore(h.Store):
		return fmt.Errorf("%w: the inbox Store does not implement storage.OffsetStore (no stored offsets)", ErrSkipped)
	}
	return nil
}

// migrate runs the Migrate of the store c is about (and, for a watermark
// check, MigrateWatermarks; for an offsets check, MigrateOffsets).
func (env *Env) migrate(ctx context.Context, c Check) error {
	if c.Outbox {
		return env.Outbox().Migrate(ctx)
	}
	if err := env.H.Store.Migrate(ctx, env.H.DB.WithContext(ctx)); err != nil {
		return err
	}
	if c.Watermarks {
		return env.watermarks().MigrateWatermarks(ctx, env.H.DB.WithContext(ctx))
	}
	if c.Offsets {
		return env.offsets().MigrateOffsets(ctx, env.H.DB.WithContext(ctx), env.offsetsTable)
	}
	return nil
}

// closeHarness closes a check's harness; the check's own error comes first.
func closeHarness(id string, closeFn func() error, err *error) {
	if closeFn == nil {
		return
	}
	if cerr := closeFn(); cerr != nil && *err == nil {
		*err = fmt.Errorf("%s: closing harness: %w", id, cerr)
	}
}

// runRecovered runs a check, turning its panic into its error.
func runRecovered(id string, run func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: panicked: %v", id, r)
		}
	}()
	if err := run(); err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	return nil
}

// Env is what a check works with: the harness, a controllable clock, and a
// scratch table of business effects whose rows are counted to tell how often
// an effect was applied. Its outbox methods (Outbox, OutboxOn, Relay) are for
// the outbox checks, the others for the inbox checks.
type Env struct {
	H     *Harness
	Clock *Clock
	// Today is the clock's day when the check started.
	Today time.Time

	effects      string
	offsetsTable string // the offsets checks'
}

// Retention and preparation windows the suite's inboxes use.
const (
	RetentionDays = 3
	PrepareDays   = 2
)

// effectRow is one application of a business effect. Label is a hash of the
// consumer and event id, so counting does not depend on the database's
// collation of the ids themselves.
type effectRow struct {
	ID    uint64 `gorm:"primaryKey;autoIncrement"`
	Label string `gorm:"size:64;not null;index"`
}

func label(consumer, id string) string {
	sum := sha256.Sum256([]byte(consumer + "\x00" + id))
	return hex.EncodeToString(sum[:])
}

// Inbox returns an inbox over the harness with the suite's windows and the
// env's clock; cfg adjusts it.
func (env *Env) Inbox(adjust ...func(*inbox.Config)) *inbox.Inbox {
	return env.InboxOn(env.H.DB, adjust...)
}

// InboxOn is Inbox over another connection pool to the harness database.
func (env *Env) InboxOn(db *gorm.DB, adjust ...func(*inbox.Config)) *inbox.Inbox {
	cfg := inbox.Config{
		RetentionDays: RetentionDays,
		PrepareDays:   PrepareDays,
		TxOptions:     env.H.TxOptions,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		MinBackoff:    time.Millisecond,
		MaxBackoff:    50 * time.Millisecond,
		MaxAttempts:   30,
		Now:           env.Clock.Now,
	}
	return built(cfg, adjust, func(cfg inbox.Config) (*inbox.Inbox, error) { return inbox.New(db, env.H.Store, cfg) })
}

// built applies adjust to cfg and makes the value cfg configures. The
// suite's own configurations are valid: an error is the suite's bug.
func built[C, T any](cfg C, adjust []func(*C), make func(C) (T, error)) T {
	for _, f := range adjust {
		f(&cfg)
	}
	v, err := make(cfg)
	if err != nil {
		panic(err)
	}
	return v
}

// Apply is the suite's business effect: it records one application of the
// message's effect through tx.
func (env *Env) Apply(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
	return tx.WithContext(ctx).Table(env.effects).Create(&effectRow{Label: label(msg.Consumer, msg.ID)}).Error
}

// Effects counts how often msg's effect was applied and committed.
func (env *Env) Effects(ctx context.Context, msg inbox.Message) (int64, error) {
	var n int64
	err := env.H.DB.WithContext(ctx).Table(env.effects).Where("label = ?", label(msg.Consumer, msg.ID)).Count(&n).Error
	return n, err
}

// TotalEffects counts all committed effects.
func (env *Env) TotalEffects(ctx context.Context) (int64, error) {
	var n int64
	err := env.H.DB.WithContext(ctx).Table(env.effects).Count(&n).Error
	return n, err
}

// Stored reports whether msg's inbox row is stored, by claiming it in a
// transaction that is always rolled back. A Store that keeps days in
// storage of their own ([storage.DayPreparer]) may have none for msg's day:
// then the row is not stored.
func (env *Env) Stored(ctx context.Context, msg inbox.Message) (bool, error) {
	var inserted []bool
	errRollback := errors.New("probe rolls back")
	err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		inserted, err = env.H.Store.Claim(ctx, tx, []storage.InboxRow{RowOf(msg)})
		if err != nil {
			return err
		}
		return errRollback
	}, env.H.TxOptions)
	if dp, ok := env.H.Store.(storage.DayPreparer); ok && err != nil && dp.IsMissingDay(err) {
		return false, nil // no storage for the row's day (expired, or never made): not stored
	}
	if !errors.Is(err, errRollback) {
		return false, fmt.Errorf("probing the inbox row of %q: %w", msg.ID, err)
	}
	if len(inserted) != 1 {
		return false, fmt.Errorf("probing the inbox row of %q: Claim answered %d values for 1 row", msg.ID, len(inserted))
	}
	return !inserted[0], nil
}

// Msg builds a message for the default consumer on the env's current day.
func (env *Env) Msg(id string) inbox.Message {
	return inbox.Message{Consumer: "conformance", ID: id, Time: env.Clock.Now()}
}

// MsgOn builds a message whose event time is at noon of today+days.
func (env *Env) MsgOn(id string, days int) inbox.Message {
	return inbox.Message{Consumer: "conformance", ID: id, Time: env.Today.AddDate(0, 0, days).Add(12 * time.Hour)}
}

// expect helpers: each returns an error describing the mismatch.

func (env *Env) expectEffects(ctx context.Context, msg inbox.Message, want int64) error {
	got, err := env.Effects(ctx, msg)
	if err != nil {
		return fmt.Errorf("counting effects: %w", err)
	}
	if got != want {
		return fmt.Errorf("event %q of %q: effect applied %d times, want %d", msg.ID, msg.Consumer, got, want)
	}
	return nil
}

func (env *Env) expectStored(ctx context.Context, msg inbox.Message, want bool) error {
	got, err := env.Stored(ctx, msg)
	if err != nil {
		return err
	}
	if got != want {
		if want {
			return fmt.Errorf("event %q of %q: inbox row missing", msg.ID, msg.Consumer)
		}
		return fmt.Errorf("event %q of %q: inbox row present, want none", msg.ID, msg.Consumer)
	}
	return nil
}

func expectOutcome(what string, got inbox.Outcome, err error, want inbox.Outcome) error {
	if err != nil {
		return fmt.Errorf("%s: unexpected error: %w", what, err)
	}
	if got != want {
		return fmt.Errorf("%s: outcome %v, want %v", what, got, want)
	}
	return nil
}

// Clock is a settable clock for the suite's inboxes.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AddDays moves the clock by n days.
func (c *Clock) AddDays(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.AddDate(0, 0, n)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RandomSuffix returns a random lower-case hex string, for harnesses that
// need unique table or schema names.
func RandomSuffix() string { return randomHex(6) }
