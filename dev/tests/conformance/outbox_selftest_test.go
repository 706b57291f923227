package conformance_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"
)

// The outbox checks against broken outbox stores: each breaks one promise
// of the storage.OutboxStore contract on top of the healthy SQLite store.

// sharedLeases ignores which relay asks: every relay claims and acknowledges
// as the same one, so two relays publish the same shards at once.
type sharedLeases struct{ *inboxsqlite.OutboxStore }

func (s sharedLeases) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	req.Relay = "everyone"
	return s.OutboxStore.Claim(ctx, db, req)
}

func (s sharedLeases) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	req.Relay = "everyone"
	return s.OutboxStore.ClaimSource(ctx, db, req)
}

func (s sharedLeases) Ack(ctx context.Context, db *gorm.DB, _ string, marks []storage.Mark) error {
	return s.OutboxStore.Ack(ctx, db, "everyone", marks)
}

// expiresUnpublished deletes expired days whether or not their rows were
// published, the way a plain "DROP PARTITION older than N days" does.
type expiresUnpublished struct {
	*inboxsqlite.OutboxStore
}

func (s expiresUnpublished) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	if err := db.WithContext(ctx).Exec(`DELETE FROM `+s.Table()+` WHERE day < ?`, plan.ExpireBefore.Format("2006-01-02")).Error; err != nil {
		return storage.MaintenanceReport{}, err
	}
	return s.OutboxStore.Maintain(ctx, db, plan)
}

// newestFirst hands out each shard's rows newest first, as a relay ordering
// by anything but the shard's commit order would.
type newestFirst struct{ *inboxsqlite.OutboxStore }

func (s newestFirst) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	rows, err := s.OutboxStore.Claim(ctx, db, req)
	slices.Reverse(rows)
	return rows, err
}

func (s newestFirst) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	rows, id, epoch, err := s.OutboxStore.ClaimSource(ctx, db, req)
	slices.Reverse(rows)
	return rows, id, epoch, err
}

// appendsElsewhere stores messages through its own connection to another
// database: they commit on their own, without the caller's transaction.
type appendsElsewhere struct {
	*inboxsqlite.OutboxStore
	own *gorm.DB
}

func (s appendsElsewhere) Append(ctx context.Context, _ *gorm.DB, rows []storage.OutboxRow) error {
	return s.own.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return s.OutboxStore.Append(ctx, tx, rows) })
}

func (s appendsElsewhere) Migrate(ctx context.Context, db *gorm.DB) error {
	if err := s.OutboxStore.Migrate(ctx, db); err != nil {
		return err
	}
	return s.OutboxStore.Migrate(ctx, s.own)
}

// newSourceEachMigrate makes a new source id on every Migrate, as a store
// that writes the id with an upsert rather than only when there is none.
type newSourceEachMigrate struct{ *inboxsqlite.OutboxStore }

func (s newSourceEachMigrate) Migrate(ctx context.Context, db *gorm.DB) error {
	if err := s.OutboxStore.Migrate(ctx, db); err != nil {
		return err
	}
	return db.WithContext(ctx).Exec(`UPDATE `+s.Table()+`_source SET source = ?`, storage.NewSourceID()).Error
}

// bumpForgets answers BumpEpoch with the next epoch but stores nothing.
type bumpForgets struct{ *inboxsqlite.OutboxStore }

func (s bumpForgets) BumpEpoch(ctx context.Context, db *gorm.DB) (int64, error) {
	_, epoch, err := s.Source(ctx, db)
	return epoch + 1, err
}

// sourcePerCall answers every Source call with a new id, as a store that
// makes the id in memory instead of keeping it in the database.
type sourcePerCall struct{ *inboxsqlite.OutboxStore }

func (s sourcePerCall) Source(ctx context.Context, db *gorm.DB) (string, int64, error) {
	_, epoch, err := s.OutboxStore.Source(ctx, db)
	return storage.NewSourceID(), epoch, err
}

func (s sourcePerCall) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	rows, _, epoch, err := s.OutboxStore.ClaimSource(ctx, db, req)
	return rows, storage.NewSourceID(), epoch, err
}

// offsetOnEveryAck stores each acknowledgement's offset whether or not it
// moved the mark, as a store that writes the offset unconditionally: a
// repeated acknowledgement would then move where the relay's check of the
// partition starts past messages it must read.
type offsetOnEveryAck struct{ *inboxsqlite.OutboxStore }

func (s offsetOnEveryAck) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	if err := s.OutboxStore.Ack(ctx, db, relay, marks); err != nil {
		return err
	}
	for _, m := range marks {
		if err := db.WithContext(ctx).Exec(`UPDATE `+s.Table()+`_shards SET published_offset = ? WHERE shard = ? AND owner = ?`, m.Offset, m.Shard, relay).Error; err != nil {
			return err
		}
	}
	return nil
}

// claimThenSource is the healthy store with a storage.SourceClaimer of
// its own: the claim, then the source read after it.
type claimThenSource struct{ *inboxsqlite.OutboxStore }

func (s claimThenSource) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	rows, err := s.Claim(ctx, db, req)
	if err != nil {
		return nil, "", 0, err
	}
	id, epoch, err := s.Source(ctx, db)
	return rows, id, epoch, err
}

// sourceReadOnce claims with the source and epoch it read on its first
// call, as a store that caches them: a relay would stamp a bumped epoch's
// rows with the old one.
type sourceReadOnce struct {
	*inboxsqlite.OutboxStore
	first *firstSource
}

// firstSource is the source and epoch a sourceReadOnce read first; the
// suite's relays claim from several goroutines at once.
type firstSource struct {
	mu    sync.Mutex
	id    string
	epoch int64
}

func (s sourceReadOnce) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	s.first.mu.Lock()
	if s.first.id == "" {
		var err error
		if s.first.id, s.first.epoch, err = s.Source(ctx, db); err != nil {
			s.first.mu.Unlock()
			return nil, "", 0, err
		}
	}
	id, epoch := s.first.id, s.first.epoch
	s.first.mu.Unlock()
	rows, err := s.Claim(ctx, db, req)
	return rows, id, epoch, err
}

// claimSourceIgnoresMaxRows reads every unpublished row of a leased shard,
// as a store whose claim with the source forgot the second read a shard
// that holds more than the claim takes needs.
type claimSourceIgnoresMaxRows struct{ claimThenSource }

func (s claimSourceIgnoresMaxRows) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	req.MaxRows = 1 << 20
	return s.claimThenSource.ClaimSource(ctx, db, req)
}

// unsequenced is the healthy store without the storage.Sequenced
// capability, as a third party's store written before it.
type unsequenced struct{ storage.OutboxStore }

func outboxHarnessWith(t *testing.T, wrap func(t *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore) conformance.HarnessMaker {
	return func(ctx context.Context) (*conformance.Harness, error) {
		path := filepath.Join(t.TempDir(), "outbox.db")
		db := openSQLiteAt(t, path)
		s, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{DB: db, Outbox: wrap(t, s),
			Open: func(context.Context) (*gorm.DB, error) { return openSQLiteAt(t, path), nil }}, nil
	}
}

func TestOutboxSuiteFailsBrokenStores(t *testing.T) {
	cases := []struct {
		name     string
		wrap     func(t *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore
		mustFail []string
	}{
		{"ignores-other-relays-leases",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return sharedLeases{s} },
			[]string{"outbox-relay/lease-excludes"}},
		{"expires-unpublished-rows",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return expiresUnpublished{s} },
			[]string{"outbox-expiry/never-unpublished"}},
		{"hands-out-newest-first",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return newestFirst{s} },
			[]string{"outbox-order/per-key", "outbox-order/commit-gap", "outbox-relay/restart", "outbox-relay/publish-failure", "outbox-relay/several-relays"}},
		{"appends-outside-the-transaction",
			func(t *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore {
				return appendsElsewhere{s, openSQLiteAt(t, filepath.Join(t.TempDir(), "elsewhere.db"))}
			},
			[]string{"outbox-enqueue/commit-publishes", "outbox-enqueue/rollback-removes"}},
		{"makes-a-new-source-id-on-every-migrate",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return newSourceEachMigrate{s} },
			[]string{"outbox-sequence/source-stable"}},
		{"forgets-epoch-bumps",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return bumpForgets{s} },
			[]string{"outbox-sequence/epoch-bump", "outbox-sequence/relay-headers"}},
		{"stores-the-offset-of-every-ack",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return offsetOnEveryAck{s} },
			[]string{"outbox-sequence/marks-keep-offsets"}},
		{"claims-with-the-source-it-read-first",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore {
				return sourceReadOnce{OutboxStore: s, first: &firstSource{}}
			},
			[]string{"outbox-sequence/claim-source"}},
		{"claims-with-the-source-past-max-rows",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore {
				return claimSourceIgnoresMaxRows{claimThenSource{s}}
			},
			[]string{"outbox-sequence/claim-source"}},
		{"makes-a-new-source-id-on-every-read",
			func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return sourcePerCall{s} },
			[]string{"outbox-sequence/source-stable", "outbox-sequence/epoch-bump", "outbox-sequence/relay-headers"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireCaught(t, outboxHarnessWith(t, tc.wrap), tc.mustFail, tc.name)
		})
	}
}

// A store without the capability skips the sequence checks, saying why,
// and passes the others.
func TestOutboxSuiteSkipsSequenceChecksWithoutTheCapability(t *testing.T) {
	newHarness := outboxHarnessWith(t, func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return unsequenced{s} })
	for _, c := range conformance.Checks() {
		if !c.Outbox {
			continue
		}
		err := conformance.RunCheck(t.Context(), newHarness, c)
		switch {
		case c.Sequenced && !errors.Is(err, conformance.ErrSkipped):
			t.Errorf("check %s on a store without storage.Sequenced: %v, want it skipped", c.ID(), err)
		case c.Sequenced:
			t.Logf("%v", err)
		case err != nil:
			t.Errorf("check %s: %v", c.ID(), err)
		}
	}
}

func TestOutboxSuitePassesHealthyStore(t *testing.T) {
	conformance.Run(t, outboxHarnessWith(t, func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return s }))
}

// The healthy store with a claim that reads the source after it passes
// every check, claim-source included.
func TestOutboxSuitePassesHealthySourceClaimer(t *testing.T) {
	conformance.Run(t, outboxHarnessWith(t, func(_ *testing.T, s *inboxsqlite.OutboxStore) storage.OutboxStore { return claimThenSource{s} }))
}
