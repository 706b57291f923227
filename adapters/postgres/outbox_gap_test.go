package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/storage"
)

// numberedAtInsert is the classic outbox trap on top of the real store: it
// numbers rows from a counter that nobody locks (as a sequence or an
// autoincrement does), and records the highest number outside the caller's
// transaction. Two transactions of one key then commit in either order.
type numberedAtInsert struct {
	*inboxpg.OutboxStore
	db *gorm.DB // a pool of its own, for the counter

	mu   sync.Mutex
	next map[int32]int64
}

func (s *numberedAtInsert) Append(ctx context.Context, tx *gorm.DB, rows []storage.OutboxRow) error {
	s.mu.Lock()
	first := map[int32]int64{}
	for _, c := range storage.AssignShards(rows, 16) {
		first[c.Shard] = s.next[c.Shard] + 1
		s.next[c.Shard] += c.Rows
	}
	s.mu.Unlock()
	storage.NumberRows(rows, first)
	var b strings.Builder
	args := []any{}
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?::date, ?, ?, ?, ?, ?)")
		args = append(args, r.Shard, r.Seq, r.Day.Format("2006-01-02"), r.EventID, r.Topic, r.Key, r.Value, r.Headers)
	}
	table := `"` + s.Schema() + `"."` + s.Table() + `"`
	if err := tx.WithContext(ctx).Exec(`INSERT INTO `+table+` (shard, seq, day, event_id, topic, msg_key, msg_value, headers) VALUES `+b.String(), args...).Error; err != nil {
		return err
	}
	for _, r := range rows {
		if err := s.db.WithContext(ctx).Exec(`UPDATE "`+s.Schema()+`"."`+s.Table()+`_shards" SET next_seq = GREATEST(next_seq, ?) WHERE shard = ?`, r.Seq, r.Shard).Error; err != nil {
			return err
		}
	}
	return nil
}

// TestCommitGapCheckCatchesNumberingAtInsert shows that the commit-gap check
// fails a store that numbers rows at INSERT without ordering the
// transactions of a key.
func TestCommitGapCheckCatchesNumberingAtInsert(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	healthy := newHarness(dsn, nil, openDB, true)
	broken := func(ctx context.Context) (*conformance.Harness, error) {
		h, err := healthy(ctx)
		if err != nil {
			return nil, err
		}
		own, err := openDB(dsn)
		if err != nil {
			return nil, err
		}
		inner := h.Outbox.(*inboxpg.OutboxStore)
		h.Outbox = &numberedAtInsert{OutboxStore: inner, db: own, next: map[int32]int64{}}
		closeHarness := h.Close
		h.Close = func() error { _ = closeDB(own); return closeHarness() }
		return h, nil
	}
	for _, c := range conformance.Checks() {
		if c.ID() != "outbox-order/commit-gap" {
			continue
		}
		err := conformance.RunCheck(t.Context(), broken, c)
		if err == nil {
			t.Fatal("the commit-gap check passed a store that numbers rows at INSERT")
		}
		t.Logf("caught: %v", err)
		if err := conformance.RunCheck(t.Context(), healthy, c); err != nil {
			t.Fatalf("the healthy store failed: %v", err)
		}
		return
	}
	t.Fatal(fmt.Errorf("no check outbox-order/commit-gap"))
}
