package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// wakeupPostgres makes an outbox table in a schema of its own.
func wakeupPostgres(t *testing.T) (*gorm.DB, *inboxpg.OutboxStore) {
	t.Helper()
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	schema := "wake_" + conformance.RandomSuffix()
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Table: "ob", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db, store
}

// publishedWithin waits until rec holds n messages and returns how long it
// took, or fails after limit.
func publishedWithin(t *testing.T, rec *conformance.Recorder, n int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for len(rec.Messages()) < n {
		if time.Since(start) > limit {
			t.Fatalf("%d of %d messages published after %v", len(rec.Messages()), n, limit)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// runRelay runs relay until the test ends.
func runRelay(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("relay ended with %v", err)
		}
	})
}

// listenerPID returns the backend pid of the connection listening on
// channel, waiting for one to appear that is not in not.
func listenerPID(t *testing.T, db *gorm.DB, channel string, not ...int64) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pids []int64
		db.Raw(`SELECT pid FROM pg_stat_activity WHERE query = ?`, `LISTEN "`+channel+`"`).Scan(&pids)
		for _, p := range pids {
			fresh := true
			for _, o := range not {
				fresh = fresh && p != o
			}
			if fresh {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection listens on %s (other than %v)", channel, not)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A commit of another process (here another Outbox over the table, whose
// in-process signal does not reach the relay) wakes a relay on PostgreSQL
// by its notification: the message goes out long before the safety poll.
// The relay polls only every safety (MinPollInterval too), so no poll
// finds the messages in time; each is enqueued once the last is marked
// published.
func TestRelayWakesOnNotification(t *testing.T) {
	db, store := wakeupPostgres(t)
	ob, other := newOutbox(t, db, store, outbox.Config{}), newOutbox(t, db, store, outbox.Config{})
	rec := &conformance.Recorder{}
	const safety = 10 * time.Second
	relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "r", PollInterval: safety, MinPollInterval: safety})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	listenerPID(t, db, store.Channel())
	time.Sleep(50 * time.Millisecond) // the first cycles, on an empty table
	for i := range 5 {
		if err := enqueue(t.Context(), db, other, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
		if took := publishedWithin(t, rec, i+1, safety); took > time.Second {
			t.Fatalf("message %d published %v after its commit, want well within a second", i, took)
		}
		// Only a commit to a shard published through notifies: the next
		// one waits for the mark.
		for relay.Counters().Published < uint64(i+1) {
			time.Sleep(time.Millisecond)
		}
	}
}

// A lost notification delays a message by at most the safety poll and
// never loses it. The listening connection is killed on the server: the
// relay logs it, polls, listens again, and notifications work again. And a
// relay whose notifications are all lost while it believes it listens
// publishes every message within the safety poll.
func TestRelayLostNotification(t *testing.T) {
	db, store := wakeupPostgres(t)
	const safety = 2 * time.Second

	t.Run("killed", func(t *testing.T) {
		ob, other := newOutbox(t, db, store, outbox.Config{}), newOutbox(t, db, store, outbox.Config{})
		rec := &conformance.Recorder{}
		relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "killed", PollInterval: safety})
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, relay)
		pid := listenerPID(t, db, store.Channel())
		var killed bool
		if err := db.Raw(`SELECT pg_terminate_backend(?)`, pid).Scan(&killed).Error; err != nil || !killed {
			t.Fatalf("terminate the listener %d: %v %v", pid, killed, err)
		}
		if err := enqueue(t.Context(), db, other, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("after the kill")}); err != nil {
			t.Fatal(err)
		}
		if took := publishedWithin(t, rec, 1, safety+time.Second); took > safety+500*time.Millisecond {
			t.Fatalf("published %v after its commit, more than the safety poll %v", took, safety)
		}
		// It listens again, on a new connection, and is woken again.
		listenerPID(t, db, store.Channel(), pid)
		time.Sleep(100 * time.Millisecond) // its first cycle after it listens again
		if err := enqueue(t.Context(), db, other, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("listening again")}); err != nil {
			t.Fatal(err)
		}
		if took := publishedWithin(t, rec, 2, safety+time.Second); took > safety/2 {
			t.Fatalf("published %v after its commit once the relay listens again, want a wake-up", took)
		}
	})

	t.Run("lost", func(t *testing.T) {
		deaf := &deafNotifier{OutboxStore: store}
		ob, other := newOutbox(t, db, deaf, outbox.Config{}), newOutbox(t, db, store, outbox.Config{})
		rec := &conformance.Recorder{}
		relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "deaf", PollInterval: safety})
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, relay)
		for deaf.listening.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // the first cycles, past the wake-up of the connection
		for i := range 3 {
			if err := enqueue(t.Context(), db, other, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("lost " + strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
			if took := publishedWithin(t, rec, i+1, safety+time.Second); took > safety+500*time.Millisecond {
				t.Fatalf("message %d published %v after its commit, more than the safety poll %v", i, took, safety)
			}
		}
	})
}

// deafNotifier listens and drops every notification: the relay believes
// it is woken, and only its safety poll finds the messages.
type deafNotifier struct {
	*inboxpg.OutboxStore
	listening atomic.Int32
}

func (d *deafNotifier) Listen(ctx context.Context, db *gorm.DB) (storage.Listener, error) {
	l, err := d.OutboxStore.Listen(ctx, db)
	if err != nil {
		return nil, err
	}
	d.listening.Add(1)
	return deafListener{l}, nil
}

type deafListener struct{ storage.Listener }

func (l deafListener) Wait(ctx context.Context) error {
	for {
		if err := l.Listener.Wait(ctx); err != nil {
			return err
		}
	}
}

// On a database without notifications (MariaDB, SQLite), an enqueue in the relay's process
// wakes it. A transaction that tells its commit (an inbox handler's) wakes
// it after the commit: the relay finds the message at once, with polls as
// long as the safety poll. Any other transaction wakes it at Enqueue,
// before its commit: the relay then polls again soon, and backs off. (On
// SQLite the relay's claim waits for the enqueuer's write lock, so both
// find the message at once.)
func runWakesInProcess(t *testing.T, db *gorm.DB, store storage.OutboxStore, ibStore storage.InboxStore) {
	ob := newOutbox(t, db, store, outbox.Config{})
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	const safety = 10 * time.Second

	t.Run("after commit", func(t *testing.T) {
		rec := &conformance.Recorder{}
		relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "after", PollInterval: safety, MinPollInterval: safety})
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, relay)
		ib, err := inbox.New(db, ibStore, inbox.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ib.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the first cycle, on an empty table
		for i := range 3 {
			msg := inbox.Message{Consumer: "wake", ID: "e" + strconv.Itoa(i), Time: time.Now()}
			_, err := ib.Process(t.Context(), msg, func(ctx context.Context, tx *gorm.DB, _ inbox.Message) error {
				// Held past the relay's reaction: a wake-up at Enqueue would
				// find nothing and wait for the safety poll.
				if err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte(msg.ID)}); err != nil {
					return err
				}
				time.Sleep(20 * time.Millisecond)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if took := publishedWithin(t, rec, i+1, safety+time.Second); took > time.Second {
				t.Fatalf("message %d published %v after its commit, want a wake-up", i, took)
			}
		}
	})

	t.Run("before commit", func(t *testing.T) {
		rec := &conformance.Recorder{}
		relay, err := ob.NewRelay(rec, outbox.RelayConfig{ID: "before", PollInterval: safety})
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, relay)
		time.Sleep(50 * time.Millisecond)
		for i := range 3 {
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := ob.Enqueue(t.Context(), tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("b" + strconv.Itoa(i))}); err != nil {
					return err
				}
				time.Sleep(20 * time.Millisecond)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if took := publishedWithin(t, rec, i+1, safety+time.Second); took > time.Second {
				t.Fatalf("message %d published %v after its commit, want a wake-up", i, took)
			}
		}
	})
}

func TestRelayWakesInProcessMariaDB(t *testing.T) {
	c := mysqlChain(t)
	suffix := conformance.RandomSuffix()
	store, err := c.newOutbox("wake_ob_" + suffix)
	if err != nil {
		t.Fatal(err)
	}
	ibStore, err := c.newInbox("wake_ib_" + suffix)
	if err != nil {
		t.Fatal(err)
	}
	runWakesInProcess(t, c.db, store, ibStore)
}
