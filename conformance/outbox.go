package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// OutboxHarness is one isolated environment for one outbox check.
type OutboxHarness struct {
	// DB is a connection to a database in which the suite may create and
	// drop its own scratch tables.
	DB *gorm.DB
	// Store is a fresh outbox Store whose tables no other harness uses. The
	// suite calls Migrate itself.
	Store storage.OutboxStore
	// Open, if set, opens another connection pool to the same database, as
	// another relay process would.
	Open func(ctx context.Context) (*gorm.DB, error)
	// Close releases the harness; it may drop the Store's tables.
	Close func() error
}

// OutboxHarnessMaker returns a fresh outbox harness. It is called once per
// check.
type OutboxHarnessMaker func(ctx context.Context) (*OutboxHarness, error)

// OutboxCheck is one named property of an outbox Store.
type OutboxCheck struct {
	Area, Name string
	Doc        string // what it proves, in one sentence
	Run        func(ctx context.Context, env *OutboxEnv) error
}

// ID returns "outbox-area/name".
func (c OutboxCheck) ID() string { return "outbox-" + c.Area + "/" + c.Name }

// OutboxChecks returns every outbox check in its fixed order.
func OutboxChecks() []OutboxCheck {
	var all []OutboxCheck
	for _, area := range [][]OutboxCheck{outboxEnqueueChecks, outboxOrderChecks, outboxRelayChecks, outboxExpiryChecks} {
		all = append(all, area...)
	}
	return all
}

// RunOutbox runs every outbox check as a subtest named by its ID, each with
// a fresh harness.
func RunOutbox(t *testing.T, newHarness OutboxHarnessMaker) {
	t.Helper()
	for _, c := range OutboxChecks() {
		t.Run(c.ID(), func(t *testing.T) {
			if err := RunOutboxCheck(t.Context(), newHarness, c); err != nil {
				t.Error(err)
			}
		})
	}
}

// RunOutboxCheck runs one outbox check with a fresh harness and returns what
// it found wrong, or nil.
func RunOutboxCheck(ctx context.Context, newHarness OutboxHarnessMaker, c OutboxCheck) (err error) {
	ctx, cancel := context.WithTimeout(ctx, CheckTimeout)
	defer cancel()
	h, err := newHarness(ctx)
	if err != nil {
		return fmt.Errorf("%s: harness: %w", c.ID(), err)
	}
	defer closeHarness(c.ID(), h.Close, &err)
	if h.DB == nil || h.Store == nil {
		return fmt.Errorf("%s: harness without DB or Store", c.ID())
	}
	now := time.Now().UTC()
	env := &OutboxEnv{H: h, Clock: &Clock{now: now}, Today: storage.DayOf(now), effects: "conformance_effects_" + randomHex(6)}
	if err := h.DB.WithContext(ctx).Table(env.effects).Migrator().CreateTable(&effectRow{}); err != nil {
		return fmt.Errorf("%s: create effects table: %w", c.ID(), err)
	}
	defer func() { _ = h.DB.Migrator().DropTable(env.effects) }()
	if err := env.Outbox().Migrate(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", c.ID(), err)
	}
	return runRecovered(c.ID(), func() error { return c.Run(ctx, env) })
}

// OutboxEnv is what an outbox check works with.
type OutboxEnv struct {
	H     *OutboxHarness
	Clock *Clock
	Today time.Time

	effects string
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Outbox returns an outbox over the harness with the env's clock.
func (env *OutboxEnv) Outbox(adjust ...func(*outbox.Config)) *outbox.Outbox {
	return env.OutboxOn(env.H.DB, adjust...)
}

// OutboxOn is Outbox over another connection pool.
func (env *OutboxEnv) OutboxOn(db *gorm.DB, adjust ...func(*outbox.Config)) *outbox.Outbox {
	cfg := outbox.Config{Logger: quiet, MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 50, Now: env.Clock.Now}
	for _, f := range adjust {
		f(&cfg)
	}
	ob, err := outbox.New(db, env.H.Store, cfg)
	if err != nil {
		panic(err) // the suite's own configuration is valid
	}
	return ob
}

// Effect records one application of an effect labelled name through tx.
func (env *OutboxEnv) Effect(tx *gorm.DB, name string) error {
	return tx.Table(env.effects).Create(&effectRow{Label: label("outbox", name)}).Error
}

// Effects counts the committed effects labelled name.
func (env *OutboxEnv) Effects(ctx context.Context, name string) (int64, error) {
	var n int64
	err := env.H.DB.WithContext(ctx).Table(env.effects).Where("label = ?", label("outbox", name)).Count(&n).Error
	return n, err
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
func (env *OutboxEnv) Relay(ob *outbox.Outbox, pub outbox.Publisher, id string, adjust ...func(*outbox.RelayConfig)) *outbox.Relay {
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
	total := 0
	for {
		n, err := r.PublishOnce(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil
		}
	}
}

// HeaderValue returns the value of the first header key of m.
func HeaderValue(m kafka.Message, key string) (string, bool) {
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
