package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

var errTransient = errors.New("transient")

// flakyStore fails the first failClaims claims with an error it classifies
// as retryable, then behaves like the SQLite store.
type flakyStore struct {
	*inboxsqlite.Store
	failClaims atomic.Int32
	claims     atomic.Int32
	answers    int // if > 0, Claim answers this many values (a broken store)
}

func (s *flakyStore) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	s.claims.Add(1)
	if s.failClaims.Add(-1) >= 0 {
		return nil, errTransient
	}
	got, err := s.Store.Claim(ctx, tx, rows)
	if s.answers > 0 {
		return make([]bool, s.answers), err
	}
	return got, err
}

func (s *flakyStore) IsRetryable(err error) bool {
	return errors.Is(err, errTransient) || s.Store.IsRetryable(err)
}

func newTestInbox(t *testing.T, cfg inbox.Config) (*inbox.Inbox, *flakyStore) {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "t.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	base, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := &flakyStore{Store: base}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = time.Millisecond
		cfg.MaxBackoff = 2 * time.Millisecond
	}
	ib, err := inbox.New(db, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return ib, store
}

func msg(id string) inbox.Message {
	return inbox.Message{Consumer: "unit", ID: id, Time: time.Now()}
}

func noop(context.Context, *gorm.DB, inbox.Message) error { return nil }

func TestValidate(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name string
		m    inbox.Message
		want string // substring of the error; "" for valid
	}{
		{"valid", inbox.Message{Consumer: "c", ID: "id", Time: now}, ""},
		{"max lengths", inbox.Message{Consumer: strings.Repeat("c", storage.MaxConsumerBytes), ID: strings.Repeat("i", storage.MaxEventIDBytes), Time: now}, ""},
		{"empty id", inbox.Message{Consumer: "c", Time: now}, "invalid event id: empty"},
		{"empty consumer", inbox.Message{ID: "x", Time: now}, "invalid consumer: empty"},
		{"long id", inbox.Message{Consumer: "c", ID: strings.Repeat("i", storage.MaxEventIDBytes+1), Time: now}, "longer than the 255 allowed"},
		{"long consumer", inbox.Message{Consumer: strings.Repeat("c", storage.MaxConsumerBytes+1), ID: "x", Time: now}, "longer than the 128 allowed"},
		{"bad utf8", inbox.Message{Consumer: "c", ID: "\xff", Time: now}, "not valid UTF-8"},
		{"nul", inbox.Message{Consumer: "c", ID: "a\x00b", Time: now}, "NUL"},
		{"no time", inbox.Message{Consumer: "c", ID: "x"}, "event time"},
		{"year 10000", inbox.Message{Consumer: "c", ID: "x", Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, "outside the years"},
		{"negative offset", inbox.Message{Consumer: "c", ID: "x", Time: now, Offset: -1}, "negative"},
		{"long topic", inbox.Message{Consumer: "c", ID: "x", Time: now, Topic: strings.Repeat("t", 256)}, "topic"},
		{"bad topic", inbox.Message{Consumer: "c", ID: "x", Time: now, Topic: "t\xff"}, "topic"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.m.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("valid message rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			var ve *inbox.ValidationError
			if !errors.Is(err, inbox.ErrInvalidMessage) || !errors.As(err, &ve) {
				t.Fatalf("error %v is not an *inbox.ValidationError wrapping ErrInvalidMessage", err)
			}
		})
	}
}

func TestDayIsUTC(t *testing.T) {
	// 01:30 on 2 March at UTC+14 is 11:30 on 1 March UTC.
	tm := time.Date(2026, 3, 2, 1, 30, 0, 0, time.FixedZone("+14", 14*3600))
	m := inbox.Message{Time: tm}
	if got, want := m.Day(), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC); !got.Equal(want) || got.Location() != time.UTC {
		t.Fatalf("Day() = %v, want %v", got, want)
	}
}

func TestValidateIdentifier(t *testing.T) {
	for _, ok := range []string{"inbox", "Inbox_2", "_x", strings.Repeat("a", 63)} {
		if err := storage.ValidateIdentifier("table", ok); err != nil {
			t.Errorf("%q rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1x", "a-b", "a b", "a;drop", `a"`, "ä", strings.Repeat("a", 64)} {
		err := storage.ValidateIdentifier("table", bad)
		if !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("%q: error %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]inbox.Config{
		"negative retention": {RetentionDays: -1},
		"unknown policy":     {Expired: inbox.ExpiredPolicy(7)},
		"negative attempts":  {MaxAttempts: -1},
	} {
		if _, err := inbox.New(&gorm.DB{}, &flakyStore{}, cfg); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("%s: error %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := inbox.New(nil, &flakyStore{}, inbox.Config{}); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Errorf("nil db: error %v", err)
	}
}

func TestRetriesTransientErrors(t *testing.T) {
	var retries atomic.Int32
	ib, store := newTestInbox(t, inbox.Config{Hooks: []hooks.Hook{hooks.EventFunc(func(e hooks.Event) {
		if e.Kind == hooks.Retry {
			retries.Add(1)
		}
	})}})
	store.failClaims.Store(2)
	out, err := ib.Process(t.Context(), msg("r1"), noop)
	if err != nil || out != inbox.Processed {
		t.Fatalf("Process = %v, %v", out, err)
	}
	if got := store.claims.Load(); got != 3 {
		t.Errorf("%d claims, want 3", got)
	}
	if c := ib.Counters(); c.Retries != 2 || c.Processed != 1 || retries.Load() != 2 {
		t.Errorf("counters %+v, retry events %d", c, retries.Load())
	}
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	ib, store := newTestInbox(t, inbox.Config{MaxAttempts: 3})
	store.failClaims.Store(100)
	out, err := ib.Process(t.Context(), msg("r2"), noop)
	if out != inbox.Failed || !errors.Is(err, errTransient) || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Fatalf("Process = %v, %v", out, err)
	}
	if got := store.claims.Load(); got != 3 {
		t.Errorf("%d claims, want 3", got)
	}
	if c := ib.Counters(); c.Failed != 1 {
		t.Errorf("counters %+v", c)
	}
}

func TestHandlerErrorsRetriedOnlyWhenMarked(t *testing.T) {
	ib, _ := newTestInbox(t, inbox.Config{})
	var calls int
	plain := errors.New("plain")
	out, err := ib.Process(t.Context(), msg("h1"), func(context.Context, *gorm.DB, inbox.Message) error {
		calls++
		return plain
	})
	if out != inbox.Failed || !errors.Is(err, plain) || calls != 1 {
		t.Fatalf("plain error: %v %v after %d calls", out, err, calls)
	}
	calls = 0
	out, err = ib.Process(t.Context(), msg("h2"), func(context.Context, *gorm.DB, inbox.Message) error {
		calls++
		if calls < 3 {
			return inbox.Retryable(errors.New("try again"))
		}
		return nil
	})
	if out != inbox.Processed || err != nil || calls != 3 {
		t.Fatalf("retryable error: %v %v after %d calls", out, err, calls)
	}
}

func TestCancelledContextStopsRetrying(t *testing.T) {
	ib, store := newTestInbox(t, inbox.Config{MinBackoff: time.Second, MaxBackoff: time.Second})
	store.failClaims.Store(100)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ib.Process(ctx, msg("c1"), noop)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("Process = %v after %v", err, time.Since(start))
	}
}

func TestStoreAnsweringWrongCountIsAnError(t *testing.T) {
	ib, store := newTestInbox(t, inbox.Config{})
	store.answers = 2
	ran := false
	_, err := ib.Process(t.Context(), msg("w1"), func(context.Context, *gorm.DB, inbox.Message) error {
		ran = true
		return nil
	})
	if err == nil || ran || !strings.Contains(err.Error(), "broke the Claim contract") {
		t.Fatalf("Process = %v, handler ran %v", err, ran)
	}
}

func TestPlanDates(t *testing.T) {
	now := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	ib, _ := newTestInbox(t, inbox.Config{RetentionDays: 10, PrepareDays: 3, Now: func() time.Time { return now }})
	p := ib.Plan()
	day := func(m time.Month, d int) time.Time { return time.Date(2026, m, d, 0, 0, 0, 0, time.UTC) }
	if !p.Today.Equal(day(11, 30)) || !p.PrepareThrough.Equal(day(12, 3)) || !p.ExpireBefore.Equal(day(11, 19)) {
		t.Fatalf("plan %+v", p)
	}
	// The oldest checked day is the day after ExpireBefore: its events are
	// processed, those of the day before are expired.
	if out, err := ib.Process(t.Context(), inbox.Message{Consumer: "c", ID: "oldest", Time: day(11, 20)}, noop); out != inbox.Processed || err != nil {
		t.Fatalf("an event of the oldest checked day: %v %v, want Processed", out, err)
	}
	var ee *inbox.ExpiredError
	if _, err := ib.Process(t.Context(), inbox.Message{Consumer: "c", ID: "older", Time: day(11, 20).Add(-time.Nanosecond)}, noop); !errors.As(err, &ee) || !ee.Oldest.Equal(day(11, 20)) {
		t.Fatalf("an event of the day before the oldest checked day: %v, want expired with oldest checked day %v", err, day(11, 20))
	}
}

func TestBatchRecordsEveryMessage(t *testing.T) {
	ib, _ := newTestInbox(t, inbox.Config{})
	res, err := ib.ProcessBatch(t.Context(), []inbox.Message{msg("b1"), msg("b1"), msg(""), msg("b2")}, noop)
	if err != nil {
		t.Fatal(err)
	}
	want := []inbox.Outcome{inbox.Processed, inbox.Duplicate, inbox.Failed, inbox.Processed}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("result %d: %v (%v), want %v", i, r.Outcome, r.Err, want[i])
		}
	}
	if c := ib.Counters(); c.Processed != 2 || c.Duplicates != 1 || c.Failed != 1 {
		t.Errorf("counters %+v", c)
	}
}

func TestBatchTransientFailureOfWholeBatch(t *testing.T) {
	ib, store := newTestInbox(t, inbox.Config{MaxAttempts: 2})
	store.failClaims.Store(100)
	res, err := ib.ProcessBatch(t.Context(), []inbox.Message{msg("t1"), msg("t2")}, noop)
	if !errors.Is(err, errTransient) {
		t.Fatalf("batch error %v", err)
	}
	for i, r := range res {
		if r.Outcome != inbox.Failed || !errors.Is(r.Err, errTransient) {
			t.Errorf("result %d: %v %v", i, r.Outcome, r.Err)
		}
	}
}

func TestMaintainPlanRefusesExpiringCheckedDays(t *testing.T) {
	ib, _ := newTestInbox(t, inbox.Config{RetentionDays: 5})
	plan := ib.Plan()
	oldest := plan.ExpireBefore.AddDate(0, 0, 1) // Plan keeps a day of grace
	plan.ExpireBefore = oldest.AddDate(0, 0, 1)
	if _, err := ib.MaintainPlan(t.Context(), plan); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Fatalf("MaintainPlan = %v, want ErrInvalidConfig", err)
	}
	plan.ExpireBefore = oldest
	if _, err := ib.MaintainPlan(t.Context(), plan); err != nil {
		t.Fatalf("plan expiring up to the oldest checked day: %v", err)
	}
}

// The transactions Process opens keep GORM's DefaultTransactionTimeout: a
// handler still working when it ends cannot commit.
func TestProcessKeepsDefaultTransactionTimeout(t *testing.T) {
	ib, store := newTestInbox(t, inbox.Config{MaxAttempts: 1})
	// The timeout is GORM's configuration: set before New, as gorm.Open's.
	timed := ib.DB().Session(&gorm.Session{})
	timed.DefaultTransactionTimeout = 50 * time.Millisecond
	tib, err := inbox.New(timed, store, inbox.Config{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	out, err := tib.Process(t.Context(), msg("slow"), func(ctx context.Context, tx *gorm.DB, _ inbox.Message) error {
		time.Sleep(200 * time.Millisecond)
		return tx.Exec("SELECT 1").Error
	})
	if out != inbox.Failed || err == nil {
		t.Fatalf("a handler past the transaction timeout: %v %v, want Failed", out, err)
	}
	if out, err := ib.Process(t.Context(), msg("slow"), noop); out != inbox.Processed || err != nil {
		t.Fatalf("after the timed-out attempt: %v %v, want Processed (nothing committed)", out, err)
	}
}

// TestCancelledProcessEndsItsTransaction: a delivery whose context is
// cancelled before COMMIT has rolled its transaction back by the time
// Process returns. database/sql would otherwise roll it back from a
// goroutine of its own, and the next writer without a busy timeout (here a
// BEGIN IMMEDIATE on another pool) would find the database still locked.
func TestCancelledProcessEndsItsTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	db, err := gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer closeGorm(db)
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	other, err := gorm.Open(gormsqlite.Open("file:"+path+"?_busy_timeout=0"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer closeGorm(other)
	sqlOther, err := other.DB()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		ctx, cancel := context.WithCancel(t.Context())
		out, err := ib.Process(ctx, msg(fmt.Sprintf("cancel-%d", i)), func(context.Context, *gorm.DB, inbox.Message) error {
			cancel()
			return nil
		})
		cancel()
		if out != inbox.Failed || !errors.Is(err, context.Canceled) {
			t.Fatalf("delivery %d cancelled before COMMIT: %v %v", i, out, err)
		}
		conn, err := sqlOther.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.ExecContext(t.Context(), "BEGIN IMMEDIATE")
		if err == nil {
			_, err = conn.ExecContext(t.Context(), "ROLLBACK")
		}
		_ = conn.Close()
		if err != nil {
			t.Fatalf("delivery %d: Process returned, but its transaction still holds the database: %v", i, err)
		}
	}
}

func closeGorm(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		_ = s.Close()
	}
}

// A hook that implements no hook interface would do nothing: New refuses
// it; a consumer.ContextHook alone is a hook (the same hooks go to the
// consumer).
func TestNewRefusesNonHooks(t *testing.T) {
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "t.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []hooks.Hook{"not a hook", 42, func(hooks.Event) {}} {
		_, err := inbox.New(db, &flakyStore{}, inbox.Config{Hooks: []hooks.Hook{h}})
		if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), fmt.Sprintf("inbox.Config.Hooks[0] is a %T", h)) {
			t.Errorf("%#v: New = %v, want ErrInvalidConfig naming the hook", h, err)
		}
	}
	ctxHook := consumer.ContextFunc(func(ctx context.Context, _ *consumer.Message) context.Context { return ctx })
	if _, err := inbox.New(db, &flakyStore{}, inbox.Config{Hooks: []hooks.Hook{ctxHook}}); err != nil {
		t.Fatal(err)
	}
}

// A 10,000-byte event id is logged shortened, as its error text shows it.
func TestLongEventIDIsLoggedShortened(t *testing.T) {
	var logs strings.Builder
	ib, _ := newTestInbox(t, inbox.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	long := strings.Repeat("x", 10000)
	if out, err := ib.Process(t.Context(), msg(long), noop); out != inbox.Failed || !errors.Is(err, inbox.ErrInvalidMessage) {
		t.Fatalf("Process = %v, %v; want Failed, ErrInvalidMessage", out, err)
	}
	line := logs.String()
	if !strings.Contains(line, "event_id="+strings.Repeat("x", 64)+"...") || len(line) > 1000 {
		t.Errorf("log of %d bytes: %.500s", len(line), line)
	}
}

// A cancelled context is what the error says, once, on one line: not a
// database failure.
func TestCancelledContextIsNotCalledADatabaseFailure(t *testing.T) {
	var logs strings.Builder
	ib, _ := newTestInbox(t, inbox.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, end := range []func() (context.Context, context.CancelFunc){
		func() (context.Context, context.CancelFunc) { return context.WithCancel(t.Context()) },
		func() (context.Context, context.CancelFunc) { return context.WithDeadline(t.Context(), time.Now()) },
	} {
		ctx, cancel := end()
		cancel()
		out, err := ib.Process(ctx, msg("cancelled"), noop)
		if out != inbox.Failed || !errors.Is(err, ctx.Err()) {
			t.Fatalf("Process = %v, %v; want Failed, %v", out, err, ctx.Err())
		}
		text := err.Error()
		if strings.Contains(text, "database failure") || strings.Contains(text, "\n") || strings.Count(text, ctx.Err().Error()) != 1 {
			t.Errorf("error %q: want one line naming %q once, and no database failure", text, ctx.Err())
		}
	}
	if strings.Contains(logs.String(), "database failure") || strings.Count(logs.String(), "\n") != 2 {
		t.Errorf("logs:\n%s", logs.String())
	}
}

// stmtRecorder is an application's GORM logger that records each
// statement.
type stmtRecorder struct {
	logger.Interface
	mu    sync.Mutex
	stmts []string
}

func (r *stmtRecorder) LogMode(logger.LogLevel) logger.Interface { return r }
func (r *stmtRecorder) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	r.mu.Lock()
	r.stmts = append(r.stmts, sql)
	r.mu.Unlock()
}

// Process and ProcessTx run their own statements (the claim, the
// savepoint, the migration) past the application's GORM logger; the
// handler's statements reach it, also inside the caller's transaction.
func TestOwnStatementsBypassTheApplicationsGORMLogger(t *testing.T) {
	rec := &stmtRecorder{Interface: logger.Discard}
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "t.db")), &gorm.Config{Logger: rec})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		return tx.Exec("SELECT 'handler " + m.ID + "'").Error
	}
	if _, err := ib.Process(t.Context(), msg("a"), handler); err != nil {
		t.Fatal(err)
	}
	if err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT 'caller'").Error; err != nil {
			return err
		}
		_, err := ib.ProcessTx(t.Context(), tx, msg("b"), handler)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if want := []string{"SELECT 'handler a'", "SELECT 'caller'", "SELECT 'handler b'"}; !slices.Equal(rec.stmts, want) {
		t.Errorf("the application's logger got %q, want %q", rec.stmts, want)
	}
}

// An application that calls Process before Migrate (or after its table was
// dropped) gets an error naming the call that makes the table, not only
// the database's "no such table".
func TestProcessWithoutTheTableNamesMigrate(t *testing.T) {
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "fresh.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ib.Process(context.Background(), inbox.Message{Consumer: "c", ID: "e1", Time: time.Now()},
		func(context.Context, *gorm.DB, inbox.Message) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "the inbox table does not exist: run Inbox.Migrate") || !store.IsMissingTable(err) {
		t.Fatalf("Process before Migrate: %v, want the missing table and Inbox.Migrate", err)
	}
	t.Log(err)
}
