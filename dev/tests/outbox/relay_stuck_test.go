//go:build cgo

package outbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/outbox"
)

// A stored message whose headers cannot be read stops its shard only: the
// messages of its shard after it wait (they would overtake it), every other
// shard is published, and the cycle's error says which shard is stuck.
func TestRelayStuckShardHoldsOnlyItself(t *testing.T) {
	ctx := context.Background()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "stuck.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	store, _ := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
	ob, err := outbox.New(db, store, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := db.Transaction(func(tx *gorm.DB) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k" + strconv.Itoa(i%8)), Value: []byte(strconv.Itoa(i))})
		}); err != nil {
			t.Fatal(err)
		}
	}
	var victim struct {
		Shard int32
		Seq   int64
	}
	db.Raw(`SELECT shard, seq FROM outbox_messages ORDER BY shard, seq LIMIT 1`).Scan(&victim)
	db.Exec(`UPDATE outbox_messages SET headers = CAST('not json' AS BLOB) WHERE shard = ? AND seq = ?`, victim.Shard, victim.Seq)
	var inShard int64
	db.Raw(`SELECT COUNT(*) FROM outbox_messages WHERE shard = ?`, victim.Shard).Scan(&inShard)

	rec := &conformance.Recorder{}
	relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "r", MaxMessages: 100})
	if err != nil {
		t.Fatal(err)
	}
	n, err := relay.PublishOnce(ctx)
	if !errors.Is(err, outbox.ErrShardStuck) {
		t.Fatalf("cycle error %v, want ErrShardStuck", err)
	}
	if int64(n) != 40-inShard || len(rec.Messages()) != n {
		t.Fatalf("published %d (recorded %d), want the %d messages of the other shards", n, len(rec.Messages()), 40-inShard)
	}
}
