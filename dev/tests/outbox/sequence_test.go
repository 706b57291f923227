//go:build cgo

package outbox_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// sequenceDB is a migrated SQLite outbox of 4 shards.
func sequenceDB(t *testing.T) (*gorm.DB, *inboxsqlite.OutboxStore) {
	t.Helper()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "seq.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db, store
}

// publish drains ob through a recorder and returns what it published.
func publish(t *testing.T, ob *outbox.Outbox) []kafka.Message {
	t.Helper()
	rec := &conformance.Recorder{}
	relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conformance.Drain(t.Context(), relay); err != nil {
		t.Fatal(err)
	}
	return rec.Messages()
}

var allSequenceHeaders = []string{header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq,
	header.CloudEventsSeqSource, header.CloudEventsSeqEpoch, header.CloudEventsSeqShard, header.CloudEventsSequence}

// In the CloudEvents style the sequence is CloudEvents' sequence extension,
// zero-padded so that string order is number order, and the source, epoch
// and shard go in ce_inbox* extensions; nothing of the other style is sent.
func TestSequenceHeadersCloudEvents(t *testing.T) {
	ctx := t.Context()
	db, store := sequenceDB(t)
	source, _, err := store.Source(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	ob := newOutbox(t, db, store, outbox.Config{Headers: outbox.CloudEventsHeaders})
	if !ob.Sequenced() {
		t.Fatal("an outbox over the SQLite store stamps no sequence headers")
	}
	for i := range 12 {
		if err := enqueue(ctx, db, ob, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	got := publish(t, ob)
	if len(got) != 12 {
		t.Fatalf("published %d, want 12", len(got))
	}
	prev := ""
	for i, m := range got {
		hs := headers(m)
		want := map[string]string{
			header.CloudEventsSeqSource: source,
			header.CloudEventsSeqEpoch:  "1",
			header.CloudEventsSequence:  fmt.Sprintf("%019d", i+1),
		}
		for k, v := range want {
			if len(hs[k]) != 1 || hs[k][0] != v {
				t.Fatalf("message %d: %s = %q, want %q once", i, k, hs[k], v)
			}
		}
		if len(hs[header.CloudEventsSeqShard]) != 1 {
			t.Fatalf("message %d: no %s", i, header.CloudEventsSeqShard)
		}
		for _, k := range []string{header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq} {
			if _, ok := hs[k]; ok {
				t.Fatalf("message %d of the CloudEvents style carries %s", i, k)
			}
		}
		if seq := hs[header.CloudEventsSequence][0]; seq <= prev {
			t.Fatalf("ce_sequence %q after %q: string order is not the key's order", seq, prev)
		} else {
			prev = seq
		}
	}
}

// Sequence headers off: the relay stamps none, and a message may carry
// headers of their names, sent as they are.
func TestSequenceHeadersOff(t *testing.T) {
	ctx := t.Context()
	db, store := sequenceDB(t)
	for name, ob := range map[string]*outbox.Outbox{
		"NoSequenceHeaders":              newOutbox(t, db, store, outbox.Config{NoSequenceHeaders: true}),
		"a store without the capability": newOutbox(t, db, struct{ storage.OutboxStore }{store}, outbox.Config{}),
	} {
		t.Run(name, func(t *testing.T) {
			if ob.Sequenced() {
				t.Fatal("Sequenced() is true")
			}
			mine := kafka.Header{Key: header.Seq, Value: []byte("app-7")}
			if err := enqueue(ctx, db, ob, outbox.Message{Topic: "t", Key: []byte("k"), Headers: []kafka.Header{mine}},
				outbox.Message{Topic: "t", Key: []byte("j")}); err != nil {
				t.Fatal(err)
			}
			got := publish(t, ob)
			if len(got) != 2 {
				t.Fatalf("published %d, want 2", len(got))
			}
			for _, m := range got {
				hs := headers(m)
				for _, k := range allSequenceHeaders {
					if v, ok := hs[k]; ok && (string(m.Key) != "k" || k != header.Seq || len(v) != 1 || v[0] != "app-7") {
						t.Errorf("message of key %s carries %s = %q", m.Key, k, v)
					}
				}
			}
		})
	}
}

// While the relay stamps them, Enqueue refuses messages that carry their
// names; a row stored with one of them by an outbox that had them off gets
// the relay's values instead.
func TestSequenceHeadersReserved(t *testing.T) {
	ctx := t.Context()
	db, store := sequenceDB(t)
	on := newOutbox(t, db, store, outbox.Config{})
	for _, k := range allSequenceHeaders[:7] {
		err := enqueue(ctx, db, on, outbox.Message{Topic: "t", Key: []byte("k"), Headers: []kafka.Header{{Key: k, Value: []byte("x")}}})
		var ve *inbox.ValidationError
		if !errors.Is(err, inbox.ErrInvalidMessage) || !errors.As(err, &ve) {
			t.Errorf("header %s: Enqueue returned %v, want a validation error", k, err)
		}
	}
	off := newOutbox(t, db, store, outbox.Config{NoSequenceHeaders: true})
	if err := enqueue(ctx, db, off, outbox.Message{Topic: "t", Key: []byte("k"), Headers: []kafka.Header{{Key: header.Seq, Value: []byte("app")}, {Key: "trace", Value: []byte("t")}}}); err != nil {
		t.Fatal(err)
	}
	got := publish(t, on)
	if len(got) != 1 {
		t.Fatalf("published %d, want 1", len(got))
	}
	hs := headers(got[0])
	if v := hs[header.Seq]; len(v) != 1 || v[0] != "1" || len(hs["trace"]) != 1 {
		t.Fatalf("headers %v: want the relay's inbox_seq 1 in place of the stored one, and the trace header", hs)
	}
}

// A bump applies to the next cycle, copies of rows published before it
// included: numbers handed out again after a restore are told apart by it.
func TestSequenceEpochAfterRestore(t *testing.T) {
	ctx := t.Context()
	db, store := sequenceDB(t)
	source, _, err := store.Source(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	ob := newOutbox(t, db, store, outbox.Config{})
	if err := enqueue(ctx, db, ob, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	first := publish(t, ob)
	// The restore: the row and the shard's marks go back to nothing, and
	// the same number goes to another event.
	if err := db.Exec(`DELETE FROM outbox_messages`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`UPDATE outbox_messages_shards SET next_seq = 0, published_through = 0`).Error; err != nil {
		t.Fatal(err)
	}
	if epoch, err := store.BumpEpoch(ctx, db); err != nil || epoch != 2 {
		t.Fatalf("BumpEpoch: %d, %v", epoch, err)
	}
	if err := enqueue(ctx, db, ob, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	second := publish(t, ob)
	if len(first) != 1 || len(second) != 1 {
		t.Fatalf("published %d, then %d; want 1 each", len(first), len(second))
	}
	a, b := headers(first[0]), headers(second[0])
	if a[header.Seq][0] != "1" || b[header.Seq][0] != "1" || a[header.SeqShard][0] != b[header.SeqShard][0] {
		t.Fatalf("the restored outbox did not hand out the same number again: %v, then %v", a, b)
	}
	if a[header.SeqSource][0] != source || b[header.SeqSource][0] != source || a[header.SeqEpoch][0] != "1" || b[header.SeqEpoch][0] != "2" {
		t.Fatalf("before the bump %v, after it %v: want source %s with epochs 1 and 2", a, b, source)
	}
}
