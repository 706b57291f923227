package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// TestProducerRestore runs an aligned outbox, a real broker and a consumer
// that deduplicates the outbox's source by watermark, on each database.
// 200 events are published and applied; the producer's outbox tables are
// then put back as a backup had them after the first 100 (10 of those not
// yet published), and 150 new events are enqueued. Every event must be
// applied once, with no operator step: the numbers the restored counters
// hand out again must not make new events duplicates, and the events that
// were unpublished in the backup must not be applied a second time.
func TestProducerRestore(t *testing.T) {
	scenarios := []struct {
		name string
		// bump raises the epoch after the restore, as the operator of a
		// restored database may.
		bump bool
		// survives keeps the relay of before the restore running through
		// it, as a relay whose database failed over under it.
		survives bool
		// clone restores the backup into a second database instead, a copy
		// with the same source whose relay publishes to the same topic
		// while the original's goes on, both enqueuing.
		clone bool
	}{
		{name: "relay restarted, enqueuers first"},
		{name: "epoch bumped before the relay", bump: true},
		{name: "relay lived through it", survives: true},
		{name: "a clone with a relay of its own", clone: true},
	}
	for _, be := range chainBackends {
		t.Run(be.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					runProducerRestore(t, be.open(t), sc.bump, sc.survives, sc.clone)
				})
			}
		})
	}
}

func runProducerRestore(t *testing.T, c chainDB, bump, survives, clone bool) {
	brokers := testservers.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sfx := conformance.RandomSuffix()
	const shards = 16 // chainDB's outbox stores have 16
	topic := "restore-" + sfx
	if err := inventory.CreateTopic(ctx, brokers[0], topic, shards); err != nil {
		t.Fatal(err)
	}
	applied := "applied_" + sfx
	c.drop(applied)
	if err := c.db.Exec(`CREATE TABLE ` + applied + ` (event_id VARCHAR(64) NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}

	obTable := "outbox_r_" + sfx
	ob, obStore := alignedOutbox(ctx, t, c, obTable, topic)
	source, _, err := obStore.(storage.Sequenced).Source(ctx, c.db)
	if err != nil {
		t.Fatal(err)
	}

	ibStore, err := c.newInbox("inbox_r_" + sfx)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(c.db, ibStore, inbox.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := consumer.New(consumer.Config{Brokers: brokers, GroupID: "restore-" + sfx, Topics: []string{topic}, Inbox: ib, Consumer: "apply",
		Sequenced: consumer.SequencedConfig{Sources: []string{source}}, Logger: quiet, Kafka: consumer.KafkaConfig{MaxWait: 100 * time.Millisecond},
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			return tx.Exec(`INSERT INTO `+applied+` (event_id) VALUES (?)`, msg.EventID).Error
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { _ = cons.Run(runCtx) })

	var relays []context.CancelFunc
	startRelay := func(ob *outbox.Outbox, id string) {
		w := outbox.NewKafkaWriter(brokers...)
		kp, err := outbox.NewKafkaPublisher(w)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ob.NewRelay(kp, outbox.RelayConfig{ID: id, Lease: 3 * time.Second, MaxMessages: 40, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rstop := context.WithCancel(runCtx)
		relays = append(relays, rstop)
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			defer w.Close()
			_ = r.Run(rctx)
		})
		relays[len(relays)-1] = func() { rstop(); <-done }
	}
	stopRelays := func() {
		for _, s := range relays {
			s()
		}
		relays = nil
	}
	enqueue := func(ob *outbox.Outbox, prefix string, from, n int) {
		msgs := alignedMessages(topic, from, n, 24)
		for i := range msgs {
			msgs[i].ID = fmt.Sprintf("%s-%04d", prefix, from+i)
		}
		for lo := 0; lo < n; lo += 5 {
			err := c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return ob.Enqueue(ctx, tx, msgs[lo:min(lo+5, n)]...) })
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() (rows, events int64) {
		if err := c.db.Raw(`SELECT COUNT(*) FROM ` + applied).Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		if err := c.db.Raw(`SELECT COUNT(DISTINCT event_id) FROM ` + applied).Scan(&events).Error; err != nil {
			t.Fatal(err)
		}
		return rows, events
	}
	waitFor := func(events int64, within time.Duration) {
		deadline := time.Now().Add(within)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			if _, n := count(); n >= events {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		rows, n := count()
		t.Fatalf("%d events applied (%d applications), want %d", n, rows, events)
	}

	tables := []string{obTable, obTable + "_shards", obTable + "_source"}
	if c.db.Name() != "sqlite" { // SQLite keeps the marks in _shards
		tables = append(tables, obTable+"_relay")
	}
	startRelay(ob, "relay-1")
	enqueue(ob, "ev", 0, 90)
	waitFor(90, time.Minute)
	stopRelays()
	enqueue(ob, "ev", 90, 10) // unpublished when the backup is taken
	for _, table := range tables {
		c.drop("bak_" + table)
		if err := c.db.Exec(`CREATE TABLE ` + c.qualify("bak_"+table) + ` AS SELECT * FROM ` + c.qualify(table)).Error; err != nil {
			t.Fatal(err)
		}
	}
	startRelay(ob, "relay-2")
	enqueue(ob, "ev", 100, 100)
	waitFor(200, time.Minute)
	if clone {
		runClone(t, c, ob, obStore, topic, tables, startRelay, enqueue)
		waitFor(350, 45*time.Second)
		time.Sleep(time.Second)
		rows, events := count()
		if events != 350 || rows != 350 {
			t.Fatalf("%d of 350 events applied, %d applications: %d lost, %d applied twice", events, rows, 350-events, rows-events)
		}
		return
	}
	if !survives {
		stopRelays()
	}

	// The restore.
	err = c.db.Transaction(func(tx *gorm.DB) error {
		for _, table := range tables {
			if err := tx.Exec(`DELETE FROM ` + c.qualify(table)).Error; err != nil {
				return err
			}
			if err := tx.Exec(`INSERT INTO ` + c.qualify(table) + ` SELECT * FROM ` + c.qualify("bak_"+table)).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if bump {
		if _, err := obStore.(storage.Sequenced).BumpEpoch(ctx, c.db); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(ob, "new", 0, 150)
	if !survives {
		startRelay(ob, "relay-3")
	}
	waitFor(350, 45*time.Second)
	time.Sleep(time.Second) // a late copy would show now
	rows, events := count()
	t.Logf("%d events applied, %d applications", events, rows)
	if events != 350 || rows != 350 {
		t.Fatalf("%d of 350 events applied, %d applications: %d lost, %d applied twice", events, rows, 350-events, rows-events)
	}
}

// runClone makes a second outbox over tables of its own holding the
// backup of the first's (its source id included: a copy of the database),
// starts a relay of the clone's beside the original's, and has both
// enqueue 75 new events at the same time.
func runClone(t *testing.T, c chainDB, ob *outbox.Outbox, store storage.OutboxStore, topic string, tables []string,
	startRelay func(*outbox.Outbox, string), enqueue func(*outbox.Outbox, string, int, int)) {
	ctx := t.Context()
	cloneTable := tables[0] + "_c"
	cob, cloneStore := alignedOutbox(ctx, t, c, cloneTable, topic)
	err := c.db.Transaction(func(tx *gorm.DB) error {
		for _, table := range tables {
			to := cloneTable + table[len(tables[0]):]
			if err := tx.Exec(`DELETE FROM ` + c.qualify(to)).Error; err != nil {
				return err
			}
			if err := tx.Exec(`INSERT INTO ` + c.qualify(to) + ` SELECT * FROM ` + c.qualify("bak_"+table)).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := store.(storage.Sequenced).Source(ctx, c.db)
	b, _, _ := cloneStore.(storage.Sequenced).Source(ctx, c.db)
	if a != b {
		t.Fatalf("the clone's source is %q, the original's %q", b, a)
	}
	startRelay(cob, "relay-clone")
	var both sync.WaitGroup
	for _, side := range []struct {
		ob     *outbox.Outbox
		prefix string
	}{{ob, "orig"}, {cob, "clone"}} {
		both.Go(func() {
			for lo := 0; lo < 75; lo += 15 {
				enqueue(side.ob, side.prefix, lo, 15)
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	both.Wait()
}

// alignedOutbox makes a migrated outbox on c's table, aligned to topic.
func alignedOutbox(ctx context.Context, t *testing.T, c chainDB, table, topic string) (*outbox.Outbox, storage.OutboxStore) {
	t.Helper()
	store, err := c.newOutbox(table)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(c.db, store, outbox.Config{AlignedTopic: topic, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	return ob, store
}
