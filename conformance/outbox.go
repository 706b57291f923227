package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Outbox returns an outbox over the harness's Outbox store with the env's
// clock; adjust changes its configuration.
func (env *Env) Outbox(adjust ...func(*outbox.Config)) *outbox.Outbox {
	return env.OutboxOn(env.H.DB, adjust...)
}

// OutboxOn is Outbox over another connection pool.
func (env *Env) OutboxOn(db *gorm.DB, adjust ...func(*outbox.Config)) *outbox.Outbox {
	cfg := outbox.Config{Logger: quiet, MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 50, Now: env.Clock.Now}
	return built(cfg, adjust, func(cfg outbox.Config) (*outbox.Outbox, error) { return outbox.New(db, env.H.Outbox, cfg) })
}

// outboxEffect is the message whose effect (Env.Apply, Env.Effects) the
// outbox checks label name.
func outboxEffect(name string) inbox.Message {
	return inbox.Message{Consumer: "outbox", ID: name}
}

// Recorder is a Publisher that keeps what it was given, in order, standing
// in for Kafka. Fail, if set, decides the fate of each call.
type Recorder struct {
	mu   sync.Mutex
	got  []kafka.Message
	Fail func(msgs []kafka.Message) error
}

// Publish records msgs unless Fail fails them; with kafka.WriteErrors only
// the messages without an error are recorded.
func (r *Recorder) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.Fail != nil {
		err = r.Fail(msgs)
	}
	var each kafka.WriteErrors
	perMessage := errors.As(err, &each) && len(each) == len(msgs)
	for i, m := range msgs {
		if err == nil || (perMessage && each[i] == nil) {
			r.got = append(r.got, m)
		}
	}
	return err
}

// Messages returns what was published so far.
func (r *Recorder) Messages() []kafka.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kafka.Message(nil), r.got...)
}

// Relay returns a relay of ob through pub with the suite's settings.
func (env *Env) Relay(ob *outbox.Outbox, pub outbox.Publisher, id string, adjust ...func(*outbox.RelayConfig)) *outbox.Relay {
	cfg := outbox.RelayConfig{ID: id, Lease: 10 * time.Second, PollInterval: 5 * time.Millisecond, MaxMessages: 50}
	for _, f := range adjust {
		f(&cfg)
	}
	r, err := ob.NewRelay(pub, cfg)
	if err != nil {
		panic(err)
	}
	return r
}

// Drain runs r's cycles until one finds nothing to publish, and returns how
// many messages it published.
func Drain(ctx context.Context, r *outbox.Relay) (int, error) {
	return r.Drain(ctx)
}

// headerValue returns the value of the first header key of m.
func headerValue(m kafka.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// checkKeyOrder checks that, for each topic and key, the first occurrences
// of the published values follow want (the commit order per key), that
// every wanted value arrived, and that nothing else did.
func checkKeyOrder(got []kafka.Message, want map[string][]string) error {
	firsts := map[string][]string{}
	seen := map[string]bool{}
	for _, m := range got {
		k := m.Topic + "/" + string(m.Key)
		id := k + "/" + string(m.Value)
		if seen[id] {
			continue
		}
		seen[id] = true
		firsts[k] = append(firsts[k], string(m.Value))
	}
	for k, w := range want {
		g := firsts[k]
		if len(g) != len(w) {
			return fmt.Errorf("key %s: %d distinct messages published, want %d (got %q, want %q)", k, len(g), len(w), g, w)
		}
		for i := range w {
			if g[i] != w[i] {
				return fmt.Errorf("key %s: published out of order: got %q, want %q", k, g, w)
			}
		}
	}
	for k := range firsts {
		if _, ok := want[k]; !ok {
			return fmt.Errorf("key %s: published %q, want nothing", k, firsts[k])
		}
	}
	return nil
}
