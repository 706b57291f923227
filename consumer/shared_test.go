package consumer

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// Hooks and a logger given only to the inbox serve the consumer driving it
// too: the consumer reports its events to those hooks and logs to that
// logger, and each event reaches a hook once (the inbox, under a consumer,
// reports no outcome itself), while the inbox's tracers still see each
// message once.
func TestMemHooksAndLoggerGivenOnlyToTheInbox(t *testing.T) {
	e := newMemEnv(t, 1)
	var logs lockedBuffer
	var traced atomic.Int32
	tracer := &hooks.Funcs{Message: func(ctx context.Context, _ storage.InboxRow) (context.Context, func(hooks.Kind, error)) {
		traced.Add(1)
		return ctx, nil
	}}
	ib, err := inbox.New(e.db, e.store, inbox.Config{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Hooks:  []hooks.Hook{hooks.EventFunc(e.record), tracer},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) })
	cfg.Inbox, cfg.Hooks, cfg.Logger = ib, nil, nil
	e.produce(0, event("a", "1"), event("b", "2"), event("a", "1 again"))
	r := e.start(cfg)
	e.committedTo(0, 3)
	r.close(t)
	if p, d := e.count(hooks.Processed), e.count(hooks.Duplicate); p != 2 || d != 1 {
		t.Errorf("%d processed and %d duplicate events, want 2 and 1, each once", p, d)
	}
	if a, c := e.count(hooks.Assigned), e.count(hooks.Committed); a != 1 || c == 0 {
		t.Errorf("%d assigned and %d committed events, want 1 and some", a, c)
	}
	if n := traced.Load(); n != 3 {
		t.Errorf("the inbox's tracer saw %d messages, want 3", n)
	}
	if !strings.Contains(logs.String(), `msg="consumer started"`) || !strings.Contains(logs.String(), "component=inbox-consumer") {
		t.Errorf("the inbox's logger did not receive the consumer's logs:\n%s", tail(logs.String(), 20))
	}
	if strings.Contains(e.logs.String(), `msg="consumer started"`) {
		t.Error("the consumer logged to a logger it was not given")
	}
}

// A consumer's own Hooks and Logger win over its inbox's; an empty,
// non-nil Hooks list gives the consumer none.
func TestConsumerHooksAndLoggerOverrideTheInboxs(t *testing.T) {
	e := newMemEnv(t, 1)
	inboxHook := hooks.EventFunc(func(hooks.Event) {})
	ib, err := inbox.New(e.db, e.store, inbox.Config{Logger: slog.New(slog.DiscardHandler), Hooks: []hooks.Hook{inboxHook}})
	if err != nil {
		t.Fatal(err)
	}
	own := slog.New(slog.DiscardHandler)
	cfg := e.config(func(ctx context.Context, tx *gorm.DB, m Message) error { return apply(tx, m) })
	cfg.Inbox, cfg.Logger = ib, own
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Logger != own || len(c.hooks.All()) != 1 {
		t.Errorf("consumer with its own logger and one hook of its own has logger %p (want %p) and %d hooks", c.cfg.Logger, own, len(c.hooks.All()))
	}
	cfg.Hooks = []hooks.Hook{}
	if c, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if c.hooks.HasEvents() {
		t.Error("an empty Hooks list took the inbox's hooks")
	}
	cfg.Hooks, cfg.Logger = nil, nil
	if c, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if len(c.hooks.All()) != 1 || !c.hooks.HasEvents() {
		t.Errorf("nil Hooks: the consumer has %d hooks, want the inbox's one", len(c.hooks.All()))
	}
}

// Each refusal of New names the field it is about by its path in Config.
func TestConfigErrorsNameTheFieldPaths(t *testing.T) {
	ok := Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"}, Inbox: &inbox.Inbox{}, Consumer: "c",
		Handler: func(context.Context, *gorm.DB, Message) error { return nil }}
	for want, mutate := range map[string]func(*Config){
		"no Brokers (and no Kafka.Transport)":                     func(c *Config) { c.Brokers = nil },
		"Failure.Policy DeadLetter needs Failure.DeadLetterTopic": func(c *Config) { c.Failure.Policy = DeadLetter },
		`topic "t" of Topics is also Failure.DeadLetterTopic`: func(c *Config) {
			c.Failure.Policy, c.Failure.DeadLetterTopic = DeadLetter, "t"
		},
		"unknown Failure.Policy 7":      func(c *Config) { c.Failure.Policy = 7 },
		"negative Failure.MaxAttempts":  func(c *Config) { c.Failure.MaxAttempts = -1 },
		"negative Failure.MinBackoff":   func(c *Config) { c.Failure.MinBackoff = -1 },
		"negative Failure.MaxBackoff":   func(c *Config) { c.Failure.MaxBackoff = -1 },
		"negative Kafka.MaxWait":        func(c *Config) { c.Kafka.MaxWait = -1 },
		"negative Timeouts.Handler":     func(c *Config) { c.Timeouts.Handler = -1 },
		"negative BatchSize":            func(c *Config) { c.BatchSize = -1 },
		"Kafka.StartOffset must be":     func(c *Config) { c.Kafka.StartOffset = 42 },
		"Offsets.Table: inbox: invalid": func(c *Config) { c.Offsets.Table = "x; DROP TABLE y" },
		"Sequenced.Sources: ":           func(c *Config) { c.Sequenced.Sources = []string{""} },
		"Timeouts.ProcessingStall (10s) must exceed Timeouts.Database (30s) and Timeouts.Handler (0s)": func(c *Config) {
			c.Timeouts.ProcessingStall = 10 * time.Second
		},
		`Failure.DeadLetterWriter is a *kafka.Writer with Topic "t.dlq" set`: func(c *Config) {
			c.Failure.Policy, c.Failure.DeadLetterTopic = DeadLetter, "t.dlq"
			c.Failure.DeadLetterWriter = &kafka.Writer{Topic: "t.dlq"}
		},
		"Offsets.Store needs an inbox store that implements storage.OffsetStore": func(c *Config) {
			c.Inbox, c.NaturallyIdempotent, c.DB, c.Classifier = nil, true, &gorm.DB{}, errorClassifier{}
			c.Offsets.Store = true
		},
	} {
		cfg := ok
		mutate(&cfg)
		if _, err := New(cfg); !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v, want ErrInvalidConfig saying %q", err, want)
		}
	}
}

type errorClassifier struct{}

func (errorClassifier) IsRetryable(error) bool { return false }
