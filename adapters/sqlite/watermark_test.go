package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"
)

// The watermark checks are only worth something if they fail on broken
// stores. Each store below breaks one promise of storage.WatermarkStore on
// top of the healthy SQLite store, and the checks that guard that promise
// must fail on it.

// watermarkTable is the healthy store's watermark table.
func watermarkTable(s *inboxsqlite.Store) string { return s.Table() + inboxsqlite.WatermarkSuffix }

// upsert writes New whatever the stream holds, as an INSERT ... ON
// CONFLICT DO UPDATE (or MySQL's ON DUPLICATE KEY UPDATE) does.
type upsert struct{ *inboxsqlite.Store }

func (s upsert) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	for _, w := range writes {
		err := tx.WithContext(ctx).Exec(`INSERT INTO `+watermarkTable(s.Store)+` (scope, source, epoch, topic, partition_no, applied) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (scope, topic, partition_no, source, epoch) DO UPDATE SET applied = excluded.applied`,
			w.Scope, w.Source, w.Epoch, w.Topic, w.Partition, w.New).Error
		if err != nil {
			return err
		}
	}
	return nil
}

// movedIsNil runs the real statements but takes no affected-row count for
// a failure: a write whose stream moved does nothing and says nothing.
type movedIsNil struct{ *inboxsqlite.Store }

func (s movedIsNil) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	for _, w := range writes {
		if err := s.Store.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{w}); err != nil && !errors.Is(err, storage.ErrWatermarkMoved) {
			return err
		}
	}
	return nil
}

// truncating keeps the first 255 bytes of a value, as a VARBINARY(255) or
// TINYBLOB column under a lax sql_mode does.
type truncating struct{ *inboxsqlite.Store }

func (s truncating) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	cut := func(v []byte) []byte {
		if len(v) > 255 {
			return v[:255]
		}
		return v
	}
	short := make([]storage.WatermarkWrite, len(writes))
	for i, w := range writes {
		short[i] = storage.WatermarkWrite{WatermarkKey: w.WatermarkKey, Old: cut(w.Old), New: cut(w.New)}
	}
	return s.Store.SaveWatermarks(ctx, tx, short)
}

// folding compares names case-insensitively and ignores trailing spaces,
// like MySQL's default collations.
type folding struct{ *inboxsqlite.Store }

func fold(v string) string { return strings.TrimRight(strings.ToLower(v), " ") }

func (s folding) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	for _, w := range writes {
		w.Scope, w.Topic, w.Source = fold(w.Scope), fold(w.Topic), fold(w.Source)
		if err := s.Store.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{w}); err != nil {
			return err
		}
	}
	return nil
}

func (s folding) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	return s.Store.Watermarks(ctx, db, fold(scope), fold(topic), partition)
}

// emptyAsNil returns an empty value as nil, which says "no row".
type emptyAsNil struct{ *inboxsqlite.Store }

func (s emptyAsNil) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	rows, err := s.Store.Watermarks(ctx, db, scope, topic, partition)
	for i := range rows {
		if len(rows[i].Applied) == 0 {
			rows[i].Applied = nil
		}
	}
	return rows, err
}

// elsewhere keeps its watermarks in a database of its own, each write
// committed on its own, outside the caller's transaction.
type elsewhere struct {
	*inboxsqlite.Store
	own *gorm.DB
}

func (s elsewhere) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	if err := s.Store.MigrateWatermarks(ctx, db); err != nil {
		return err
	}
	return s.Store.MigrateWatermarks(ctx, s.own)
}

func (s elsewhere) SaveWatermarks(ctx context.Context, _ *gorm.DB, writes []storage.WatermarkWrite) error {
	return s.own.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return s.Store.SaveWatermarks(ctx, tx, writes) })
}

func (s elsewhere) Watermarks(ctx context.Context, _ *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	return s.Store.Watermarks(ctx, s.own, scope, topic, partition)
}

// unchecked writes with the right compare-and-set but checks nothing
// first: what the database takes is stored, the rest fails with its
// errors.
type unchecked struct{ *inboxsqlite.Store }

func (s unchecked) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	t := watermarkTable(s.Store)
	for _, w := range writes {
		res := tx.WithContext(ctx).Exec(`UPDATE `+t+` SET applied = ? WHERE scope = ? AND topic = ? AND partition_no = ? AND source = ? AND epoch = ? AND applied = ?`,
			w.New, w.Scope, w.Topic, w.Partition, w.Source, w.Epoch, w.Old)
		if w.Old == nil {
			res = tx.WithContext(ctx).Exec(`INSERT INTO `+t+` (scope, source, epoch, topic, partition_no, applied) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
				w.Scope, w.Source, w.Epoch, w.Topic, w.Partition, w.New)
		}
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != 1 {
			return storage.ErrWatermarkMoved
		}
	}
	return nil
}

// recreating drops the watermark table on every migration.
type recreating struct{ *inboxsqlite.Store }

func (s recreating) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	if err := db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS ` + watermarkTable(s.Store)).Error; err != nil {
		return err
	}
	return s.Store.MigrateWatermarks(ctx, db)
}

// unfiltered ignores the topic and partition it is asked for.
type unfiltered struct{ *inboxsqlite.Store }

func (s unfiltered) Watermarks(ctx context.Context, db *gorm.DB, scope, _ string, _ int32) ([]storage.WatermarkRow, error) {
	return s.Store.Watermarks(ctx, db, scope, "", -1)
}

// literalPartition takes a negative partition for a partition number,
// which no row has.
type literalPartition struct{ *inboxsqlite.Store }

func (s literalPartition) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	rows, err := s.Store.Watermarks(ctx, db, scope, topic, partition)
	if partition < 0 {
		return nil, err
	}
	return rows, err
}

// permanent calls no failure transient: a member that lost a lock
// conflict would give up, or report the stream moved.
type permanent struct{ *inboxsqlite.Store }

func (permanent) IsRetryable(error) bool { return false }

// hidden is the healthy store behind a wrapper that hides its optional
// capabilities, as a third party's logging wrapper would.
type hidden struct{ storage.InboxStore }

// watermarkHarness gives every check a database file of its own with the
// healthy store wrapped by wrap; required sets Features.Watermarks.
func watermarkHarness(t *testing.T, wrap func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore, required bool) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		path := filepath.Join(t.TempDir(), "inbox.db")
		open := func(context.Context) (*gorm.DB, error) {
			return gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
		}
		db, err := open(ctx)
		if err != nil {
			return nil, err
		}
		store, err := inboxsqlite.New(inboxsqlite.Options{})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{
			DB: db, Store: wrap(t, store), Open: open,
			Features: conformance.Features{ExpiryCountsRows: true, Watermarks: required},
			Close:    func() error { return closePool(db) },
		}, nil
	}
}

func closePool(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// watermarkChecks are the suite's checks of storage.WatermarkStore.
func watermarkChecks(t *testing.T) []conformance.Check {
	var out []conformance.Check
	for _, c := range conformance.Checks() {
		if c.Watermarks {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		t.Fatal("the suite has no watermark checks")
	}
	return out
}

func TestWatermarkChecksFailBrokenStores(t *testing.T) {
	cases := []struct {
		name string
		wrap func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore
		// Checks that must catch this breakage.
		mustFail []string
	}{
		{"ignores-the-old-value",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return upsert{s} },
			[]string{"watermark/compare-and-set", "watermark/second-member-waits", "watermark/racing-members"}},
		{"reports-a-moved-stream-as-written",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return movedIsNil{s} },
			[]string{"watermark/compare-and-set", "watermark/second-member-waits", "watermark/racing-members"}},
		{"truncates-values",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return truncating{s} },
			[]string{"watermark/round-trip"}},
		{"folds-case-and-trailing-spaces",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return folding{s} },
			[]string{"watermark/round-trip", "watermark/filters"}},
		{"returns-empty-values-as-nil",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return emptyAsNil{s} },
			[]string{"watermark/round-trip", "watermark/compare-and-set"}},
		{"writes-outside-the-transaction",
			func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore {
				own, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "elsewhere.db")), &gorm.Config{Logger: logger.Discard})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = closePool(own) })
				return elsewhere{s, own}
			},
			[]string{"watermark/atomic-with-effect", "watermark/second-member-waits"}},
		{"checks-nothing-before-writing",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return unchecked{s} },
			[]string{"watermark/rejects-invalid-writes"}},
		{"drops-the-table-on-migrate",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return recreating{s} },
			[]string{"watermark/migrate-concurrently"}},
		{"ignores-the-filters",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return unfiltered{s} },
			[]string{"watermark/filters"}},
		{"calls-lock-conflicts-permanent",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return permanent{s} },
			[]string{"watermark/crossed-writes"}},
		{"takes-a-negative-partition-literally",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return literalPartition{s} },
			[]string{"watermark/round-trip", "watermark/filters"}},
	}
	checks := map[string]conformance.Check{}
	for _, c := range watermarkChecks(t) {
		checks[c.ID()] = c
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, id := range tc.mustFail {
				c, ok := checks[id]
				if !ok {
					t.Errorf("no check %s", id)
					continue
				}
				err := conformance.RunCheck(t.Context(), watermarkHarness(t, tc.wrap, true), c)
				switch {
				case err == nil:
					t.Errorf("check %s passed a store that %s", id, tc.name)
				case errors.Is(err, conformance.ErrSkipped):
					t.Errorf("check %s did not run on a store that %s: %v", id, tc.name, err)
				default:
					t.Logf("caught: %v", err)
				}
			}
		})
	}
}

// A Store without the capability skips the watermark checks, saying why;
// one whose harness says it must have it fails them.
func TestWatermarkChecksWithoutTheCapability(t *testing.T) {
	wrap := func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return hidden{s} }
	for _, c := range watermarkChecks(t) {
		err := conformance.RunCheck(t.Context(), watermarkHarness(t, wrap, false), c)
		if !errors.Is(err, conformance.ErrSkipped) {
			t.Errorf("check %s on a store without storage.WatermarkStore: %v, want it skipped", c.ID(), err)
		}
		err = conformance.RunCheck(t.Context(), watermarkHarness(t, wrap, true), c)
		if err == nil || errors.Is(err, conformance.ErrSkipped) {
			t.Errorf("check %s on a store without storage.WatermarkStore whose harness requires it: %v, want it failed", c.ID(), err)
		}
	}
}

// A table name too long for its watermark table is refused by the
// watermark methods alone, before any statement.
func TestWatermarkTableNameTooLong(t *testing.T) {
	store, err := inboxsqlite.New(inboxsqlite.Options{Table: strings.Repeat("t", 63-len(inboxsqlite.WatermarkSuffix)+1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := conformance.CheckNoWatermarkTable(t.Context(), store); err != nil {
		t.Error(err)
	}
}

// A member that waits for the write lock longer than its busy timeout
// fails with SQLITE_BUSY, which IsRetryable reports: never "moved".
func TestWatermarkBusyIsRetryable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closePool(db) })
	// Deferred transactions and a short busy timeout: the write itself
	// waits for the lock, and gives up soon.
	impatient, err := gorm.Open(gormsqlite.Open("file:"+path+"?_busy_timeout=50"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closePool(impatient) })
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := store.MigrateWatermarks(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := conformance.CheckWatermarkLockWait(ctx, store, db, impatient, nil); err != nil {
		t.Fatal(err)
	}
}

// MigrateWatermarks and Verify refuse a watermark table of another layout,
// naming the table and what they found, and leave it as it is; Verify
// takes the table MigrateWatermarks makes, and no table at all (sequenced
// dedup not in use).
func TestWatermarkLayoutRefused(t *testing.T) {
	const good = `scope TEXT NOT NULL, source TEXT NOT NULL, epoch INTEGER NOT NULL, topic TEXT NOT NULL, partition_no INTEGER NOT NULL,
		applied BLOB NOT NULL, updated_at TEXT NOT NULL`
	const key = `PRIMARY KEY (scope, topic, partition_no, source, epoch)`
	cases := map[string]struct{ ddl, says string }{
		"not STRICT":              {`(` + good + `, ` + key + `)`, "not STRICT"},
		"values as TEXT":          {`(` + strings.Replace(good, "applied BLOB", "applied TEXT", 1) + `, ` + key + `) STRICT`, "column applied is TEXT, want BLOB"},
		"a nullable value":        {`(` + strings.Replace(good, "applied BLOB NOT NULL", "applied BLOB", 1) + `, ` + key + `) STRICT`, "column applied is nullable"},
		"a key without the epoch": {`(` + good + `, PRIMARY KEY (scope, topic, partition_no, source)) STRICT`, "column epoch is at place 0 of the primary key, want 5"},
		"no primary key":          {`(` + good + `) STRICT`, "column scope is at place 0 of the primary key, want 1"},
		"the key in another order": {`(` + good + `, PRIMARY KEY (scope, source, epoch, topic, partition_no)) STRICT`,
			"column topic is at place 4 of the primary key, want 2"},
		"names folded":         {`(` + strings.Replace(good, "scope TEXT NOT NULL", "scope TEXT NOT NULL COLLATE NOCASE", 1) + `, ` + key + `) STRICT`, "collation NOCASE"},
		"no updated_at column": {`(` + strings.Replace(good, ", updated_at TEXT NOT NULL", "", 1) + `, ` + key + `) STRICT`, "no column updated_at"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			db, store := verifiable(t)
			table := watermarkTable(store)
			if err := db.Exec(`CREATE TABLE ` + table + ` ` + c.ddl).Error; err != nil {
				t.Fatal(err)
			}
			definition := func() (ddl string) {
				if err := db.Raw(`SELECT sql FROM sqlite_schema WHERE name = ?`, table).Scan(&ddl).Error; err != nil {
					t.Fatal(err)
				}
				return ddl
			}
			before := definition()
			for what, err := range map[string]error{
				"MigrateWatermarks": store.MigrateWatermarks(t.Context(), db),
				"Verify":            store.Verify(t.Context(), db),
			} {
				if err == nil || !strings.Contains(err.Error(), table) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("%s on a table with %s: %v, want an error naming %s that says %q", what, name, err, table, c.says)
				}
			}
			if after := definition(); after != before {
				t.Errorf("the table was changed from\n%s\nto\n%s", before, after)
			}
		})
	}
	t.Run("absent, then migrated", func(t *testing.T) {
		db, store := verifiable(t)
		if err := store.Verify(t.Context(), db); err != nil {
			t.Fatalf("Verify without a watermark table: %v", err)
		}
		if err := store.MigrateWatermarks(t.Context(), db); err != nil {
			t.Fatal(err)
		}
		if err := store.Verify(t.Context(), db); err != nil {
			t.Fatalf("Verify of the table MigrateWatermarks made: %v", err)
		}
	})
}

// verifiable is a database Verify finds safe, with the inbox table of the
// store it returns.
func verifiable(t *testing.T) (*gorm.DB, *inboxsqlite.Store) {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "inbox.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closePool(db) })
	store, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db, store
}
