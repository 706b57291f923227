package consumer_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// runBriefly runs a consumer of cfg (New, no Migrate) and returns Run's
// error, failing the test if Run has not returned within d.
func runBriefly(t *testing.T, cfg consumer.Config, d time.Duration) error {
	t.Helper()
	c, err := newConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	began := time.Now()
	err = c.Run(ctx)
	if took := time.Since(began); took > d {
		t.Errorf("Run returned after %v, want within %v", took.Round(time.Millisecond), d)
	}
	return err
}

// A consumer subscribed to a topic that does not exist (a typo) does not
// sit idle for ever: Run returns within seconds an error naming the
// missing topic, and the check creates nothing, even on a broker with
// auto.create.topics.enable.
func TestRunRefusesAMissingTopic(t *testing.T) {
	onEachBroker(t, func(t *testing.T, k kafkaTarget) {
		createTopicWith(t, k.brokers, kafka.TopicConfig{Topic: k.topic})
		typo := k.topic + "-typo"
		s := newSQLiteShop(t)
		cfg := baseConfig(t, k.brokers, k.topic, k.group, s, newEvents())
		cfg.Topics = []string{k.topic, typo}
		err := runBriefly(t, cfg, 15*time.Second)
		t.Logf("Run: %v", err)
		if !errors.Is(err, consumer.ErrUnknownTopic) {
			t.Fatalf("Run: %v, want an error wrapping ErrUnknownTopic", err)
		}
		if !strings.Contains(err.Error(), `"`+typo+`"`) || strings.Contains(err.Error(), `"`+k.topic+`"`) {
			t.Errorf("the error should name %q, and only it: %v", typo, err)
		}
		cl := &kafka.Client{Addr: kafka.TCP(k.brokers...), Timeout: 10 * time.Second}
		md, err := cl.Metadata(context.Background(), &kafka.MetadataRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range md.Topics {
			if tp.Name == typo {
				t.Errorf("topic %q was created by the check", typo)
			}
		}
	})
}

// A dead-letter topic that was never created (or is mistyped) is found
// when Run starts, not at the first message that needs it: Run returns
// an error naming it as the dead-letter topic.
func TestRunRefusesAMissingDeadLetterTopic(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	cfg := baseConfig(t, brokers, "orders", "inventory", s, newEvents())
	cfg.Failure.Policy, cfg.Failure.DeadLetterTopic = consumer.DeadLetter, "orders.dql"
	err := runBriefly(t, cfg, 15*time.Second)
	t.Logf("Run: %v", err)
	if !errors.Is(err, consumer.ErrUnknownTopic) {
		t.Fatalf("Run: %v, want an error wrapping ErrUnknownTopic", err)
	}
	if !strings.Contains(err.Error(), `"orders.dql" (Config.Failure.DeadLetterTopic)`) || strings.Contains(err.Error(), `"orders"`) {
		t.Errorf("the error should name the dead-letter topic, and only it: %v", err)
	}
}

// startCheckDB is a fresh database with nothing migrated, and an inbox
// store on it.
type startCheckDB struct {
	name string
	open func(t *testing.T) (*gorm.DB, storage.InboxStore, string)
}

var startCheckDBs = []startCheckDB{
	{"sqlite", func(t *testing.T) (*gorm.DB, storage.InboxStore, string) {
		db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "fresh.db")), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		store, err := inboxsqlite.New(inboxsqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return db, store, ""
	}},
	{"postgres", func(t *testing.T) (*gorm.DB, storage.InboxStore, string) {
		db, err := gorm.Open(postgres.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		suffix := "_" + conformance.RandomSuffix()
		table := "inbox_fresh" + suffix
		store, err := inboxpg.New(inboxpg.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, tb := range []string{table, table + "_watermarks", "inbox_offsets" + suffix} {
				if err := db.Exec(`DROP TABLE IF EXISTS ` + tb + ` CASCADE`).Error; err != nil {
					t.Errorf("drop %s: %v", tb, err)
				}
			}
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		return db, store, suffix
	}},
	{"mysql", func(t *testing.T) (*gorm.DB, storage.InboxStore, string) {
		d, err := inboxmysql.Open(testservers.MySQLDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		suffix := "_" + conformance.RandomSuffix()
		table := "inbox_fresh" + suffix
		store, err := inboxmysql.New(inboxmysql.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, tb := range []string{table, table + "_watermarks", "inbox_offsets" + suffix} {
				if err := db.Exec("DROP TABLE IF EXISTS `" + tb + "`").Error; err != nil {
					t.Errorf("drop %s: %v", tb, err)
				}
			}
			_ = store.Close()
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		return db, store, suffix
	}},
}

// A consumer whose tables were never migrated does not retry a "database
// failure" for ever: Run returns at once an error naming the Migrate call
// to run, for the inbox table, the offsets table (Offsets.Store) and the
// watermark table (Sequenced.Sources), each missing while the others exist.
func TestRunRefusesTablesNeverMigrated(t *testing.T) {
	brokers := newKfake(t, 1, "orders")
	for _, d := range startCheckDBs {
		for _, tc := range []struct {
			name  string
			setup func(t *testing.T, ib *inbox.Inbox, cfg *consumer.Config)
			want  []string // in the error
		}{
			{"inbox", func(t *testing.T, ib *inbox.Inbox, cfg *consumer.Config) {}, []string{"inbox table", "Inbox.Migrate"}},
			{"offsets", func(t *testing.T, ib *inbox.Inbox, cfg *consumer.Config) {
				if err := ib.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				cfg.Offsets.Store = true
			}, []string{"offsets table", "Consumer.Migrate"}},
			{"watermarks", func(t *testing.T, ib *inbox.Inbox, cfg *consumer.Config) {
				if err := ib.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				cfg.Sequenced.Sources = []string{testSource}
			}, []string{"watermark table", "Consumer.Migrate"}},
		} {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				db, store, suffix := d.open(t)
				ib, err := inbox.New(db, store, inbox.Config{Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				cfg := consumer.Config{
					Brokers: brokers, GroupID: "inventory-" + conformance.RandomSuffix(), Topics: []string{"orders"},
					Inbox: ib, Consumer: "reserve-stock", Handler: (&shop{}).reserve,
					Offsets: consumer.OffsetsConfig{Table: "inbox_offsets" + suffix},
					Logger:  testLogger(t),
				}
				tc.setup(t, ib, &cfg)
				err = runBriefly(t, cfg, 10*time.Second)
				t.Logf("Run: %v", err)
				if !errors.Is(err, consumer.ErrNotMigrated) {
					t.Fatalf("Run: %v, want an error wrapping ErrNotMigrated", err)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("the error should say %q: %v", w, err)
					}
				}
			})
		}
	}
}

// With every table migrated the check passes and the consumer runs.
func TestRunStartsWithEveryTableMigrated(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	produce(t, brokers, "orders", orderMessage(0, 0))
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Offsets.Store, cfg.Sequenced.Sources = true, []string{testSource}
	r := start(t, cfg) // start runs Consumer.Migrate
	waitUntil(t, 20*time.Second, "the order to be applied", func() bool { return len(s.counts(t)) == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// An inbox table without storage for today (PostgreSQL: migrated, its
// partitions dropped, none made yet) is migrated: the check's claim finds
// the table, and the consumer starts and makes the day on demand.
func TestRunStartsOnAnInboxWithoutTodaysPartition(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newPostgresShop(t)
	var parts []string
	if err := s.db.Raw(`SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = ?::regclass`, s.inboxTable).Scan(&parts).Error; err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := s.db.Exec(`DROP TABLE ` + p).Error; err != nil {
			t.Fatal(err)
		}
	}
	produce(t, brokers, "orders", orderMessage(0, 0))
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.MaintenanceInterval = -1 // no maintenance: the day is made by the claim
	r := start(t, cfg)
	waitUntil(t, 20*time.Second, "the order to be applied", func() bool { return len(s.counts(t)) == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	t.Logf("dropped %d partitions", len(parts))
}
