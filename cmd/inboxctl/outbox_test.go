//go:build cgo

package main

import (
	"strings"
	"testing"

	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

func TestOutboxSQLite(t *testing.T) {
	dsn := sqliteFile(t)
	expectCode(t, runArgs(t, "outbox", "stats", "--dsn", dsn), exitFailed) // no database yet
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "8"), exitOK)
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "16"), exitFailed) // another shard count
	stats := decodeJSON[outboxResult](t, runArgs(t, "outbox", "stats", "--dsn", dsn, "--shards", "8", "--json"))
	if stats.TotalRows != 0 || stats.Action != "stats" {
		t.Fatalf("stats of an empty outbox: %+v", stats)
	}
	m := decodeJSON[outboxResult](t, runArgs(t, "outbox", "maintain", "--dsn", dsn, "--shards", "8", "--dry-run", "--json"))
	if !m.DryRun || len(m.Held) != 0 {
		t.Fatalf("dry run: %+v", m)
	}
	expectCode(t, runArgs(t, "outbox", "--dsn", dsn), exitUsage)
	expectCode(t, runArgs(t, "outbox", "publish", "--dsn", dsn), exitUsage)
	expectCode(t, runArgs(t, "outbox", "-h"), exitOK)
}

// The source id is made by migrate and kept; bump-epoch raises the epoch by
// one (not in a dry run), and the relays of an outbox on the table stamp
// the new one.
func TestOutboxSourceAndEpochSQLite(t *testing.T) {
	dsn := sqliteFile(t)
	expectCode(t, runArgs(t, "outbox", "source", "--dsn", dsn), exitFailed) // no database yet
	migrated := decodeJSON[outboxResult](t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "8", "--json"))
	if err := storage.ValidSource(migrated.Source); err != nil || migrated.Epoch != 1 {
		t.Fatalf("migrate: source %q epoch %d (%v), want a source id and epoch 1", migrated.Source, migrated.Epoch, err)
	}
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "8"), exitOK)
	src := decodeJSON[outboxResult](t, runArgs(t, "outbox", "source", "--dsn", dsn, "--json"))
	if src.Source != migrated.Source || src.Epoch != 1 || src.Action != "source" {
		t.Fatalf("source after migrating again: %+v, want source %q epoch 1", src, migrated.Source)
	}
	r := runArgs(t, "outbox", "source", "--dsn", dsn)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, migrated.Source) || !strings.Contains(r.stdout, "epoch 1") {
		t.Fatalf("source output lacks the source id and epoch:\n%s", r.stdout)
	}

	dry := decodeJSON[outboxResult](t, runArgs(t, "outbox", "bump-epoch", "--dsn", dsn, "--dry-run", "--json"))
	if !dry.DryRun || dry.PreviousEpoch != 1 || dry.Epoch != 2 {
		t.Fatalf("dry run: %+v, want epoch 1 to 2", dry)
	}
	for want := int64(2); want <= 3; want++ {
		b := decodeJSON[outboxResult](t, runArgs(t, "outbox", "bump-epoch", "--dsn", dsn, "--json"))
		if b.DryRun || b.Source != migrated.Source || b.PreviousEpoch != want-1 || b.Epoch != want {
			t.Fatalf("bump-epoch: %+v, want source %q epoch %d, was %d", b, migrated.Source, want, want-1)
		}
	}
	r = runArgs(t, "outbox", "bump-epoch", "--dsn", dsn)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "epoch 4, was 3") {
		t.Fatalf("bump-epoch output:\n%s", r.stdout)
	}
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "8"), exitOK)
	if src := decodeJSON[outboxResult](t, runArgs(t, "outbox", "source", "--dsn", dsn, "--json")); src.Source != migrated.Source || src.Epoch != 4 {
		t.Fatalf("after migrating again: %+v, want source %q epoch 4", src, migrated.Source)
	}

	// A relay on the table stamps the source and the epoch now in force.
	db := openGorm(t, "sqlite", dsn)
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(db, store, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Transaction(func(tx *gorm.DB) error {
		return ob.Enqueue(t.Context(), tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")})
	}); err != nil {
		t.Fatal(err)
	}
	rec := &conformance.Recorder{}
	relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := conformance.Drain(t.Context(), relay); err != nil || n != 1 {
		t.Fatalf("relay published %d (err %v), want 1", n, err)
	}
	got := map[string]string{}
	for _, h := range rec.Messages()[0].Headers {
		got[h.Key] = string(h.Value)
	}
	if got[header.SeqSource] != migrated.Source || got[header.SeqEpoch] != "4" || got[header.Seq] != "1" {
		t.Fatalf("published headers %v, want source %q, epoch 4, seq 1", got, migrated.Source)
	}

	expectCode(t, runArgs(t, "outbox", "source", "--dsn", dsn, "--dry-run"), exitUsage)
	other := emptySQLite(t)
	expectCode(t, runArgs(t, "outbox", "bump-epoch", "--dsn", other), exitFailed) // never migrated
}

func TestOutboxPrintSQLThenUse(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql", "sqlite"} {
		r := runArgs(t, "outbox", "migrate", "--print-sql", "--dialect", dialect, "--shards", "4")
		expectCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "CREATE TABLE") || !strings.Contains(r.stdout, "_shards") {
			t.Errorf("%s: DDL lacks the tables:\n%s", dialect, r.stdout)
		}
	}
	// The SQLite DDL, applied as a migration tool would, is accepted by
	// migrate with the same shard count.
	dsn := sqliteFile(t)
	r := runArgs(t, "outbox", "migrate", "--print-sql", "--dialect", "sqlite", "--shards", "4")
	db := openGorm(t, "sqlite", dsn)
	for _, stmt := range strings.Split(r.stdout, ";\n") {
		if q := strings.TrimSpace(stripComments(stmt)); q != "" {
			if err := db.Exec(q).Error; err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "4"), exitOK)
	// The DDL made the source id; migrate keeps it.
	src := decodeJSON[outboxResult](t, runArgs(t, "outbox", "source", "--dsn", dsn, "--json"))
	if err := storage.ValidSource(src.Source); err != nil || src.Epoch != 1 {
		t.Fatalf("source after the printed DDL: %+v (%v)", src, err)
	}
	first := src.Source
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "4"), exitOK)
	if src := decodeJSON[outboxResult](t, runArgs(t, "outbox", "source", "--dsn", dsn, "--json")); src.Source != first {
		t.Fatalf("migrate changed the source id the DDL made: %q, then %q", first, src.Source)
	}
}
