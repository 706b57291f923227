package inbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// errNoDay stands in for a database's "no partition for this row".
var errNoDay = errors.New("no storage for the row's day")

// dayStore is the SQLite store with days that must be prepared first: a
// claim of a row whose day is not prepared fails with errNoDay, as a
// partitioned table without the day's partition does.
type dayStore struct {
	*inboxsqlite.Store
	mu       sync.Mutex
	ready    map[time.Time]bool
	prepares [][]time.Time
	// forget, if set, makes PrepareDays useless (the day is removed again
	// at once, as by a concurrent Maintain).
	forget bool
}

func (s *dayStore) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	s.mu.Lock()
	for _, r := range rows {
		if !s.ready[r.Day] {
			s.mu.Unlock()
			return nil, errNoDay
		}
	}
	s.mu.Unlock()
	return s.Store.Claim(ctx, tx, rows)
}

func (s *dayStore) IsMissingDay(err error) bool { return errors.Is(err, errNoDay) }

func (s *dayStore) PrepareDays(_ context.Context, _ *gorm.DB, days []time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prepares = append(s.prepares, slices.Clone(days))
	for _, d := range days {
		s.ready[d] = !s.forget
	}
	return nil
}

func newDayInbox(t *testing.T) (*inbox.Inbox, *dayStore, *gorm.DB) {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "t.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	base, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := &dayStore{Store: base, ready: map[time.Time]bool{}}
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxAttempts: 1, MinBackoff: time.Millisecond, Expired: inbox.ProcessExpired})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return ib, store, db
}

// A claim that finds no storage for its day makes the day and runs again,
// in Process, ProcessBatch and ProcessTx alike, without counting an
// attempt (MaxAttempts is 1 here); the made days are those of the claim.
func TestMissingDaysAreMadeOnDemand(t *testing.T) {
	ctx := t.Context()
	ib, store, db := newDayInbox(t)
	far := time.Date(2031, 5, 6, 7, 0, 0, 0, time.UTC)
	if out, err := ib.Process(ctx, inbox.Message{Consumer: "c", ID: "p1", Time: far}, noop); err != nil || out != inbox.Processed {
		t.Fatalf("Process of a day without storage: %v %v", out, err)
	}
	if out, err := ib.Process(ctx, inbox.Message{Consumer: "c", ID: "p1", Time: far}, noop); err != nil || out != inbox.Duplicate {
		t.Fatalf("redelivery: %v %v", out, err)
	}
	batch := []inbox.Message{
		{Consumer: "c", ID: "b1", Time: far.AddDate(0, 0, 3)},
		{Consumer: "c", ID: "b2", Time: far.AddDate(0, 0, 1)},
		{Consumer: "c", ID: "p1", Time: far},
	}
	res, err := ib.ProcessBatch(ctx, batch, noop)
	if err != nil || res[0].Outcome != inbox.Processed || res[1].Outcome != inbox.Processed || res[2].Outcome != inbox.Duplicate {
		t.Fatalf("ProcessBatch: %+v, %v", res, err)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		out, err := ib.ProcessTx(ctx, tx, inbox.Message{Consumer: "c", ID: "t1", Time: far.AddDate(0, 0, 9)}, noop)
		if err == nil && out != inbox.Processed {
			err = errors.New(out.String())
		}
		return err
	})
	if err != nil {
		t.Fatalf("ProcessTx: %v", err)
	}
	d := func(n int) time.Time { return storage.DayOf(far).AddDate(0, 0, n) }
	want := [][]time.Time{{d(0)}, {d(0), d(1), d(3)}, {d(9)}}
	if !slices.EqualFunc(store.prepares, want, func(a, b []time.Time) bool { return slices.EqualFunc(a, b, time.Time.Equal) }) {
		t.Errorf("PrepareDays calls %v, want %v", store.prepares, want)
	}
}

// When making the day does not help (a concurrent Maintain removes it each
// time, or the database does not see it yet), the call stops making days
// after MaxDayPreparations and fails with the Store's error, retryable: the
// retry loop runs the claim again, without making days again.
func TestMissingDayPreparationIsBounded(t *testing.T) {
	ctx := t.Context()
	ib, store, db := newDayInbox(t)
	store.forget = true
	msg := inbox.Message{Consumer: "c", ID: "x", Time: time.Date(2031, 5, 6, 7, 0, 0, 0, time.UTC)}
	if out, err := ib.Process(ctx, msg, noop); out != inbox.Failed || !errors.Is(err, errNoDay) || !ib.IsRetryable(err) || !strings.Contains(err.Error(), "gave up after") {
		t.Errorf("Process: %v %v, want Failed with the store's error, retryable, retried until the attempts ran out", out, err)
	}
	if _, err := ib.ProcessBatch(ctx, []inbox.Message{msg}, noop); !errors.Is(err, errNoDay) || !ib.IsRetryable(err) {
		t.Errorf("ProcessBatch: %v, want the store's error, retryable", err)
	}
	err := db.Transaction(func(tx *gorm.DB) error {
		_, err := ib.ProcessTx(ctx, tx, msg, noop)
		return err
	})
	if !errors.Is(err, errNoDay) || !ib.IsRetryable(err) {
		t.Errorf("ProcessTx: %v, want the store's error, retryable", err)
	}
	if got, want := len(store.prepares), 3*storage.MaxDayPreparations; got != want {
		t.Errorf("%d PrepareDays calls, want %d (%d per call)", got, want, storage.MaxDayPreparations)
	}
}

// A handler's error is never taken for a missing day, even one the Store
// would classify so: only the inbox's own claim is.
func TestHandlerErrorIsNotAMissingDay(t *testing.T) {
	ctx := t.Context()
	ib, store, _ := newDayInbox(t)
	msg := inbox.Message{Consumer: "c", ID: "h", Time: time.Now()}
	store.ready[msg.Day()] = true
	out, err := ib.Process(ctx, msg, func(context.Context, *gorm.DB, inbox.Message) error { return errNoDay })
	if out != inbox.Failed || !errors.Is(err, errNoDay) || len(store.prepares) != 0 {
		t.Errorf("handler returning the store's missing-day error: %v %v, %d PrepareDays calls; want Failed and none", out, err, len(store.prepares))
	}
}

// An event further ahead than MaxFutureDays is invalid before any storage
// is made for its day: a payload cannot make partitions without bound, nor
// a claim that fails for ever.
func TestEventsBeyondMaxFutureDaysAreInvalid(t *testing.T) {
	ctx := t.Context()
	ib, store, _ := newDayInbox(t)
	today := storage.DayOf(time.Now())
	last := today.AddDate(0, 0, inbox.DefaultMaxFutureDays).Add(23 * time.Hour)
	beyond := inbox.Message{Consumer: "c", ID: "beyond", Time: last.Add(time.Hour)}
	if _, err := ib.Process(ctx, beyond, noop); !errors.Is(err, inbox.ErrInvalidMessage) {
		t.Fatalf("Process of an event a day past MaxFutureDays: %v, want ErrInvalidMessage", err)
	}
	res, err := ib.ProcessBatch(ctx, []inbox.Message{beyond}, noop)
	if err != nil || len(res) != 1 || !errors.Is(res[0].Err, inbox.ErrInvalidMessage) {
		t.Fatalf("ProcessBatch: %v %+v, want the message invalid", err, res)
	}
	if len(store.prepares) != 0 {
		t.Fatalf("storage made for invalid events' days: %v", store.prepares)
	}
	if out, err := ib.Process(ctx, inbox.Message{Consumer: "c", ID: "last", Time: last}, noop); out != inbox.Processed || err != nil {
		t.Fatalf("an event on the last allowed day: %v %v, want Processed", out, err)
	}
	if want := storage.DayOf(last); len(store.prepares) != 1 || !slices.Equal(store.prepares[0], []time.Time{want}) {
		t.Fatalf("storage made for %v, want the last allowed day %v alone", store.prepares, want)
	}
}
