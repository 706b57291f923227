package consumer_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
)

// lockedBuffer is a bytes.Buffer safe for the consumer's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A 10,000-byte event id is shown shortened in the log lines about its
// message, as in its error text, not in full.
func TestLongEventIDIsLoggedShortened(t *testing.T) {
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	long := strings.Repeat("x", 10000)
	bad := orderMessage(1, 0)
	for i, h := range bad.Headers {
		if h.Key == header.EventID {
			bad.Headers[i].Value = []byte(long)
		}
	}
	produce(t, brokers, "orders", orderMessage(0, 0), bad)
	ev := newEvents()
	var logs lockedBuffer
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic = consumer.DeadLetter, "orders.dlq"
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "the long id dead-lettered", func() bool { return ev.count(hooks.DeadLettered) == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "event_id="+strings.Repeat("x", 64)+"...") {
		t.Errorf("no log line names the message by its shortened id:\n%.2000s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 1000 {
			t.Errorf("a log line of %d bytes: %.300s...", len(line), line)
		}
	}
}
