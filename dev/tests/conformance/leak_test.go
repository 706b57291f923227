package conformance_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"
)

// A check that fails early must not leave anything it started running: the
// suite drops the tables next, and a writer, relay or delivery still at
// work would hold the database (on SQLite, its only write lock) for
// whatever runs after. These tests break a store so that a check fails
// while its goroutines are still busy, and look, once the check returned,
// for any goroutine still running code of the conformance package.

// checkGoroutines returns the stacks of the goroutines, other than the
// caller's, that are running code of the conformance package.
func checkGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// The first stack is the caller's own, inside the suite's RunCheck.
	stacks := strings.Split(string(buf), "\n\n")[1:]
	var out []string
	for _, g := range stacks {
		if strings.Contains(g, "github.com/inboxgo/inbox/conformance.") {
			out = append(out, g)
		}
	}
	return out
}

// leakProbe records the check's goroutines still running when the suite,
// the check having returned, drops the check's effects table: the first
// thing it does after the check, and one that a leaked writer or delivery
// holding the database would delay until the leak ended by itself. A
// goroutine that is merely exiting (past its WaitGroup's Done) gets a
// moment; the breakages below keep a leaked one busy for far longer.
type leakProbe struct {
	mu    sync.Mutex
	fired bool
	left  []string
}

// attach makes db, the harness's database, probe before it drops the
// effects table.
func (p *leakProbe) attach(t *testing.T, db *gorm.DB) *gorm.DB {
	t.Helper()
	err := db.Callback().Raw().Before("gorm:raw").Register("leakprobe", func(tx *gorm.DB) {
		sql := tx.Statement.SQL.String()
		if !strings.HasPrefix(sql, "DROP TABLE") || !strings.Contains(sql, "conformance_effects_") {
			return
		}
		p.probe()
	})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func (p *leakProbe) probe() {
	deadline := time.Now().Add(100 * time.Millisecond)
	left := checkGoroutines()
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		left = checkGoroutines()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fired {
		p.fired, p.left = true, left
	}
}

func (p *leakProbe) expectNone(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("the broken store passed the check: the check did not fail early, so this test proves nothing")
	}
	t.Logf("caught: %v", err)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fired {
		t.Fatal("the suite never dropped the check's effects table")
	}
	if len(p.left) > 0 {
		t.Errorf("%d goroutine(s) of the check still running after it returned:\n%s", len(p.left), strings.Join(p.left, "\n\n"))
	}
}

func findCheck(t *testing.T, id string) conformance.Check {
	t.Helper()
	for _, c := range conformance.Checks() {
		if c.ID() == id {
			return c
		}
	}
	t.Fatalf("no check %s", id)
	return conformance.Check{}
}

func leakOutboxHarness(t *testing.T, p *leakProbe, wrap func(s *inboxsqlite.OutboxStore) storage.OutboxStore) conformance.HarnessMaker {
	return func(context.Context) (*conformance.Harness, error) {
		path := filepath.Join(t.TempDir(), "outbox.db")
		s, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{DB: p.attach(t, openSQLiteAt(t, path)), Outbox: wrap(s),
			Open: func(context.Context) (*gorm.DB, error) { return openSQLiteAt(t, path), nil }}, nil
	}
}

// slowRefusingRelay appends slowly, so that writers are still at work, and
// refuses every claim, so that the first relay cycle fails the check.
type slowRefusingRelay struct{ *inboxsqlite.OutboxStore }

var errClaimRefused = errors.New("claim refused on purpose")

func (s slowRefusingRelay) Append(ctx context.Context, tx *gorm.DB, rows []storage.OutboxRow) error {
	time.Sleep(20 * time.Millisecond)
	return s.OutboxStore.Append(ctx, tx, rows)
}

func (s slowRefusingRelay) Claim(context.Context, *gorm.DB, storage.ClaimRequest) ([]storage.OutboxRow, error) {
	return nil, errClaimRefused
}

func (s slowRefusingRelay) ClaimSource(context.Context, *gorm.DB, storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	return nil, "", 0, errClaimRefused
}

// refusingSlowClaim refuses every message, so that the writers fail the
// check as soon as they are done, and claims slowly, ignoring the context as
// a stuck driver would, so that the relays are still at work then.
type refusingSlowClaim struct{ *inboxsqlite.OutboxStore }

var errAppendRefused = errors.New("append refused on purpose")

func (s refusingSlowClaim) Append(context.Context, *gorm.DB, []storage.OutboxRow) error {
	return errAppendRefused
}

func (s refusingSlowClaim) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	time.Sleep(300 * time.Millisecond)
	return s.OutboxStore.Claim(ctx, db, req)
}

func (s refusingSlowClaim) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	time.Sleep(300 * time.Millisecond)
	return s.OutboxStore.ClaimSource(ctx, db, req)
}

// phantomRow hands out a row of key gap that no transaction committed, and
// acknowledges slowly: the relay cycle publishes it while T1 is open, which
// fails the commit-gap check while T2 waits for T1 and the cycle is still
// acknowledging.
type phantomRow struct{ *inboxsqlite.OutboxStore }

func (s phantomRow) Claim(context.Context, *gorm.DB, storage.ClaimRequest) ([]storage.OutboxRow, error) {
	return []storage.OutboxRow{{Shard: 0, Seq: 1, Day: storage.DayOf(time.Now()), EventID: "phantom", Topic: "orders", Key: []byte("gap"), Value: []byte("phantom"), Headers: []byte("[]")}}, nil
}

func (s phantomRow) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	rows, _ := s.Claim(ctx, db, req)
	id, epoch, err := s.Source(ctx, db)
	return rows, id, epoch, err
}

func (s phantomRow) Ack(context.Context, *gorm.DB, string, []storage.Mark) error {
	time.Sleep(time.Second) // a slow database that does not heed the context
	return nil
}

func TestOutboxChecksFailingEarlyLeaveNothingRunning(t *testing.T) {
	cases := []struct {
		check string
		wrap  func(s *inboxsqlite.OutboxStore) storage.OutboxStore
	}{
		{"outbox-order/per-key", func(s *inboxsqlite.OutboxStore) storage.OutboxStore { return slowRefusingRelay{s} }},
		{"outbox-order/commit-gap", func(s *inboxsqlite.OutboxStore) storage.OutboxStore { return phantomRow{s} }},
		{"outbox-relay/several-relays", func(s *inboxsqlite.OutboxStore) storage.OutboxStore { return refusingSlowClaim{s} }},
	}
	for _, tc := range cases {
		t.Run(tc.check, func(t *testing.T) {
			p := &leakProbe{}
			err := conformance.RunCheck(t.Context(), leakOutboxHarness(t, p, tc.wrap), findCheck(t, tc.check))
			p.expectNone(t, err)
		})
	}
}

// stalledFirstClaim stalls the first claim, ignoring the context as a stuck
// driver would, after cancelling the check's context: the check returns at
// once, while its first delivery is still inside the claim.
type stalledFirstClaim struct {
	*inboxsqlite.Store
	cancel context.CancelFunc
	calls  *atomic.Int32
}

func (s stalledFirstClaim) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	if s.calls.Add(1) == 1 {
		s.cancel()
		time.Sleep(time.Second)
	}
	return s.Store.Claim(ctx, tx, rows)
}

func TestInboxCheckFailingEarlyLeavesNothingRunning(t *testing.T) {
	p := &leakProbe{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	harness := func(context.Context) (*conformance.Harness, error) {
		s, err := inboxsqlite.New(inboxsqlite.Options{})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{DB: p.attach(t, openSQLite(t, "inbox.db")), Store: stalledFirstClaim{s, cancel, new(atomic.Int32)},
			Features: conformance.Features{ExpiryCountsRows: true}}, nil
	}
	err := conformance.RunCheck(ctx, harness, findCheck(t, "concurrency/concurrent-deliveries-first-rolls-back"))
	p.expectNone(t, err)
}
