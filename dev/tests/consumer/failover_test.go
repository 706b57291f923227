package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"
	"github.com/inboxgo/inbox/internal/watermark"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
)

// snapshotShop copies s's database to a new file, as a standby holds it at
// that moment, and opens a shop on the copy. Whatever s commits afterwards
// is what an asynchronous standby had not received when the primary died.
func snapshotShop(t *testing.T, s *shop) *shop {
	t.Helper()
	path := filepath.Join(t.TempDir(), "standby.db")
	if err := s.db.Exec(`VACUUM INTO ?`, path).Error; err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
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
	ib, err := inbox.New(db, store, inbox.Config{Logger: testLogger(t), RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	return &shop{db: db, ib: ib, suffix: s.suffix}
}

// storedOffset reads the offsets table of s directly.
func storedOffset(t *testing.T, s *shop, group, topic string, partition int) int64 {
	t.Helper()
	next, err := groupOffsets{Table: consumer.DefaultOffsetsTable, Group: group}.Load(context.Background(), s.db, topic, partition)
	if err != nil {
		t.Fatal(err)
	}
	return next
}

// An asynchronous failover: the primary acknowledged commits that the
// standby never received. The effects, inbox rows and stored offset of
// those commits vanish together, but the group's offset in Kafka is already
// past them. With Offsets.Store the consumer resumes from the database's
// position, behind the group's, and applies each of them again: exactly
// once in the promoted database. (Before, it took the larger of the two
// offsets and skipped them for good.)
func TestStoredOffsetBehindTheGroupAfterAFailover(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	primary := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 6, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", primary, ev)
	cfg.Offsets.Store = true
	a := start(t, cfg)
	waitUntil(t, 30*time.Second, "orders 0-5", func() bool { return ev.count(hooks.Processed) == 6 })
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}

	standby := snapshotShop(t, primary)

	// The last commits reach only the primary (and Kafka's group offset).
	produce(t, brokers, "orders", orderMessage(6, 0), orderMessage(7, 0), orderMessage(8, 0), orderMessage(9, 0))
	ev2 := newEvents()
	cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
	b := start(t, cfg)
	waitUntil(t, 30*time.Second, "orders 6-9 on the primary", func() bool { return ev2.count(hooks.Processed) == 4 })
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	primary.checkExactlyOnce(t, 10, nil)
	if got := committed(t, brokers, "inventory", "orders", 1); got[0] != 10 {
		t.Fatalf("the group committed %v, want 10", got)
	}
	if got := storedOffset(t, standby, "inventory", "orders", 0); got != 6 {
		t.Fatalf("the standby's stored offset is %d, want 6", got)
	}

	// The primary dies; the consumers reconnect to the promoted standby.
	ev3 := newEvents()
	rec := newRecorder(t)
	cfg.Inbox, cfg.Hooks, cfg.Logger = standby.ib, []hooks.Hook{hooks.EventFunc(ev3.on)}, slog.New(rec)
	c := start(t, cfg)
	deadline := time.Now().Add(20 * time.Second)
	for len(standby.counts(t)) < 10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a redelivery applied twice would show now
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	standby.checkExactlyOnce(t, 10, nil)
	if n := ev3.count(hooks.Processed); n != 4 {
		t.Errorf("%d processed after the failover, want the 4 the standby lacked", n)
	}
	if got := storedOffset(t, standby, "inventory", "orders", 0); got != 10 {
		t.Errorf("stored offset %d after the failover, want 10", got)
	}
	if attrs, ok := rec.find(slog.LevelWarn, "behind the group's committed one"); !ok {
		t.Error("no Warn says that the consumer went back to the database's position")
	} else if attrs["redelivered"].Int64() != 4 {
		t.Errorf("the Warn says %v redelivered, want 4", attrs["redelivered"])
	}
}

// The offset after a dead-lettered message is stored: resuming from the
// database's position, even with the group's offset behind it (here reset
// to the start), does not dead-letter the message again.
func TestDeadLetteredOffsetIsStored(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 5, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Offsets.Store = true
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 1
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-4" {
			return errors.New("poison")
		}
		return s.reserve(ctx, tx, msg)
	}
	a := start(t, cfg)
	waitUntil(t, 30*time.Second, "4 processed and 1 dead letter", func() bool {
		return ev.count(hooks.Processed) == 4 && ev.count(hooks.DeadLettered) == 1
	})
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	// The poison is the last message: only the dead letter's own store can
	// have moved the stored offset past it.
	if got := storedOffset(t, s, "inventory", "orders", 0); got != 5 {
		t.Fatalf("stored offset %d after the dead letter, want 5", got)
	}

	commitOffset(t, brokers, "inventory", "orders", 0, 0)
	ev2 := newEvents()
	cfg.Hooks = []hooks.Hook{hooks.EventFunc(ev2.on)}
	b := start(t, cfg)
	waitUntil(t, 30*time.Second, "the partition to be assigned", func() bool { return ev2.count(hooks.Assigned) == 1 })
	time.Sleep(500 * time.Millisecond)
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := ev2.count(hooks.DeadLettered) + ev2.count(hooks.Processed) + ev2.count(hooks.Duplicate); n != 0 {
		t.Errorf("%d messages handled again after resuming from the stored offset, want 0", n)
	}
	if got := readAll(t, brokers, "orders.dlq", 1, 1); len(got) != 1 {
		t.Errorf("%d dead letters, want 1", len(got))
	}
	s.checkExactlyOnce(t, 4, nil)
}

// loseTail makes s's database look like an asynchronous standby promoted
// while orders from..n-1 (all on partition 0) had reached only the old
// primary: their effects, inbox rows and stored offset are gone.
func loseTail(t *testing.T, s *shop, group string, from, n int) {
	t.Helper()
	if err := s.db.Transaction(func(tx *gorm.DB) error { return loseTailIn(tx, s, group, from, n) }); err != nil {
		t.Fatal(err)
	}
}

// loseTailIn makes loseTail's writes in tx.
func loseTailIn(tx *gorm.DB, s *shop, group string, from, n int) error {
	{
		qty := 0
		for i := from; i < n; i++ {
			qty += 1 + i%3
			if err := tx.Exec(`DELETE FROM reservations`+s.suffix+` WHERE order_id = ?`, "order-"+strconv.Itoa(i)).Error; err != nil {
				return err
			}
		}
		if err := tx.Exec(`UPDATE stock`+s.suffix+` SET reserved = reserved - ? WHERE sku = 'sku-0'`, qty).Error; err != nil {
			return err
		}
		if err := tx.Exec(`DELETE FROM `+inboxsqlite.DefaultTable+` WHERE offset_no >= ?`, from).Error; err != nil {
			return err
		}
		// The standby's row is older in both its offset and its generation
		// (written before a rebalance): a failover all the same, not a
		// takeover, which only a newer generation means.
		return tx.Exec(`UPDATE `+consumer.DefaultOffsetsTable+` SET next_offset = ?, generation = 0 WHERE group_id = ?`, from, group).Error
	}
}

// A consumer that keeps running through an asynchronous failover: its
// partition's position lives in its memory, past the commits the promoted
// database lacks. The next write of the stored offset (a new message), or
// the check of an idle partition, finds the database behind what the
// worker committed; the worker resumes from the database's position and
// applies the lost messages again, exactly once.
func TestRunningConsumerResumesFromTheDatabaseAfterAFailover(t *testing.T) {
	t.Parallel()
	for _, idle := range []bool{false, true} {
		name := "next message"
		if idle {
			name = "idle partition"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			sendOrders(t, brokers, "orders", 1, 10, nil)
			ev := newEvents()
			cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
			cfg.Offsets.Store = true
			knobs := &testhooks.Knobs{PosCheckInterval: time.Hour}
			if idle {
				knobs.PosCheckInterval = 200 * time.Millisecond
			}
			r := startWith(t, cfg, knobs)
			waitUntil(t, 30*time.Second, "10 processed", func() bool { return ev.count(hooks.Processed) == 10 })

			loseTail(t, s, "inventory", 6, 10)
			n := 10
			if !idle {
				produce(t, brokers, "orders", orderMessage(10, 0))
				n = 11
			}
			deadline := time.Now().Add(15 * time.Second)
			for len(s.counts(t)) < n && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // a redelivery applied twice would show now
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, n, nil)
			if got := ev.count(hooks.Repositioned); got != 1 {
				t.Errorf("%d repositionings, want 1", got)
			}
			if got := storedOffset(t, s, "inventory", "orders", 0); got != int64(n) {
				t.Errorf("stored offset %d, want %d", got, n)
			}
		})
	}
}

// The same failover under a consumer deduplicating a trusted source by
// watermark: the promoted database's watermark went back with the effects
// and the stored offset. The worker resumes from the database's position
// and must judge the messages it reads again by the database's watermark,
// not by the one it held in memory, which would drop them as duplicates.
func TestSequencedRunningConsumerResumesAfterAFailover(t *testing.T) {
	t.Parallel()
	for _, idle := range []bool{false, true} {
		name := "next message"
		if idle {
			name = "idle partition"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			brokers := newKfake(t, 1, "orders")
			s := newSQLiteShop(t)
			for i := range 10 {
				produce(t, brokers, "orders", seqMessage(i, 0, 0, int64(i+1), 1))
			}
			ev := newEvents()
			cfg := sequencedConfig(t, brokers, s, ev)
			cfg.Offsets.Store = true
			knobs := &testhooks.Knobs{PosCheckInterval: time.Hour}
			if idle {
				knobs.PosCheckInterval = 200 * time.Millisecond
			}
			r := startWith(t, cfg, knobs)
			waitUntil(t, 30*time.Second, "10 processed", func() bool { return ev.count(hooks.Processed) == 10 })

			// The failover: orders 6..9 (seq 7..10) are gone, with the
			// watermark and the stored offset that covered them.
			s.setWatermark(t, watermark.Applied{0: 10}, watermark.Applied{0: 6}, func(tx *gorm.DB) error {
				return loseTailIn(tx, s, "inventory", 6, 10)
			})
			n := 10
			if !idle {
				produce(t, brokers, "orders", seqMessage(10, 0, 0, 11, 1))
				n = 11
			}
			deadline := time.Now().Add(15 * time.Second)
			for len(s.counts(t)) < n && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // a redelivery applied twice would show now
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			s.checkExactlyOnce(t, n, nil)
			if got := ev.count(hooks.Repositioned); got != 1 {
				t.Errorf("%d repositionings, want 1", got)
			}
			if a := s.watermarks(t)[0][testSource+"/1"]; a[0] != int64(n) {
				t.Errorf("watermark %v, want shard 0 at %d", a, n)
			}
		})
	}
}
