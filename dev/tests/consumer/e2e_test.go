package consumer_test

import (
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"

	"github.com/segmentio/kafka-go"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// e2eBackend opens a fresh shop (inbox, reservations, stock) on one
// database; its tables are removed when the test ends.
type e2eBackend struct {
	name string
	open func(t *testing.T) *shop
}

var e2eBackends = []e2eBackend{
	{"sqlite", newSQLiteShop},
	{"postgres", newPostgresShop},
	{"mysql", newMySQLShop},
}

func newPostgresShop(t *testing.T) *shop {
	t.Helper()
	dsn := testservers.PostgresDSN(t)
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	suffix := "_" + conformance.RandomSuffix()
	store, err := inboxpg.New(inboxpg.Options{Table: "inbox_e2e" + suffix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, table := range []string{"inbox_e2e" + suffix, "inbox_e2e" + suffix + "_watermarks", "reservations" + suffix, "stock" + suffix, "inbox_offsets" + suffix} {
			if err := db.Exec(`DROP TABLE IF EXISTS ` + table + ` CASCADE`).Error; err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	sh := setupShop(t, db, store, suffix)
	sh.inboxTable = "inbox_e2e" + suffix
	return sh
}

func newMySQLShop(t *testing.T) *shop {
	t.Helper()
	d, err := inboxmysql.Open(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	suffix := "_" + conformance.RandomSuffix()
	store, err := inboxmysql.New(inboxmysql.Options{Table: "inbox_e2e" + suffix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, table := range []string{"inbox_e2e" + suffix, "inbox_e2e" + suffix + "_watermarks", "reservations" + suffix, "stock" + suffix, "inbox_offsets" + suffix} {
			if err := db.Exec("DROP TABLE IF EXISTS `" + table + "`").Error; err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	sh := setupShop(t, db, store, suffix)
	sh.inboxTable = "inbox_e2e" + suffix
	return sh
}

// createTopic creates topic on a real broker and waits until every
// partition has a leader.
func createTopic(t *testing.T, brokers []string, topic string, partitions int) {
	t.Helper()
	conn, err := kafka.Dial("tcp", brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		t.Fatal(err)
	}
	cc, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "topic "+topic+" to have leaders", func() bool {
		ps, err := conn.ReadPartitions(topic)
		if err != nil || len(ps) != partitions {
			return false
		}
		for _, p := range ps {
			if p.Leader.ID < 0 || p.Leader.Host == "" {
				return false
			}
		}
		return true
	})
}

// TestEndToEnd is the scenario against a real Kafka broker and each
// database: a producer sends N OrderCreated events, some of them twice (same
// id and time); consumer A is killed between a database commit and its
// offset commit; B takes over, and C joins the group mid-stream (a
// rebalance between B and C); finally the whole topic is replayed under a
// NEW group. Every order must be reserved exactly once, none lost.
func TestEndToEnd(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	modes := []struct {
		name         string
		batch        int
		storeOffsets bool
	}{
		{"single", 1, false},
		{"batch+stored-offsets", 10, true},
	}
	for _, be := range e2eBackends {
		t.Run(be.name, func(t *testing.T) {
			for _, mode := range modes {
				t.Run(mode.name, func(t *testing.T) {
					runEndToEnd(t, brokers, be.open(t), mode.batch, mode.storeOffsets)
				})
			}
		})
	}
}

func runEndToEnd(t *testing.T, brokers []string, s *shop, batch int, storeOffsets bool) {
	const (
		partitions = 4
		n          = 400
	)
	began := time.Now()
	suffix := conformance.RandomSuffix()
	topic, group := "orders-"+suffix, "inventory-"+suffix
	createTopic(t, brokers, topic, partitions)

	// Every 10th order is sent twice in a row and every 25th again at the
	// end: producer retries, same event id and time, new offsets.
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, orderMessage(i, i%partitions))
		if i%10 == 0 {
			msgs = append(msgs, orderMessage(i, i%partitions))
		}
	}
	for i := 0; i < n; i += 25 {
		msgs = append(msgs, orderMessage(i, i%partitions))
	}
	// The producer sends 60% of the messages, then waits for C to join the
	// group and sends the rest: the rebalance happens mid-stream.
	total := len(msgs)
	produced, cJoined := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(produced)
		split := total * 6 / 10
		for lo := 0; lo < total; lo += 20 {
			if lo >= split && lo-20 < split {
				select {
				case <-cJoined:
				case <-time.After(60 * time.Second):
					return
				}
			}
			produce(t, brokers, topic, msgs[lo:min(lo+20, total)]...)
			time.Sleep(10 * time.Millisecond)
		}
	}()

	cfg := func(ev *events) consumer.Config {
		return consumer.Config{
			Brokers:   brokers,
			GroupID:   group,
			Topics:    []string{topic},
			Inbox:     s.ib,
			Consumer:  "reserve-stock",
			Handler:   s.reserve,
			BatchSize: batch,
			BatchWait: 20 * time.Millisecond,
			Offsets: consumer.OffsetsConfig{
				Store: storeOffsets,
				Table: "inbox_offsets" + s.suffix,
			},
			Failure: consumer.FailureConfig{
				MinBackoff: 20 * time.Millisecond,
				MaxBackoff: 500 * time.Millisecond,
			},
			Kafka: consumer.KafkaConfig{
				CommitInterval:    100 * time.Millisecond,
				MaxWait:           500 * time.Millisecond,
				SessionTimeout:    6 * time.Second,
				HeartbeatInterval: 200 * time.Millisecond,
				RebalanceTimeout:  10 * time.Second,
			},
			Logger: testLogger(t),
			Hooks:  []hooks.Hook{hooks.EventFunc(ev.on)},
		}
	}
	applied := func() int { return len(s.counts(t)) }

	// A: killed right after its 15th database commit, before any offset
	// commit that would cover it.
	evA := newEvents()
	cfgA := cfg(evA)
	var dbCommits atomic.Int32
	knobsA := &testhooks.Knobs{AfterDB: func(_ string, _ int, _ int64, processed int) error {
		// Crash after a commit that applied an order (not one that only
		// found duplicates), so the gap holds an applied, unfinished order.
		if dbCommits.Add(1) >= 15 && processed > 0 {
			return testhooks.ErrCrash
		}
		return nil
	}}
	a := startWith(t, cfgA, knobsA)
	select {
	case err := <-a.done:
		if !errors.Is(err, testhooks.ErrCrash) {
			t.Fatalf("consumer A: Run = %v, want the simulated crash", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consumer A did not reach its crash point")
	}
	afterCrash := applied()
	t.Logf("A crashed after %d database commits; %d orders applied", dbCommits.Load(), afterCrash)
	// The gap: the last database commit's orders are applied, but A never
	// finished them, so the group's offsets do not cover them.
	if finished := evA.count(hooks.Processed); afterCrash <= finished {
		t.Fatalf("A applied %d orders and finished %d: the crash did not fall between the two commits", afterCrash, finished)
	}
	var kafkaCommitted int64
	for _, off := range committed(t, brokers, group, topic, partitions) {
		kafkaCommitted += max(off, 0)
	}
	if finished := int64(evA.count(hooks.Processed) + evA.count(hooks.Duplicate)); kafkaCommitted > finished {
		t.Fatalf("the group committed %d offsets but A finished only %d messages", kafkaCommitted, finished)
	}

	// B takes over; C joins mid-stream.
	evB, evC := newEvents(), newEvents()
	b := start(t, cfg(evB))
	waitUntil(t, 30*time.Second, "B to make progress", func() bool { return applied() >= afterCrash+n/4 })
	c := start(t, cfg(evC))
	waitUntil(t, 30*time.Second, "C to be assigned partitions", func() bool { return evC.count(hooks.Assigned) > 0 })
	rebalancedAt := applied()
	close(cJoined)
	<-produced
	waitUntil(t, 40*time.Second, "every order to be applied", func() bool { return applied() == n })
	// Let the last offset commits land, then stop both.
	time.Sleep(300 * time.Millisecond)
	if err := b.stop(t); err != nil {
		t.Errorf("consumer B: %v", err)
	}
	if err := c.stop(t); err != nil {
		t.Errorf("consumer C: %v", err)
	}
	t.Logf("C joined with %d orders applied; B processed %d (dups %d, revoked %d), C processed %d (dups %d)",
		rebalancedAt, evB.count(hooks.Processed), evB.count(hooks.Duplicate), evB.count(hooks.Revoked),
		evC.count(hooks.Processed), evC.count(hooks.Duplicate))
	if evB.count(hooks.Revoked) == 0 || evC.count(hooks.Processed)+evC.count(hooks.Duplicate) == 0 {
		t.Errorf("no rebalance mid-stream: B revoked %d times, C handled %d messages",
			evB.count(hooks.Revoked), evC.count(hooks.Processed)+evC.count(hooks.Duplicate))
	}
	s.checkExactlyOnce(t, n, nil)

	// Replay the whole topic under a new group: everything is a duplicate.
	evD := newEvents()
	cfgD := cfg(evD)
	cfgD.GroupID = group + "-replay"
	cfgD.Kafka.StartOffset = kafka.FirstOffset
	d := start(t, cfgD)
	waitUntil(t, 40*time.Second, "the replay", func() bool {
		return evD.count(hooks.Processed)+evD.count(hooks.Duplicate) == total
	})
	if err := d.stop(t); err != nil {
		t.Errorf("replay consumer: %v", err)
	}
	if p := evD.count(hooks.Processed); p != 0 {
		t.Errorf("the replay applied %d messages again", p)
	}
	s.checkExactlyOnce(t, n, nil)
	t.Logf("%d messages (%d orders), %d partitions, batch %d, stored offsets %v: exactly once in %v",
		total, n, partitions, batch, storeOffsets, time.Since(began).Round(time.Millisecond))
}

// TestScenarioOnKfake runs the end-to-end scenario against the in-process
// broker, so that it runs everywhere in a few seconds; TestEndToEnd is the
// one that counts.
func TestScenarioOnKfake(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			t.Parallel()
			runEndToEnd(t, newKfake(t, 1), newSQLiteShop(t), batch, batch > 1)
		})
	}
}
