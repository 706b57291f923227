package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
)

// captured is a slog.Handler keeping every record as one line of text.
type captured struct {
	mu    *sync.Mutex
	lines *[]capturedLine
	attrs []slog.Attr
}

type capturedLine struct {
	level slog.Level
	text  string
}

func newCaptured() *captured { return &captured{mu: new(sync.Mutex), lines: new([]capturedLine)} }

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }

func (c *captured) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	for _, a := range c.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	c.mu.Lock()
	*c.lines = append(*c.lines, capturedLine{r.Level, b.String()})
	c.mu.Unlock()
	return nil
}

func (c *captured) WithAttrs(as []slog.Attr) slog.Handler {
	return &captured{mu: c.mu, lines: c.lines, attrs: append(append([]slog.Attr(nil), c.attrs...), as...)}
}

func (c *captured) WithGroup(string) slog.Handler { return c }

// about returns the lines at Info or above that contain s.
func (c *captured) about(s string) []capturedLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []capturedLine
	for _, l := range *c.lines {
		if l.level >= slog.LevelInfo && strings.Contains(l.text, s) {
			out = append(out, l)
		}
	}
	return out
}

// Under a consumer one failed attempt is logged once, by the consumer, at
// the level of what it means: an attempt that is retried at Warn, the
// final one, whose message goes to the failure policy, at Error. The inbox
// the consumer drives logs none of them.
func TestOneLinePerFailedAttempt(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders", "orders.dlq")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders", orderMessage(0, 0), orderMessage(1, 0), orderMessage(2, 0))
	logs := newCaptured()
	log := slog.New(logs)
	ib, err := inbox.New(s.db, s.ib.Store(), inbox.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Inbox, cfg.Logger = ib, log
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", 2
	once := s.failingOnce("order-1")
	cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		if string(msg.Key) == "order-2" {
			return errors.New("order-2 is refused")
		}
		return once(ctx, tx, msg)
	}
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "two orders applied and one dead-lettered", func() bool {
		return ev.count(hooks.Processed) == 2 && ev.count(hooks.DeadLettered) == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	lines := logs.about("evt-order-1")
	if len(lines) != 1 || lines[0].level != slog.LevelWarn {
		t.Errorf("order-1 failed once and then committed: want one Warn line about it, got %d: %v", len(lines), lines)
	}
	lines = logs.about("evt-order-2")
	if len(lines) != 2 || lines[0].level != slog.LevelWarn || lines[1].level != slog.LevelError {
		t.Errorf("order-2 failed twice and was dead-lettered: want a Warn and an Error line about it, got %d: %v", len(lines), lines)
	}
	if lines := logs.about("evt-order-0"); len(lines) != 0 {
		t.Errorf("order-0 committed at once: want no line about it, got %v", lines)
	}
}

// An application calling the inbox itself still hears of a failure from
// the inbox: one Error line.
func TestStandaloneInboxLogsItsFailures(t *testing.T) {
	s := newSQLiteShop(t)
	logs := newCaptured()
	ib, err := inbox.New(s.db, s.ib.Store(), inbox.Config{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ib.Process(context.Background(), inbox.Message{Consumer: "c", ID: "evt-standalone", Time: time.Now()},
		func(context.Context, *gorm.DB, inbox.Message) error { return errors.New("refused") })
	if err == nil {
		t.Fatal("Process succeeded, want the handler's error")
	}
	if lines := logs.about("evt-standalone"); len(lines) != 1 || lines[0].level != slog.LevelError {
		t.Errorf("want one Error line about the failure, got %v", lines)
	}
}
