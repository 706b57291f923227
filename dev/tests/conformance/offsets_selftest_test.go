package conformance_test

import (
	"context"
	"testing"

	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// Broken offset stores (storage.OffsetStore) on top of the healthy SQLite
// store, each breaking one promise of the contract.

// offsetOutsideTx keeps its offsets in a database of its own, so a write
// commits on its own, outside the caller's transaction (its reads agree
// with its writes).
type offsetOutsideTx struct {
	*inboxsqlite.Store
	own *gorm.DB
}

func (s offsetOutsideTx) MigrateOffsets(ctx context.Context, _ *gorm.DB, table string) error {
	return s.Store.MigrateOffsets(ctx, s.own, table)
}

func (s offsetOutsideTx) SaveOffset(ctx context.Context, _ *gorm.DB, table string, w storage.OffsetWrite) error {
	return s.Store.SaveOffset(ctx, s.own, table, w)
}

func (s offsetOutsideTx) Offsets(ctx context.Context, _ *gorm.DB, table, group, topic string, partition int32) ([]storage.OffsetRow, error) {
	return s.Store.Offsets(ctx, s.own, table, group, topic, partition)
}

func (s offsetOutsideTx) ClaimOffset(ctx context.Context, _ *gorm.DB, table string, key storage.OffsetKey, gen int32) (storage.OffsetRow, bool, error) {
	return s.Store.ClaimOffset(ctx, s.own, table, key, gen)
}

func (s offsetOutsideTx) AdoptOffset(ctx context.Context, _ *gorm.DB, table string, key storage.OffsetKey, from, gen int32) (bool, error) {
	return s.Store.AdoptOffset(ctx, s.own, table, key, from, gen)
}

func (s offsetOutsideTx) ResetOffsets(ctx context.Context, _ *gorm.DB, table, group, topic string, next map[int32]int64) error {
	return s.Store.ResetOffsets(ctx, s.own, table, group, topic, next)
}

// ignoresFloor writes every offset as a first write: a row that went back
// behind what the writer committed (a failover that lost commits) is
// written over, and the writer goes on as if nothing was lost.
type ignoresFloor struct{ *inboxsqlite.Store }

func (s ignoresFloor) SaveOffset(ctx context.Context, tx *gorm.DB, table string, w storage.OffsetWrite) error {
	w.Floor = -1
	return s.Store.SaveOffset(ctx, tx, table, w)
}

// ignoresGeneration writes over a row of a newer generation: a zombie
// member moves the offset of a partition another member owns.
type ignoresGeneration struct{ *inboxsqlite.Store }

func (s ignoresGeneration) SaveOffset(ctx context.Context, tx *gorm.DB, table string, w storage.OffsetWrite) error {
	rows, err := s.Offsets(ctx, tx, table, w.Group, w.Topic, w.Partition)
	if err != nil {
		return err
	}
	if len(rows) == 1 && rows[0].Generation > w.Generation {
		if _, err := s.AdoptOffset(ctx, tx, table, w.OffsetKey, rows[0].Generation, w.Generation); err != nil {
			return err
		}
	}
	return s.Store.SaveOffset(ctx, tx, table, w)
}

// resetDropsGeneration resets rows to generation 0, so that after a reset
// any old member's write passes the fence.
type resetDropsGeneration struct{ *inboxsqlite.Store }

func (s resetDropsGeneration) ResetOffsets(ctx context.Context, db *gorm.DB, table, group, topic string, next map[int32]int64) error {
	if err := s.Store.ResetOffsets(ctx, db, table, group, topic, next); err != nil {
		return err
	}
	return db.WithContext(ctx).Table(table).Where("group_id = ? AND topic = ?", group, topic).Update("generation", 0).Error
}

func TestSuiteFailsBrokenOffsetStores(t *testing.T) {
	cases := []struct {
		name     string
		wrap     func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore
		mustFail []string
	}{
		{"writes-the-offset-outside-the-transaction",
			func(t *testing.T, s *inboxsqlite.Store) storage.InboxStore {
				return offsetOutsideTx{s, openSQLite(t, "elsewhere.db")}
			},
			[]string{"offsets/atomic-with-effect"}},
		{"moves-an-offset-over-a-row-that-went-back",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return ignoresFloor{s} },
			[]string{"offsets/floor-refuses-a-moved-row"}},
		{"writes-over-a-newer-generation",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return ignoresGeneration{s} },
			[]string{"offsets/newer-generation-fences", "offsets/second-writer-waits"}},
		{"reset-drops-the-generation",
			func(_ *testing.T, s *inboxsqlite.Store) storage.InboxStore { return resetDropsGeneration{s} },
			[]string{"offsets/reset"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireCaught(t, harnessWith(t, tc.wrap), tc.mustFail, tc.name)
		})
	}
}
