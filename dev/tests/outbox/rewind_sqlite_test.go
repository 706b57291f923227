//go:build cgo

package outbox_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/outbox"
)

// sqliteFile is an aligned SQLite outbox in a file that a test copies
// away and back: a backup and a restore of the producer's database.
type sqliteFile struct {
	t     *testing.T
	path  string
	db    *gorm.DB
	store *inboxsqlite.OutboxStore
	ob    *outbox.Outbox
}

func openSQLiteFile(t *testing.T, shards int) *sqliteFile {
	f := &sqliteFile{t: t, path: filepath.Join(t.TempDir(), "producer.db")}
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: "aligned", Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	f.store = store
	f.open()
	if err := store.Migrate(t.Context(), f.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	return f
}

func (f *sqliteFile) open() {
	db, err := gorm.Open(inboxsqlite.Open(f.path), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		f.t.Fatal(err)
	}
	f.db = db
	f.ob = newOutbox(f.t, db, f.store, outbox.Config{AlignedTopic: "orders"})
}

func (f *sqliteFile) close() {
	if sqlDB, err := f.db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// backup copies the database to a file (VACUUM INTO: a consistent
// snapshot while it is in use) and returns the file's path.
func (f *sqliteFile) backup() string {
	to := f.path + ".backup"
	_ = os.Remove(to)
	if err := f.db.Exec(`VACUUM INTO ?`, to).Error; err != nil {
		f.t.Fatal(err)
	}
	return to
}

// restore puts the outbox's tables back as they are in the backup from,
// through the same pool: processes connected to the database (a relay)
// stay connected, as they would to a server restored under them.
func (f *sqliteFile) restore(from string) {
	err := f.db.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`ATTACH DATABASE ? AS bak`, from).Error; err != nil {
			return err
		}
		defer conn.Exec(`DETACH DATABASE bak`)
		return conn.Transaction(func(tx *gorm.DB) error {
			for _, table := range []string{"aligned", "aligned_shards", "aligned_source"} {
				if err := tx.Exec(`DELETE FROM main.` + table).Error; err != nil {
					return err
				}
				if err := tx.Exec(`INSERT INTO main.` + table + ` SELECT * FROM bak.` + table).Error; err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *sqliteFile) enqueue(prefix string, from, n int) {
	msgs := alignedMessages("orders", from, n, 12)
	for i := range msgs {
		msgs[i].ID = fmt.Sprintf("%s-%04d", prefix, from+i)
	}
	for lo := 0; lo < n; lo += 5 {
		if err := enqueue(f.t.Context(), f.db, f.ob, msgs[lo:min(lo+5, n)]...); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *sqliteFile) relay(pub *pinRecorder) *outbox.Relay {
	r, err := f.ob.NewRelay(pub, outbox.RelayConfig{ID: "r", MaxMessages: 25})
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func drain(t *testing.T, r *outbox.Relay) {
	t.Helper()
	if _, err := conformance.Drain(t.Context(), r); err != nil {
		t.Fatal(err)
	}
}

// watermarkConsumer applies the messages of each partition in order as
// sequenced dedup does: by the watermark of (source, epoch, shard), a
// number at or below it a duplicate, a number past the next one a gap.
// It returns how often each event was applied, and the gaps.
func watermarkConsumer(pub *pinRecorder, partitions int) (applied map[string]int, gaps []string) {
	applied = map[string]int{}
	type stream struct {
		source, epoch, shard string
	}
	marks := map[stream]int64{}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for p := range partitions {
		for _, m := range pub.log(p) {
			h := map[string]string{}
			for _, hd := range m.Headers {
				h[hd.Key] = string(hd.Value)
			}
			id := h[header.EventID]
			seq, err := strconv.ParseInt(h[header.Seq], 10, 64)
			if err != nil {
				gaps = append(gaps, fmt.Sprintf("event %s without a number", id))
				continue
			}
			k := stream{h[header.SeqSource], h[header.SeqEpoch], h[header.SeqShard]}
			last, seen := marks[k]
			switch {
			case seen && seq <= last:
				continue // a duplicate
			case seen && seq > last+1:
				gaps = append(gaps, fmt.Sprintf("partition %d epoch %s: %d after %d (event %s)", p, k.epoch, seq, last, id))
			}
			marks[k] = seq
			applied[id]++
		}
	}
	return applied, gaps
}

// An aligned outbox's database restored from a backup hands its numbers
// out again; the relay finds out from the partitions and publishes so that
// a consumer deduplicating by watermark applies every event once: with or
// without an operator's bump of the epoch, with enqueuers before the relay,
// and with a relay that lived through the restore.
func TestAlignedRelayAfterRestore(t *testing.T) {
	const shards = 3
	for _, tc := range []struct {
		name string
		// after runs once the database is restored; the relay of before
		// the restore (or nil) is passed.
		after func(t *testing.T, f *sqliteFile, pub *pinRecorder, old *outbox.Relay)
	}{
		{"enqueuers before the relay", func(t *testing.T, f *sqliteFile, pub *pinRecorder, _ *outbox.Relay) {
			f.enqueue("new", 0, 150)
			drain(t, f.relay(pub))
		}},
		{"relay before the enqueuers", func(t *testing.T, f *sqliteFile, pub *pinRecorder, _ *outbox.Relay) {
			r := f.relay(pub)
			drain(t, r)
			f.enqueue("new", 0, 150)
			drain(t, r)
		}},
		{"relay that lived through the restore", func(t *testing.T, f *sqliteFile, pub *pinRecorder, old *outbox.Relay) {
			f.enqueue("new", 0, 150)
			drain(t, old)
		}},
		{"epoch bumped before the relay", func(t *testing.T, f *sqliteFile, pub *pinRecorder, _ *outbox.Relay) {
			if _, err := f.store.BumpEpoch(t.Context(), f.db); err != nil {
				t.Fatal(err)
			}
			f.enqueue("new", 0, 150)
			drain(t, f.relay(pub))
		}},
		{"epoch bumped after the relay restarted", func(t *testing.T, f *sqliteFile, pub *pinRecorder, _ *outbox.Relay) {
			r := f.relay(pub)
			f.enqueue("new", 0, 75)
			drain(t, r)
			if _, err := f.store.BumpEpoch(t.Context(), f.db); err != nil {
				t.Fatal(err)
			}
			f.enqueue("new", 75, 75)
			drain(t, r)
		}},
		{"restored twice", func(t *testing.T, f *sqliteFile, pub *pinRecorder, _ *outbox.Relay) {
			f.enqueue("new", 0, 50)
			drain(t, f.relay(pub))
			f.restore(f.path + ".backup")
			f.enqueue("new", 50, 100)
			drain(t, f.relay(pub))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := openSQLiteFile(t, shards)
			pub := &pinRecorder{count: shards}
			r := f.relay(pub)
			f.enqueue("ev", 0, 90)
			drain(t, r)
			f.enqueue("ev", 90, 10) // unpublished when the backup is taken
			backup := f.backup()
			r = f.relay(pub)
			drain(t, r)
			f.enqueue("ev", 100, 100)
			drain(t, r)
			f.restore(backup)
			tc.after(t, f, pub, r)

			applied, gaps := watermarkConsumer(pub, shards)
			for _, g := range gaps {
				t.Errorf("gap: %s", g)
			}
			want := map[string]bool{}
			for i := range 200 {
				want[fmt.Sprintf("ev-%04d", i)] = true
			}
			for i := range 150 {
				want[fmt.Sprintf("new-%04d", i)] = true
			}
			lost, twice := 0, 0
			for id := range want {
				switch n := applied[id]; {
				case n == 0:
					lost++
				case n > 1:
					twice++
				}
			}
			if lost > 0 || twice > 0 || len(applied) != len(want) {
				t.Fatalf("%d events lost, %d applied twice, %d applied in all (want %d)", lost, twice, len(applied), len(want))
			}
		})
	}
}

// A copy of the producer's database whose relay publishes to the same
// topic as the original's, at the same moments: each relay sees the
// other's numbers in the partitions, the one that lost a race for a number
// publishes its message again under a new epoch, and a consumer
// deduplicating by watermark applies every event of both once.
func TestAlignedRelayBesideAClone(t *testing.T) {
	const shards = 3
	orig := openSQLiteFile(t, shards)
	pub := &pinRecorder{count: shards}
	a := orig.relay(pub)
	orig.enqueue("ev", 0, 100)
	drain(t, a)
	orig.enqueue("ev", 100, 10) // unpublished when the copy is made
	clone := &sqliteFile{t: t, path: orig.backup(), store: orig.store}
	clone.open()
	t.Cleanup(clone.close)
	b := clone.relay(pub)
	for round := range 6 {
		orig.enqueue("orig", round*20, 20)
		clone.enqueue("clone", round*20, 20)
		// The clone's relay publishes between the original's check of
		// the partitions and its publish, every other round.
		if round%2 == 0 {
			pub.before = func() {
				if _, err := b.PublishOnce(t.Context()); err != nil {
					t.Error(err)
				}
			}
		}
		for range 3 {
			if _, err := a.PublishOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := b.PublishOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	drain(t, a)
	drain(t, b)
	drain(t, a)

	applied, gaps := watermarkConsumer(pub, shards)
	for _, g := range gaps {
		t.Errorf("gap: %s", g)
	}
	lost, twice := 0, 0
	for _, prefix := range []string{"ev", "orig", "clone"} {
		n := 120
		if prefix == "ev" {
			n = 110
		}
		for i := range n {
			switch c := applied[fmt.Sprintf("%s-%04d", prefix, i)]; {
			case c == 0:
				lost++
			case c > 1:
				twice++
			}
		}
	}
	if lost > 0 || twice > 0 || len(applied) != 350 {
		t.Fatalf("%d events lost, %d applied twice, %d applied in all (want 350)", lost, twice, len(applied))
	}
}

// A message the broker acknowledged but that is not in its partition (lost
// between the acknowledgement and the relay's look after the publish) is
// not marked published: the relay says so at Error and sends it again
// under a new epoch, so that consumers, which stop at the hole it left,
// apply it once they go on past the gap.
func TestAlignedRelaySeesItsMessageMissing(t *testing.T) {
	const shards = 3
	f := openSQLiteFile(t, shards)
	var logs strings.Builder
	f.ob = newOutbox(t, f.db, f.store, outbox.Config{AlignedTopic: "orders", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	pub := &pinRecorder{count: shards, lose: "ev-0042"}
	r := f.relay(pub)
	f.enqueue("ev", 0, 100)
	drain(t, r)

	applied, gaps := watermarkConsumer(pub, shards)
	if len(gaps) != 1 || !strings.Contains(gaps[0], "(event ") {
		t.Errorf("gaps %q, want the one the lost message left", gaps)
	}
	for i := range 100 {
		if id := fmt.Sprintf("ev-%04d", i); applied[id] != 1 {
			t.Errorf("event %s applied %d times, want once", id, applied[id])
		}
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"a message the broker acknowledged is not in its partition") || !strings.Contains(logs.String(), "ev-0042") {
		t.Errorf("no Error naming the lost message; logs:\n%s", logs.String())
	}
}

// A relay that gets a shard back after another relay published it (a
// lease taken over, then lost again) reads the partition afresh: the other
// relay's messages published but not marked (it died before the
// acknowledgement) are not sent again under a new epoch, which a consumer
// deduplicating by watermark would apply a second time.
func TestAlignedRelayRegainsAShardAnotherRelayPublished(t *testing.T) {
	const shards = 3
	f := openSQLiteFile(t, shards)
	pub := &pinRecorder{count: shards}
	relay := func(id string) *outbox.Relay {
		r, err := f.ob.NewRelay(pub, outbox.RelayConfig{ID: id, MaxMessages: 25, Lease: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first, second := relay("first"), relay("second")
	handOver := func() { time.Sleep(150 * time.Millisecond) } // the leases expire
	f.enqueue("ev", 0, 30)
	drain(t, first)
	handOver()
	f.enqueue("ev", 30, 30)
	drain(t, second)
	// second publishes 15 more and dies before marking them: the outbox's
	// tables are as they were before its publish.
	f.enqueue("ev", 60, 15)
	before := f.backup()
	drain(t, second)
	f.restore(before)
	handOver()
	drain(t, first)

	applied, gaps := watermarkConsumer(pub, shards)
	for _, g := range gaps {
		t.Errorf("gap: %s", g)
	}
	lost, twice := 0, 0
	for i := range 75 {
		switch n := applied[fmt.Sprintf("ev-%04d", i)]; {
		case n == 0:
			lost++
		case n > 1:
			twice++
		}
	}
	if lost > 0 || twice > 0 {
		t.Fatalf("%d events lost, %d applied twice", lost, twice)
	}
}
