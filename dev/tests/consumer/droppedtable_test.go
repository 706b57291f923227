package consumer_test

import (
	"cmp"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A table dropped under a running consumer (the inbox table; the offsets
// table under Offsets.Store; the watermark table under Sequenced.Sources)
// stays a database failure, retried until the table is back, but the retry
// line says which table is missing and the Migrate call that makes it.
func TestDroppedTableIsNamedInTheRetryLog(t *testing.T) {
	for _, b := range e2eBackends {
		for _, which := range []string{"inbox", "offsets", "watermarks"} {
			t.Run(b.name+"/"+which, func(t *testing.T) {
				brokers := newKfake(t, 1, "orders")
				s := b.open(t)
				logs := newCaptured()
				cfg := baseConfig(t, brokers, "orders", "inventory", s, newEvents())
				cfg.Logger = slog.New(logs)
				cfg.Offsets.Table = "inbox_offsets" + s.suffix
				inboxTable := cmp.Or(s.inboxTable, "inbox_messages")
				table, fix := inboxTable, "Inbox.Migrate"
				switch which {
				case "offsets":
					cfg.Offsets.Store = true
					table, fix = cfg.Offsets.Table, "Consumer.Migrate"
				case "watermarks":
					cfg.Sequenced.Sources = []string{testSource}
					table, fix = inboxTable+"_watermarks", "Consumer.Migrate"
				}
				name := table
				if b.name == "postgres" && which != "offsets" {
					name = "public." + table
				}
				produce(t, brokers, "orders", seqMessage(0, 0, 0, 1, 1))
				r := start(t, cfg)
				waitUntil(t, 20*time.Second, "order 0 applied", func() bool { return len(s.counts(t)) == 1 })
				if err := s.db.Exec("DROP TABLE " + table).Error; err != nil {
					t.Fatal(err)
				}
				produce(t, brokers, "orders", seqMessage(1, 0, 0, 2, 1))
				waitUntil(t, 20*time.Second, "a retry line naming "+name, func() bool {
					for _, l := range logs.about("missing_table=" + name) {
						if l.level >= slog.LevelWarn && strings.Contains(l.text, fix) {
							return true
						}
					}
					return false
				})
				// The table comes back: the retries succeed.
				var err error
				if which == "inbox" {
					err = s.ib.Migrate(context.Background())
				} else {
					err = r.c.Migrate(context.Background())
				}
				if err != nil {
					t.Fatal(err)
				}
				waitUntil(t, 20*time.Second, "order 1 applied once the table is back", func() bool { return len(s.counts(t)) == 2 })
				if err := r.stop(t); err != nil {
					t.Fatal(err)
				}
				t.Log(logs.about("missing_table=")[0].text)
			})
		}
	}
}
