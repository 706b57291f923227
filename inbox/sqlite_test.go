package inbox

// The inbox on a real database without a server: SQLite in a temporary
// file (internal/sqlitetest), effects in a table of their own.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/internal/sqlitetest"
	"github.com/inboxgo/inbox/storage"
)

type env struct {
	t     *testing.T
	db    *gorm.DB
	store *sqlitetest.Store
	ib    *Inbox
	logs  *bytes.Buffer

	mu     sync.Mutex
	events []hooks.Event
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	e := &env{t: t, db: sqlitetest.Open(t), store: &sqlitetest.Store{}, logs: &bytes.Buffer{}}
	cfg.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Hooks = append(cfg.Hooks, hooks.EventFunc(func(ev hooks.Event) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.events = append(e.events, ev)
	}))
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 2*time.Millisecond
	}
	ib, err := New(e.db, e.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.store.MigrateWatermarks(context.Background(), e.db); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Exec(`CREATE TABLE effects (id TEXT NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	e.ib = ib
	return e
}

func (e *env) effects() []string {
	e.t.Helper()
	var ids []string
	if err := e.db.Raw(`SELECT id FROM effects ORDER BY rowid`).Scan(&ids).Error; err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func (e *env) count(k hooks.Kind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.events {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

func msg(id string) Message {
	return Message{Consumer: "billing", ID: id, Time: time.Now(), Topic: "orders", Offset: 1}
}

func applyMsg(ctx context.Context, tx *gorm.DB, m Message) error {
	return tx.Exec(`INSERT INTO effects (id) VALUES (?)`, m.ID).Error
}

func applyBatch(ctx context.Context, tx *gorm.DB, ms []Message) error {
	for _, m := range ms {
		if err := applyMsg(ctx, tx, m); err != nil {
			return err
		}
	}
	return nil
}

var errBoom = errors.New("boom")

// An event's effect commits once; a second delivery is a duplicate.
func TestProcessOnce(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	for i, want := range []Outcome{Processed, Duplicate} {
		o, err := e.ib.Process(ctx, msg("a"), applyMsg)
		if err != nil || o != want {
			t.Fatalf("delivery %d: %v, %v; want %v", i+1, o, err, want)
		}
	}
	if got := e.effects(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("effects %q", got)
	}
	if c := e.ib.Counters(); c.Processed != 1 || c.Duplicates != 1 {
		t.Errorf("counters %+v", c)
	}
	if e.count(hooks.Processed) != 1 || e.count(hooks.Duplicate) != 1 {
		t.Errorf("events: %d processed, %d duplicates", e.count(hooks.Processed), e.count(hooks.Duplicate))
	}
	if Processed.String() != "processed" || Outcome(9).String() != "Outcome(9)" {
		t.Error("Outcome.String")
	}
}

// ProcessTx runs in the caller's transaction: if the caller rolls back,
// the inbox row goes with the effect, and the event is new again.
func TestProcessTxRollsBackWithTheCaller(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	err := e.db.Transaction(func(tx *gorm.DB) error {
		o, err := e.ib.ProcessTx(ctx, tx, msg("a"), applyMsg)
		if err != nil || o != Processed {
			t.Fatalf("%v, %v", o, err)
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	if n := sqlitetest.Count(t, e.db, "inbox_messages", ""); n != 0 {
		t.Fatalf("%d inbox rows after the rollback", n)
	}
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		o, err := e.ib.ProcessTx(ctx, tx, msg("a"), applyMsg)
		if o != Processed {
			t.Errorf("after the rollback: %v, want processed", o)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := e.effects(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("effects %q", got)
	}
}

// Invalid and expired messages are refused before any transaction.
func TestProcessRefusesInvalidAndExpired(t *testing.T) {
	e := newEnv(t, Config{RetentionDays: 10, MaxFutureDays: 5})
	ctx := context.Background()
	bad := msg("")
	if _, err := e.ib.Process(ctx, bad, applyMsg); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("an empty id: %v", err)
	}
	var ve *ValidationError
	if _, err := e.ib.Process(ctx, bad, applyMsg); !errors.As(err, &ve) || ve.Error() == "" {
		t.Errorf("an empty id: %v, want a *ValidationError", err)
	}
	old := msg("old")
	old.Time = time.Now().AddDate(0, 0, -20)
	var ee *ExpiredError
	if _, err := e.ib.Process(ctx, old, applyMsg); !errors.Is(err, ErrExpired) || !errors.As(err, &ee) || ee.Error() == "" {
		t.Errorf("an expired message: %v", err)
	}
	future := msg("future")
	future.Time = time.Now().AddDate(0, 0, 30)
	if _, err := e.ib.Process(ctx, future, applyMsg); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("a message too far in the future: %v", err)
	}
	if n := len(e.effects()); n != 0 {
		t.Errorf("%d effects", n)
	}
	// ProcessExpired takes the expired message, once.
	e2 := newEnv(t, Config{RetentionDays: 10, Expired: ProcessExpired})
	if o, err := e2.ib.Process(ctx, old, applyMsg); err != nil || o != Processed {
		t.Errorf("ProcessExpired: %v, %v", o, err)
	}
}

// A handler error marked Retryable is retried up to MaxAttempts; any other,
// a permanent one and a panic are returned at once; nothing of a failed
// attempt commits.
func TestProcessHandlerFailures(t *testing.T) {
	e := newEnv(t, Config{MaxAttempts: 3})
	ctx := context.Background()
	var calls atomic.Int32
	failing := func(err error) Handler {
		return func(ctx context.Context, tx *gorm.DB, m Message) error {
			calls.Add(1)
			if err := applyMsg(ctx, tx, m); err != nil {
				return err
			}
			return err
		}
	}
	o, err := e.ib.Process(ctx, msg("a"), failing(errBoom))
	if o != Failed || !errors.Is(err, errBoom) || calls.Load() != 1 {
		t.Errorf("%v, %v after %d calls; want failed after 1", o, err, calls.Load())
	}
	calls.Store(0)
	if _, err := e.ib.Process(ctx, msg("b"), failing(Permanent(errBoom))); !IsPermanent(err) || calls.Load() != 1 {
		t.Errorf("a permanent error: %v after %d calls", err, calls.Load())
	}
	calls.Store(0)
	if _, err := e.ib.Process(ctx, msg("c"), failing(Retryable(errBoom))); !errors.Is(err, errBoom) || calls.Load() != 3 {
		t.Errorf("a retryable error: %v after %d calls", err, calls.Load())
	}
	var pe *PanicError
	_, err = e.ib.Process(ctx, msg("d"), func(ctx context.Context, tx *gorm.DB, m Message) error { panic("bug") })
	if !errors.As(err, &pe) || !errors.Is(err, ErrHandlerPanic) || pe.Value != "bug" || len(pe.Stack) == 0 {
		t.Errorf("a panic: %v", err)
	}
	if n := len(e.effects()); n != 0 {
		t.Errorf("%d effects of failed attempts committed", n)
	}
	if n := sqlitetest.Count(t, e.db, "inbox_messages", ""); n != 0 {
		t.Errorf("%d inbox rows of failed messages", n)
	}
	if c := e.ib.Counters(); c.Failed != 4 {
		t.Errorf("counters %+v, want 4 failed", c)
	}
	// Succeeding later, the message is processed.
	if o, err := e.ib.Process(ctx, msg("a"), applyMsg); o != Processed || err != nil {
		t.Errorf("%v, %v", o, err)
	}
}

// A batch commits its new messages, reports the copies of an event (in the
// batch or in the table) as duplicates, and isolates a failing message.
func TestProcessBatch(t *testing.T) {
	e := newEnv(t, Config{MaxAttempts: 2})
	ctx := context.Background()
	if _, err := e.ib.Process(ctx, msg("seen"), applyMsg); err != nil {
		t.Fatal(err)
	}
	msgs := []Message{msg("a"), msg("seen"), msg("bad"), msg("a"), msg("b"), {Consumer: "billing"}}
	h := func(ctx context.Context, tx *gorm.DB, m Message) error {
		if m.ID == "bad" {
			return errBoom
		}
		return applyMsg(ctx, tx, m)
	}
	rs, err := e.ib.ProcessBatch(ctx, msgs, h)
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{Processed, Duplicate, Failed, Duplicate, Processed, Failed}
	for i, r := range rs {
		if r.Outcome != want[i] {
			t.Errorf("message %d (%q): %v (%v), want %v", i, msgs[i].ID, r.Outcome, r.Err, want[i])
		}
	}
	if !errors.Is(rs[2].Err, errBoom) || !errors.Is(rs[5].Err, ErrInvalidMessage) {
		t.Errorf("errors %v, %v", rs[2].Err, rs[5].Err)
	}
	if got := e.effects(); !slices.Equal(got, []string{"seen", "a", "b"}) {
		t.Errorf("effects %q", got)
	}
	if _, err := e.ib.ProcessBatch(ctx, msgs, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no handler: %v", err)
	}
}

// A batch handler gets the new messages in one transaction; when it fails
// and no message can be blamed, the batch is split until the failing one
// is found, and the others commit.
func TestProcessBatchFunc(t *testing.T) {
	e := newEnv(t, Config{MaxAttempts: 1})
	ctx := context.Background()
	var sizes []int
	bh := func(ctx context.Context, tx *gorm.DB, ms []Message) error {
		sizes = append(sizes, len(ms))
		for _, m := range ms {
			if m.ID == "bad" {
				return errBoom
			}
		}
		return applyBatch(ctx, tx, ms)
	}
	msgs := []Message{msg("a"), msg("b"), msg("c"), msg("bad"), msg("d")}
	rs, err := e.ib.ProcessBatchFunc(ctx, msgs, bh)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if (r.Outcome == Failed) != (msgs[i].ID == "bad") {
			t.Errorf("%q: %v %v", msgs[i].ID, r.Outcome, r.Err)
		}
	}
	if got := e.effects(); len(got) != 4 || slices.Contains(got, "bad") {
		t.Errorf("effects %q", got)
	}
	if sizes[0] != 5 || !strings.Contains(e.logs.String(), "splitting it") {
		t.Errorf("calls of sizes %v; the split is not logged", sizes)
	}
	rs, err = e.ib.ProcessBatchFunc(ctx, msgs[:3], bh)
	if err != nil || rs[0].Outcome != Duplicate {
		t.Errorf("again: %v %v", rs, err)
	}
	if _, err := e.ib.ProcessBatchFunc(ctx, msgs, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no handler: %v", err)
	}
}

// The options a consumer hands the batch: each message's context, a write
// before COMMIT that sees the outcomes (and rolls everything back when it
// fails), the consumer's own retries.
func TestProcessBatchOptions(t *testing.T) {
	e := newEnv(t, Config{MaxAttempts: 5})
	type key struct{}
	var seen []Outcome
	opts := &batchopt.Options[Outcome]{
		BeforeCommit: func(ctx context.Context, tx *gorm.DB, outcomes []Outcome) error {
			seen = slices.Clone(outcomes)
			return tx.Exec(`INSERT INTO effects (id) VALUES ('before-commit')`).Error
		},
		CallerRetries:         true,
		CallerReportsOutcomes: true,
		Bound:                 time.Second,
	}
	batch := []Message{msg("a"), msg("bad"), msg("b")}
	for _, m := range batch {
		opts.Contexts = append(opts.Contexts, context.WithValue(t.Context(), key{}, m.ID))
	}
	var calls atomic.Int32
	h := func(ctx context.Context, tx *gorm.DB, m Message) error {
		if id, _ := ctx.Value(key{}).(string); id != m.ID {
			return fmt.Errorf("message %q ran under the context given for %q", m.ID, id)
		}
		if m.ID == "bad" {
			calls.Add(1)
			return errBoom
		}
		return applyMsg(ctx, tx, m)
	}
	rs, err := runWith(e.ib, opts, batch, h)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Outcome != Processed || rs[1].Outcome != Failed || rs[2].Outcome != Processed {
		t.Errorf("results %+v", rs)
	}
	if calls.Load() != 1 {
		t.Errorf("the failing message ran %d times; the caller owns the retries", calls.Load())
	}
	if len(seen) != 3 || seen[0] != Processed {
		t.Errorf("BeforeCommit saw %v", seen)
	}
	if got := e.effects(); !slices.Contains(got, "before-commit") {
		t.Errorf("effects %q: the BeforeCommit write did not commit", got)
	}

	// A failing BeforeCommit rolls the transaction back.
	opts.BeforeCommit = func(ctx context.Context, tx *gorm.DB, outcomes []Outcome) error { return errBoom }
	opts.Contexts = []context.Context{context.WithValue(t.Context(), key{}, "c")}
	rs, err = runWith(e.ib, opts, []Message{msg("c")}, h)
	if (err == nil && rs[0].Outcome != Failed) || slices.Contains(e.effects(), "c") {
		t.Errorf("a failing BeforeCommit: %+v, %v; effects %q", rs, err, e.effects())
	}
}

// Messages of a sequenced stream: the marks say which are applied already
// (duplicates without a row), and the watermark writes commit with the
// batch; a failed message holds back the later ones of its stream.
func TestProcessBatchSequenced(t *testing.T) {
	e := newEnv(t, Config{MaxAttempts: 1})
	key := storage.WatermarkKey{Scope: "billing", Source: "orders-outbox", Epoch: 1, Topic: "orders", Partition: 0}
	var old []byte
	writes := func(n byte) func(group []int, committed []Outcome) []storage.WatermarkWrite {
		return func(group []int, committed []Outcome) []storage.WatermarkWrite {
			return []storage.WatermarkWrite{{WatermarkKey: key, Old: old, New: []byte{n}}}
		}
	}
	opts := &batchopt.Options[Outcome]{
		Seq:        []batchopt.SeqMark{{Chain: 1}, {Chain: 1, Applied: true}, {Chain: 1}, {}},
		Watermarks: writes(1),
	}
	msgs := []Message{msg("s1"), msg("s0"), msg("s2"), msg("plain")}
	rs, err := runWith(e.ib, opts, msgs, applyMsg)
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{Processed, Duplicate, Processed, Processed}
	for i, r := range rs {
		if r.Outcome != want[i] {
			t.Errorf("%q: %v %v, want %v", msgs[i].ID, r.Outcome, r.Err, want[i])
		}
	}
	if n := sqlitetest.Count(t, e.db, "inbox_messages", ""); n != 1 {
		t.Errorf("%d inbox rows, want only the unsequenced message's", n)
	}
	rows, err := e.store.Watermarks(context.Background(), e.db, "billing", "orders", 0)
	if err != nil || len(rows) != 1 || !bytes.Equal(rows[0].Applied, []byte{1}) {
		t.Fatalf("watermark rows %+v, %v", rows, err)
	}
	old = []byte{1}

	// s3 fails: s4, later in its stream, is held back; the other stream goes on.
	opts = &batchopt.Options[Outcome]{
		Seq:        []batchopt.SeqMark{{Chain: 1}, {Chain: 1}, {Chain: 2}},
		Watermarks: writes(2),
	}
	h := func(ctx context.Context, tx *gorm.DB, m Message) error {
		if m.ID == "s3" {
			return errBoom
		}
		return applyMsg(ctx, tx, m)
	}
	rs, err = runWith(e.ib, opts, []Message{msg("s3"), msg("s4"), msg("t1")}, h)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Outcome != Failed || !errors.Is(rs[1].Err, batchopt.ErrHeldBack) || rs[2].Outcome != Processed {
		t.Errorf("results %+v", rs)
	}

	// A watermark that moved since it was read fails the batch, rolled back.
	opts = &batchopt.Options[Outcome]{Seq: []batchopt.SeqMark{{Chain: 1}}, Watermarks: writes(9)}
	old = []byte{7}
	rs, err = runWith(e.ib, opts, []Message{msg("s5")}, applyMsg)
	if !errors.Is(err, storage.ErrWatermarkMoved) && (len(rs) == 0 || !errors.Is(rs[0].Err, storage.ErrWatermarkMoved)) {
		t.Errorf("a moved watermark: %+v, %v", rs, err)
	}
	if slices.Contains(e.effects(), "s5") {
		t.Error("the batch under a moved watermark committed")
	}
	opts = &batchopt.Options[Outcome]{Seq: []batchopt.SeqMark{{}}}
	if _, err := runWith(e.ib, opts, msgs, applyMsg); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("marks that do not match the messages: %v", err)
	}
}

// Maintenance removes the expired days' rows, and reports what it did or,
// dry, would do.
func TestMaintain(t *testing.T) {
	e := newEnv(t, Config{RetentionDays: 10})
	ctx := context.Background()
	old := msg("old")
	old.Time = time.Now().AddDate(0, 0, -20)
	row := old.row()
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		_, err := e.store.Claim(ctx, tx, []storage.InboxRow{row})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ib.Process(ctx, msg("new"), applyMsg); err != nil {
		t.Fatal(err)
	}
	plan := e.ib.Plan()
	if !plan.ExpireBefore.After(row.Day) || plan.PrepareThrough.Before(time.Now()) {
		t.Errorf("plan %+v", plan)
	}
	plan.DryRun = true
	report, err := e.ib.MaintainPlan(ctx, plan)
	if err != nil || report.RowsRemoved != 1 || sqlitetest.Count(t, e.db, "inbox_messages", "") != 2 {
		t.Errorf("dry run: %+v, %v", report, err)
	}
	report, err = e.ib.Maintain(ctx)
	if err != nil || report.RowsRemoved != 1 || len(report.Expired) != 1 {
		t.Errorf("maintain: %+v, %v", report, err)
	}
	if n := sqlitetest.Count(t, e.db, "inbox_messages", ""); n != 1 {
		t.Errorf("%d rows left, want 1", n)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := e.ib.RunMaintenance(cctx, 10*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("RunMaintenance returned %v", err)
	}
}

// The tracers see each message, its claim and its handler call.
func TestTracers(t *testing.T) {
	var mu sync.Mutex
	var trace []string
	add := func(s string) { mu.Lock(); trace = append(trace, s); mu.Unlock() }
	f := &hooks.Funcs{
		Message: func(ctx context.Context, row storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
			add("message " + row.EventID)
			return ctx, func(k hooks.Kind, err error) { add("end " + row.EventID + " " + k.String()) }
		},
		Claim: func(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
			add("claim")
			return ctx, func([]bool, error) {}
		},
		Handler: func(ctx context.Context, rows []storage.InboxRow) (context.Context, func(error)) {
			add("handler")
			return ctx, func(error) {}
		},
	}
	e := newEnv(t, Config{Hooks: []hooks.Hook{f}})
	ctx := context.Background()
	if _, err := e.ib.ProcessBatch(ctx, []Message{msg("a"), msg("b")}, applyMsg); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ib.Process(ctx, msg("a"), applyMsg); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	got := strings.Join(trace, "|")
	for _, want := range []string{"message a", "claim", "handler", "end a processed", "end b processed", "end a duplicate"} {
		if !strings.Contains(got, want) {
			t.Errorf("trace %q lacks %q", got, want)
		}
	}
}

// New refuses what it cannot work with.
func TestNewRefuses(t *testing.T) {
	db := sqlitetest.Open(t)
	store := &sqlitetest.Store{}
	for name, cfg := range map[string]Config{
		"negative retention": {RetentionDays: -1},
		"not a hook":         {Hooks: []hooks.Hook{42}},
	} {
		if _, err := New(db, store, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(nil, store, Config{}); err == nil {
		t.Error("no database: no error")
	}
	if _, err := New(db, nil, Config{}); err == nil {
		t.Error("no store: no error")
	}
	ib, err := New(db, store, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ib.Store() != store || ib.DB() != db || ib.IsRetryable(errBoom) {
		t.Error("Store, DB or IsRetryable")
	}
}

// runWith runs msgs through ib's batch engine with opts, as the consumer
// does.
func runWith(ib *Inbox, opts *batchopt.Options[Outcome], msgs []Message, h Handler) ([]Result, error) {
	run := batchopt.Lookup[*Inbox, Message, Handler, BatchHandler, Result, Outcome]()
	return run(context.Background(), ib, msgs, h, nil, *opts)
}
