package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/chaos"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
)

// A database link that freezes: the packets are dropped, nothing is closed
// (no RST, no FIN), as when a network path or a switch dies. Each consumer
// process reaches the database through a link of its own, here a proxy
// (dev/chaos.Proxy) that stops forwarding. Kafka stays reachable, so a
// frozen member keeps heartbeating.

// frozenBackend opens a shop on a real server, and the same shop (its
// inbox on the same tables) reached through a proxy.
type frozenBackend struct {
	name    string
	open    func(t *testing.T) *shop
	through func(t *testing.T, s *shop, serverSide bool) (*shop, *chaos.Proxy)
}

var frozenBackends = []frozenBackend{
	{"postgres", newPostgresShop, postgresThrough},
	{"mysql", newMySQLShop, mysqlThrough},
}

// newLinkProxy starts a proxy to target, closed when the test ends.
func newLinkProxy(t *testing.T, target string) *chaos.Proxy {
	t.Helper()
	px, err := chaos.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	return px
}

// postgresThrough opens s's PostgreSQL database through a proxy (pgx, as
// newPostgresShop does, so that the pipelined BEGIN and claim is used).
// With serverSide, its sessions carry the server-side setting the docs
// recommend, idle_in_transaction_session_timeout (3 s here): the server
// then ends a session whose client went silent inside a transaction,
// releasing its locks.
func postgresThrough(t *testing.T, s *shop, serverSide bool) (*shop, *chaos.Proxy) {
	t.Helper()
	dsn := testservers.PostgresDSN(t)
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px := newLinkProxy(t, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
	host, port, _ := net.SplitHostPort(px.Addr())
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = px.Addr()
		if serverSide {
			q := u.Query()
			q.Set("idle_in_transaction_session_timeout", "3000")
			u.RawQuery = q.Encode()
		}
		dsn = u.String()
	} else {
		dsn += " host=" + host + " port=" + port // later keywords win
		if serverSide {
			dsn += " idle_in_transaction_session_timeout=3000"
		}
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	store, err := inboxpg.New(inboxpg.Options{Table: "inbox_e2e" + s.suffix})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: testLogger(t), RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	return &shop{db: db, ib: ib, suffix: s.suffix}, px
}

// mysqlThrough opens s's MariaDB database through a proxy. With
// serverSide, its sessions set idle_transaction_timeout (MariaDB; 3 s
// here), as the docs recommend.
func mysqlThrough(t *testing.T, s *shop, serverSide bool) (*shop, *chaos.Proxy) {
	t.Helper()
	mc, err := gomysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	px := newLinkProxy(t, mc.Addr)
	mc.Addr = px.Addr()
	if serverSide {
		if mc.Params == nil {
			mc.Params = map[string]string{}
		}
		mc.Params["idle_transaction_timeout"] = "3"
	}
	d, err := inboxmysql.Open(mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	store, err := inboxmysql.New(inboxmysql.Options{Table: "inbox_e2e" + s.suffix})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: testLogger(t), RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	return &shop{db: db, ib: ib, suffix: s.suffix}, px
}

// closeDB closes db's pool without waiting for connections still held by a
// COMMIT frozen in a proxy (sql.DB.Close waits for none of them).
func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

// frozenConfig is a consumer with the settings of the outage seen in
// production: a 6 s session, a 5 s handler timeout, the database's own
// steps bounded at 2 s.
func frozenConfig(t *testing.T, brokers []string, s *shop, ev *events) consumer.Config {
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Kafka.SessionTimeout = 6 * time.Second
	cfg.Timeouts.Handler = 5 * time.Second
	cfg.Timeouts.Database = 2 * time.Second
	cfg.Timeouts.ProcessingStall = 5 * time.Minute // the member keeps its partitions unless a test says otherwise
	cfg.Failure.MaxBackoff = 200 * time.Millisecond
	return cfg
}

// chargedAttempts returns the retries a consumer charged to a message's
// attempts (hooks.RetryMessage) and its dead letters.
func chargedAttempts(ev *events) (retries, deadLetters []hooks.Event) {
	for _, e := range ev.filter(hooks.Retry) {
		if e.Scope == hooks.RetryMessage {
			retries = append(retries, e)
		}
	}
	return retries, ev.filter(hooks.DeadLettered)
}

// errorRecords returns the records at Error or above.
func (r *recorder) errorRecords() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range *r.recs {
		if rec.Level >= slog.LevelError {
			out = append(out, rec)
		}
	}
	return out
}

// (a) A link that freezes while the handler's statement is on its way is
// the database's failure, not the message's: the handler's timeout fires
// on the frozen statement, but a ping on another connection gets no answer
// either, so no attempt is charged (with MaxAttempts 1 a charged attempt
// dead-letters the message at once), and nothing is logged at Error.
// After the link heals the message is applied once.
func TestFrozenDatabaseChargesNoAttempt(t *testing.T) {
	for _, be := range frozenBackends {
		t.Run(be.name, func(t *testing.T) {
			s := be.open(t)
			sa, px := be.through(t, s, false)
			brokers := newKfake(t, 1, "orders")
			ev := newEvents()
			rec := newRecorder(t)
			dlq := &fakeWriter{}
			cfg := frozenConfig(t, brokers, sa, ev)
			cfg.Timeouts.Handler = 2 * time.Second
			cfg.Failure.Policy, cfg.Failure.DeadLetterTopic, cfg.Failure.DeadLetterWriter, cfg.Failure.MaxAttempts = consumer.DeadLetter, "orders.dlq", dlq, 1
			cfg.Logger = slog.New(rec)
			inHandler, proceed := make(chan struct{}), make(chan struct{})
			var calls atomic.Int32
			cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
				if string(msg.Key) == "order-1" && calls.Add(1) == 1 {
					close(inHandler)
					<-proceed
				}
				return sa.reserve(ctx, tx, msg) // into the blackhole, the first time
			}
			r := start(t, cfg)
			produce(t, brokers, "orders", orderMessage(0, 0))
			waitUntil(t, 30*time.Second, "order 0", func() bool { return ev.count(hooks.Processed) == 1 })

			produce(t, brokers, "orders", orderMessage(1, 0))
			select {
			case <-inHandler:
			case <-time.After(30 * time.Second):
				t.Fatal("the handler was not called for order 1")
			}
			px.Freeze()
			close(proceed)
			// Long enough for the handler's timeout, the probe and a few
			// bounded retries.
			time.Sleep(9 * time.Second)
			px.Heal()
			waitUntil(t, 60*time.Second, "order 1 processed or dead-lettered", func() bool {
				return ev.count(hooks.Processed)+ev.count(hooks.DeadLettered) >= 2
			})
			produce(t, brokers, "orders", orderMessage(2, 0), orderMessage(3, 0))
			waitUntil(t, 30*time.Second, "orders 2 and 3", func() bool {
				return ev.count(hooks.Processed)+ev.count(hooks.DeadLettered) >= 4
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}

			retries, dead := chargedAttempts(ev)
			for _, e := range retries {
				t.Errorf("an attempt was charged to offset %d during the freeze: %v", e.Offset, e.Err)
			}
			for _, e := range dead {
				t.Errorf("offset %d was dead-lettered during the freeze: %v", e.Offset, e.Err)
			}
			if n := dlq.count(); n != 0 {
				t.Errorf("%d dead letters published", n)
			}
			for _, rec := range rec.errorRecords() {
				t.Errorf("logged at %v: %s", rec.Level, rec.Message)
			}
			if calls.Load() < 2 {
				t.Errorf("the handler ran %d times for order 1, want it run again after the freeze", calls.Load())
			}
			s.checkExactlyOnce(t, 4, nil)
		})
	}
}

// (c) The inbox's own steps on the database are bounded by Timeouts.Database:
// a BEGIN (with the pipelined claim on PostgreSQL) sent into a frozen link,
// and a COMMIT sent into it after the handler's work, each give up within
// the bound and are retried as a database failure (the batch loop, without
// an attempt). The COMMIT's outcome is unknown to the consumer (here it
// reaches the server once the link heals, and commits): the redelivery
// finds the inbox row, so every order is applied once.
func TestFrozenDatabaseWorkTimesOut(t *testing.T) {
	for _, be := range frozenBackends {
		for _, step := range []string{"begin", "commit"} {
			t.Run(be.name+"/"+step, func(t *testing.T) {
				s := be.open(t)
				sa, px := be.through(t, s, false)
				brokers := newKfake(t, 1, "orders")
				ev := newEvents()
				cfg := frozenConfig(t, brokers, sa, ev)
				bound := cfg.Timeouts.Database
				handlerDone, proceed := make(chan struct{}), make(chan struct{})
				var calls atomic.Int32
				cfg.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
					err := sa.reserve(ctx, tx, msg)
					if step == "commit" && string(msg.Key) == "order-1" && calls.Add(1) == 1 {
						close(handlerDone)
						<-proceed // the link freezes now: only COMMIT is left
					}
					return err
				}
				var mu sync.Mutex
				var firstFailure time.Time
				var failure error
				ev.hook.Store(ptr(func(e hooks.Event) {
					if e.Kind == hooks.Retry && e.Scope == hooks.RetryBatch {
						mu.Lock()
						if firstFailure.IsZero() {
							firstFailure, failure = time.Now(), e.Err
						}
						mu.Unlock()
					}
				}))
				r := start(t, cfg)
				produce(t, brokers, "orders", orderMessage(0, 0))
				waitUntil(t, 30*time.Second, "order 0", func() bool { return ev.count(hooks.Processed) == 1 })

				var frozenAt time.Time
				if step == "begin" {
					px.Freeze()
					frozenAt = time.Now()
					produce(t, brokers, "orders", orderMessage(1, 0))
				} else {
					produce(t, brokers, "orders", orderMessage(1, 0))
					select {
					case <-handlerDone:
					case <-time.After(30 * time.Second):
						t.Fatal("the handler was not called for order 1")
					}
					px.Freeze()
					frozenAt = time.Now()
					close(proceed)
				}
				limit := bound + 3*time.Second // the fetch, the scheduler of a shared machine
				deadline := frozenAt.Add(limit + 5*time.Second)
				for time.Now().Before(deadline) {
					mu.Lock()
					done := !firstFailure.IsZero()
					mu.Unlock()
					if done {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				mu.Lock()
				took, err := firstFailure.Sub(frozenAt), failure
				mu.Unlock()
				px.Heal()
				switch {
				case err == nil:
					t.Errorf("the %s sent into the frozen link was not given up within %v (DatabaseTimeout %v)", step, limit+5*time.Second, bound)
				case took > limit:
					t.Errorf("the %s was given up after %v, want within %v (DatabaseTimeout %v)", step, took, limit, bound)
				case !inbox.IsDatabaseFailure(err) || !errors.Is(err, context.DeadlineExceeded):
					t.Errorf("the batch failed with %v, want a database failure wrapping context.DeadlineExceeded", err)
				default:
					t.Logf("the %s gave up after %v: %v", step, took, err)
				}

				waitUntil(t, 60*time.Second, "order 1 after the link healed", func() bool {
					return ev.count(hooks.Processed)+ev.count(hooks.Duplicate) >= 2
				})
				if err := r.stop(t); err != nil {
					t.Fatal(err)
				}
				retries, dead := chargedAttempts(ev)
				if len(retries)+len(dead) > 0 {
					t.Errorf("attempts charged during the freeze: %v, dead letters: %v", retries, dead)
				}
				s.checkExactlyOnce(t, 2, nil)
			})
		}
	}
}

func ptr[T any](v T) *T { return &v }

// owner follows which partitions each member holds, from its Assigned and
// Revoked events.
type owner struct {
	mu    sync.Mutex
	owned map[int]bool
}

func follow(ev *events) *owner {
	o := &owner{owned: map[int]bool{}}
	ev.hook.Store(ptr(func(e hooks.Event) {
		o.mu.Lock()
		defer o.mu.Unlock()
		switch e.Kind {
		case hooks.Assigned:
			o.owned[e.Partition] = true
		case hooks.Revoked:
			delete(o.owned, e.Partition)
		}
	}))
	return o
}

func (o *owner) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.owned)
}

// (b) Two members, each reaching the database through a link of its own;
// one link freezes for 40 s. The frozen member cannot make progress and
// keeps heartbeating (Kafka is fine), so the group would leave its
// partitions with it for as long as the link is frozen. After
// Timeouts.ProcessingStall it leaves the group: its partitions move to the
// healthy member within Timeouts.ProcessingStall + SessionTimeout (and the
// rebalance), and everything produced meanwhile is processed there. Once
// its database answers again (the link heals, or is cut and reconnects) it
// rejoins. Every order is applied once, none is charged an attempt.
//
// In the in-transaction runs the link freezes while the frozen member's
// transaction holds a message's inbox row (claimed, COMMIT not yet sent):
// the server keeps that row locked until it ends the session, which its
// idle-in-transaction timeout does (the setting the docs recommend);
// then the healthy member claims and applies the message.
func TestFrozenMemberGivesUpItsPartitions(t *testing.T) {
	const partitions = 4
	for _, tc := range []struct {
		be    frozenBackend
		inTx  bool
		ended string // heal or cut
	}{
		{frozenBackends[0], false, "heal"},
		{frozenBackends[0], true, "cut"},
		{frozenBackends[1], false, "cut"},
		{frozenBackends[1], true, "heal"},
	} {
		when := map[bool]string{false: "idle", true: "in-transaction"}[tc.inTx]
		t.Run(tc.be.name+"/"+when+"/"+tc.ended, func(t *testing.T) {
			s := tc.be.open(t)
			sa, px := tc.be.through(t, s, tc.inTx)
			brokers := newKfake(t, partitions, "orders")
			evA, evB := newEvents(), newEvents()
			ownA, ownB := follow(evA), follow(evB)
			cfgA := frozenConfig(t, brokers, sa, evA)
			cfgA.Timeouts.ProcessingStall = 8 * time.Second
			var hold atomic.Bool
			inTx, proceed := make(chan struct{}), make(chan struct{})
			cfgA.Handler = func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
				err := sa.reserve(ctx, tx, msg)
				if hold.CompareAndSwap(true, false) {
					close(inTx)
					<-proceed // the link freezes now, before COMMIT
				}
				return err
			}
			cfgB := frozenConfig(t, brokers, s, evB)
			cfgB.Timeouts.ProcessingStall = 8 * time.Second
			a := start(t, cfgA)
			b := start(t, cfgB)
			send := func(from, to int) {
				var msgs = make([]kafka.Message, 0, to-from)
				for i := from; i < to; i++ {
					msgs = append(msgs, orderMessage(i, i%partitions))
				}
				produce(t, brokers, "orders", msgs...)
			}
			applied := func(n int) func() bool {
				return func() bool { return len(s.counts(t)) >= n }
			}
			send(0, 8)
			waitUntil(t, 60*time.Second, "both members sharing the partitions, orders 0-7 applied", func() bool {
				return ownA.count() > 0 && ownB.count() > 0 && ownA.count()+ownB.count() == partitions && applied(8)()
			})
			time.Sleep(500 * time.Millisecond) // the offsets committed, both idle

			var frozenAt time.Time
			if tc.inTx {
				hold.Store(true)
				send(8, 16)
				select {
				case <-inTx:
				case <-time.After(30 * time.Second):
					t.Fatal("the member to be frozen handled none of orders 8-15")
				}
				px.Freeze()
				frozenAt = time.Now()
				close(proceed)
			} else {
				px.Freeze()
				frozenAt = time.Now()
				send(8, 16)
			}
			bound := cfgA.Timeouts.ProcessingStall + cfgA.Kafka.SessionTimeout
			limit := bound + 10*time.Second // the rebalance, the fetch, a shared machine
			waitUntil(t, limit, "orders 8-15 applied while the link is frozen", applied(16))
			took := time.Since(frozenAt)
			t.Logf("the healthy member held %d partitions and had applied every order %v after the freeze (MaxProcessingStall %v + SessionTimeout %v)",
				ownB.count(), took.Round(100*time.Millisecond), cfgA.Timeouts.ProcessingStall, cfgA.Kafka.SessionTimeout)
			if n := ownB.count(); n != partitions {
				t.Errorf("the healthy member holds %d partitions, want all %d", n, partitions)
			}
			if rest := 40*time.Second - time.Since(frozenAt); rest > 0 {
				time.Sleep(rest)
			}
			if tc.ended == "heal" {
				px.Heal()
			} else {
				px.Cut()
			}
			waitUntil(t, 60*time.Second, "the frozen member back in the group", func() bool { return ownA.count() > 0 })
			send(16, 24)
			waitUntil(t, 60*time.Second, "orders 16-23", applied(24))
			time.Sleep(500 * time.Millisecond) // a redelivery applied twice would show now
			for _, r := range []*running{a, b} {
				if err := r.stop(t); err != nil {
					t.Fatal(err)
				}
			}
			for name, ev := range map[string]*events{"frozen": evA, "healthy": evB} {
				retries, dead := chargedAttempts(ev)
				if len(retries)+len(dead) > 0 {
					t.Errorf("the %s member charged attempts: %v, dead letters: %v", name, retries, dead)
				}
				if n := ev.count(hooks.PartitionStopped); n > 0 {
					t.Errorf("the %s member stopped %d partitions", name, n)
				}
			}
			s.checkExactlyOnce(t, 24, nil)
		})
	}
}
