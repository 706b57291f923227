package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"
)

// The suite is only worth something if it fails on broken stores. Each store
// below breaks one promise of the Store contract on top of the healthy
// SQLite store; the test runs every check against it and requires the checks
// that guard that promise to fail.

// outsideTx claims through its own connection to a separate database, so the
// inbox row commits on its own, outside the caller's transaction.
type outsideTx struct {
	*inboxsqlite.Store
	own *gorm.DB
}

func (s outsideTx) Claim(ctx context.Context, _ *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	return s.Store.Claim(ctx, s.own, rows)
}

func (s outsideTx) Migrate(ctx context.Context, db *gorm.DB) error {
	if err := s.Store.Migrate(ctx, db); err != nil {
		return err
	}
	return s.Store.Migrate(ctx, s.own)
}

// beginEscapes opens its transactions itself (storage.ClaimBeginner,
// storage.WatermarkBeginner) and hands the handler one that offers
// BeginTx, on another database: a handler's Begin then opens a transaction
// that commits apart from the inbox row or the watermark.
type beginEscapes struct {
	*inboxsqlite.Store
	elsewhere *gorm.DB
}

// txOfferingBegin is a transaction that can begin another one.
type txOfferingBegin struct {
	*sql.Tx
	elsewhere *sql.DB
}

func (t *txOfferingBegin) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	return t.elsewhere.BeginTx(ctx, opts)
}

func (s beginEscapes) BeginClaim(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, rows []storage.InboxRow) (*gorm.DB, []bool, bool, error) {
	pool, err := db.DB()
	if err != nil {
		return nil, nil, false, err
	}
	elsewhere, err := s.elsewhere.DB()
	if err != nil {
		return nil, nil, false, err
	}
	sqlTx, err := pool.BeginTx(db.Statement.Context, opts)
	if err != nil {
		return nil, nil, false, err
	}
	// Without GORM's default transaction around Create, only the
	// handler's own Begin goes elsewhere.
	tx := db.Session(&gorm.Session{SkipDefaultTransaction: true})
	tx.Statement.ConnPool = &txOfferingBegin{sqlTx, elsewhere}
	inserted, err := s.Claim(ctx, tx, rows)
	if err != nil {
		_ = sqlTx.Rollback()
		return nil, nil, false, err
	}
	return tx, inserted, true, nil
}

func (s beginEscapes) BeginSaveWatermarks(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, writes []storage.WatermarkWrite) (*gorm.DB, bool, error) {
	tx, _, ok, err := s.BeginClaim(ctx, db, opts, nil)
	if err != nil || !ok {
		return nil, ok, err
	}
	if err := s.SaveWatermarks(ctx, tx, writes); err != nil {
		_ = tx.Rollback().Error
		return nil, false, err
	}
	return tx, true, nil
}

// duplicateAsNew stores rows but reports every row as new.
type duplicateAsNew struct{ *inboxsqlite.Store }

func (s duplicateAsNew) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	if _, err := s.Store.Claim(ctx, tx, rows); err != nil {
		return nil, err
	}
	all := make([]bool, len(rows))
	for i := range all {
		all[i] = true
	}
	return all, nil
}

// newAsDuplicate stores rows but reports every row as a duplicate, the way
// INSERT IGNORE reports a row it dropped for want of a partition.
type newAsDuplicate struct{ *inboxsqlite.Store }

// missingEverywhere takes every error for a missing table.
type missingEverywhere struct{ *inboxsqlite.Store }

func (missingEverywhere) IsMissingTable(err error) bool { return err != nil }

func (s newAsDuplicate) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	if _, err := s.Store.Claim(ctx, tx, rows); err != nil {
		return nil, err
	}
	return make([]bool, len(rows)), nil
}

// caseFolding compares ids case-insensitively and ignores trailing spaces,
// like MySQL's default collations.
type caseFolding struct{ *inboxsqlite.Store }

func (s caseFolding) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	folded := make([]storage.InboxRow, len(rows))
	for i, r := range rows {
		r.EventID = strings.TrimRight(strings.ToLower(r.EventID), " ")
		r.Consumer = strings.TrimRight(strings.ToLower(r.Consumer), " ")
		folded[i] = r
	}
	return claimDistinct(ctx, s.Store, tx, folded)
}

// truncating keeps only the first 191 bytes of an id, like an index prefix.
type truncating struct{ *inboxsqlite.Store }

func (s truncating) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	cut := make([]storage.InboxRow, len(rows))
	for i, r := range rows {
		if len(r.EventID) > 191 {
			r.EventID = r.EventID[:191]
		}
		cut[i] = r
	}
	return claimDistinct(ctx, s.Store, tx, cut)
}

// claimDistinct claims rows whose keys may now repeat, one at a time.
func claimDistinct(ctx context.Context, s storage.InboxStore, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	out := make([]bool, len(rows))
	for i, r := range rows {
		got, err := s.Claim(ctx, tx, []storage.InboxRow{r})
		if err != nil {
			return nil, err
		}
		out[i] = got[0]
	}
	return out, nil
}

// overExpiring removes every day, not just the expired ones.
type overExpiring struct{ *inboxsqlite.Store }

func (s overExpiring) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	plan.ExpireBefore = plan.PrepareThrough.AddDate(1, 0, 0)
	return s.Store.Maintain(ctx, db, plan)
}

// neverExpiring removes nothing.
type neverExpiring struct{ *inboxsqlite.Store }

func (s neverExpiring) Maintain(context.Context, *gorm.DB, storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	return storage.MaintenanceReport{}, nil
}

// openSQLite opens a new database file name in a directory of its own.
func openSQLite(t *testing.T, name string) *gorm.DB {
	t.Helper()
	return openSQLiteAt(t, filepath.Join(t.TempDir(), name))
}

// openSQLiteAt opens the database file at path, closed when t ends.
func openSQLiteAt(t *testing.T, path string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return db
}

func harnessWith(t *testing.T, wrap func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		db := openSQLite(t, "inbox.db")
		s, err := inboxsqlite.New(inboxsqlite.Options{})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{DB: db, Store: wrap(t, s), Features: conformance.Features{ExpiryCountsRows: true}}, nil
	}
}

func TestSuiteFailsBrokenStores(t *testing.T) {
	cases := []struct {
		name string
		wrap func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore
		// Checks that must catch this breakage.
		mustFail []string
	}{
		{"writes-outside-the-transaction",
			func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore {
				return outsideTx{s, openSQLite(t, "elsewhere.db")}
			},
			[]string{"atomicity/handler-error-rolls-back", "atomicity/handler-panic-rolls-back", "atomicity/cancelled-context-rolls-back",
				"atomicity/caller-rollback-removes-both", "schema/table-is-transactional", "batch/failing-message-is-isolated"}},
		{"lets-a-handler-begin-a-transaction",
			func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore {
				return beginEscapes{s, openSQLite(t, "elsewhere.db")}
			},
			[]string{"atomicity/begin-in-handler-is-refused", "watermark/begin-and-save"}},
		{"reports-duplicate-as-new",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return duplicateAsNew{s} },
			[]string{"atomicity/duplicate-skips-handler", "concurrency/concurrent-deliveries-of-one-id", "batch/duplicates-inside-batch-and-stored",
				"retention/redelivery-after-days-turn-and-maintenance", "schema/claim-answers-each-row"}},
		{"reports-new-as-duplicate",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return newAsDuplicate{s} },
			[]string{"atomicity/first-delivery-commits-row-and-effect", "scope/same-id-two-consumers", "schema/claim-answers-each-row"}},
		{"takes-every-error-for-a-missing-table",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return missingEverywhere{s} },
			[]string{"schema/missing-table-is-reported"}},
		{"folds-case-and-trailing-spaces",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return caseFolding{s} },
			[]string{"scope/case-and-trailing-spaces-are-distinct"}},
		{"truncates-long-ids",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return truncating{s} },
			[]string{"ids/maximum-length-ids"}},
		{"expires-live-days",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return overExpiring{s} },
			[]string{"retention/redelivery-after-days-turn-and-maintenance", "retention/maintain-removes-only-expired-days", "retention/future-dated-events"}},
		{"never-expires",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return neverExpiring{s} },
			[]string{"retention/maintain-removes-only-expired-days", "retention/maintain-while-inserting", "retention/maintain-dry-run-changes-nothing", "retention/maintain-concurrently"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireCaught(t, harnessWith(t, tc.wrap), tc.mustFail, tc.name)
		})
	}
}

// requireCaught runs every check against a broken store (newHarness gives
// it, fresh per check; the checks of the store it lacks are skipped) and
// fails t for each check of mustFail that passed it or did not run; what
// says how the store is broken.
func requireCaught(t *testing.T, newHarness conformance.HarnessMaker, mustFail []string, what string) {
	t.Helper()
	found := map[string]error{}
	for _, c := range conformance.Checks() {
		err := conformance.RunCheck(t.Context(), newHarness, c)
		found[c.ID()] = err
		if err != nil && !errors.Is(err, conformance.ErrSkipped) {
			t.Logf("caught: %v", err)
		}
	}
	for _, id := range mustFail {
		switch err := found[id]; {
		case err == nil:
			t.Errorf("check %s passed a store that %s", id, what)
		case errors.Is(err, conformance.ErrSkipped):
			t.Errorf("check %s did not run on a store that %s: %v", id, what, err)
		}
	}
}

func TestSuitePassesHealthyStore(t *testing.T) {
	conformance.Run(t, harnessWith(t, func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return s }))
}

func TestChecksHaveStableUniqueNames(t *testing.T) {
	seen := map[string]bool{}
	kinds := map[bool]int{} // checks by Outbox
	for _, c := range conformance.Checks() {
		if seen[c.ID()] {
			t.Errorf("duplicate check %s", c.ID())
		}
		seen[c.ID()] = true
		kinds[c.Outbox]++
		if c.Doc == "" || c.Run == nil {
			t.Errorf("check %s lacks Doc or Run", c.ID())
		}
		if c.Outbox != strings.HasPrefix(c.ID(), "outbox-") {
			t.Errorf("check %s: Outbox %v", c.ID(), c.Outbox)
		}
	}
	if kinds[false] < 25 || kinds[true] < 10 {
		t.Errorf("only %d inbox and %d outbox checks", kinds[false], kinds[true])
	}
}
