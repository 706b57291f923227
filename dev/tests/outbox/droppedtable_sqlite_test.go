//go:build cgo

package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/outbox"
)

// lines is a slog.Handler keeping the text of each record at Warn or above.
type lines struct {
	mu   *sync.Mutex
	text *[]string
}

func (l lines) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l lines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	l.mu.Lock()
	*l.text = append(*l.text, b.String())
	l.mu.Unlock()
	return nil
}
func (l lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l lines) WithGroup(string) slog.Handler      { return l }

func (l lines) find(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range *l.text {
		if strings.Contains(t, s) {
			return t
		}
	}
	return ""
}

// A table of the outbox dropped under a running relay (here the shards
// table, which every cycle reads) is retried (it may come back), and the
// retry line names the outbox and Outbox.Migrate; once the tables are
// migrated again the relay publishes.
func TestRelayNamesADroppedOutboxTable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "dropped.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := lines{mu: new(sync.Mutex), text: new([]string)}
	ob := newOutbox(t, db, store, outbox.Config{Logger: slog.New(logs), MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rec := &conformance.Recorder{}
	relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "r", PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	if err := db.Exec(`DROP TABLE ` + store.Table() + `_shards`).Error; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	var line string
	for line == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no retry line names the dropped table %s: %q", store.Table(), *logs.text)
		}
		time.Sleep(20 * time.Millisecond)
		line = logs.find("missing_table=" + store.Table() + " (or another table")
	}
	if !strings.Contains(line, "Outbox.Migrate") {
		t.Errorf("the line does not name the fix: %s", line)
	}
	t.Log(line)
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(ctx, db, ob, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	for len(rec.Messages()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nothing published once the table was back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the relay ended with %v", err)
	}
}

// Enqueue before Outbox.Migrate fails with an error naming the call.
func TestEnqueueWithoutTheTablesNamesMigrate(t *testing.T) {
	ctx := context.Background()
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "fresh.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ob := newOutbox(t, db, store, outbox.Config{})
	err = enqueue(ctx, db, ob, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")})
	if err == nil || !strings.Contains(err.Error(), "run Outbox.Migrate") {
		t.Fatalf("Enqueue before Migrate: %v, want an error naming Outbox.Migrate", err)
	}
	t.Log(err)
}
