//go:build cgo

package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/chaos"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
)

// producerFailoverVar marks the run of TestProducerFailover inside its own
// PostgreSQL servers.
const producerFailoverVar = "INBOX_PRODUCER_FAILOVER_INNER"

// TestProducerFailover rewinds an aligned outbox's database by a failover:
// its PostgreSQL primary streams to an asynchronous standby; the standby is
// cut off (the primary's WAL senders stopped) after it received rows not
// yet published, the relay then publishes and marks those rows and rows
// enqueued after the cut, all applied by a consumer deduplicating the
// outbox's source by watermark; the primary is killed (SIGKILL) and the
// standby promoted. The promoted database lacks the marks and the last rows
// and hands their numbers out again, to events enqueued right away while a
// relay starts on it. Twice: the first time with the relays stopped before
// the kill and a new one started after the promotion, the second with the
// relay that published before the kill running through it (its connections
// move to the promoted standby through the multi-host DSN). Every event
// must be applied once, with no operator step.
//
// It runs itself again inside scripts/with-services.sh --postgres-standby
// async, on private PostgreSQL servers (the shared Kafka broker stays).
func TestProducerFailover(t *testing.T) {
	if os.Getenv(producerFailoverVar) == "1" {
		runProducerFailover(t)
		return
	}
	testservers.KafkaBrokers(t)
	testservers.PostgresDSN(t)
	chaos.RunUnderStandby(t, "TestProducerFailover", producerFailoverVar, false, 5*time.Minute, "producer failover on private PostgreSQL servers")
}

func runProducerFailover(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	dsn := os.Getenv("INBOX_POSTGRES_FAILOVER_DSN")
	primary, standby := os.Getenv("INBOX_POSTGRES_DIR"), os.Getenv("INBOX_POSTGRES_STANDBY_DIR")
	if dsn == "" || primary == "" || standby == "" {
		t.Fatal("no standby: run through scripts/with-services.sh --postgres-standby async")
	}
	scripts, err := chaos.FindScripts()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pgScript := func(args ...string) {
		t.Helper()
		start := time.Now()
		out, err := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(scripts, "postgres.sh")}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("postgres.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("postgres.sh %s: %.1fs", args[0], time.Since(start).Seconds())
	}
	open := func(dsn string) *gorm.DB {
		t.Helper()
		db, err := gorm.Open(gormpg.Open(dsn+" connect_timeout=5"), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		return db
	}
	// server connects to the one server of a service dir, not through the
	// multi-host DSN.
	server := func(dir string) *gorm.DB {
		t.Helper()
		raw, err := os.ReadFile(filepath.Join(dir, "dsn"))
		if err != nil {
			t.Fatal(err)
		}
		return open(strings.TrimSpace(string(raw)))
	}
	// The relays and the enqueuers reach the producer's database as a
	// service of a replicated cluster does: through one DSN over both
	// servers, on the one that accepts writes.
	relayDB, appDB := open(dsn), open(dsn)

	const shards = 4
	sfx := conformance.RandomSuffix()
	topic := "failover-" + sfx
	if err := inventory.CreateTopic(ctx, brokers[0], topic, shards); err != nil {
		t.Fatal(err)
	}
	table := "outbox_f_" + sfx
	store, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Table: table, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	wentBack := &warnCounter{t: t, match: "database went back"}
	ob, err := outbox.New(relayDB, store, outbox.Config{AlignedTopic: topic, Logger: slog.New(wentBack)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	source, _, err := store.Source(ctx, relayDB)
	if err != nil {
		t.Fatal(err)
	}

	// The consumer's database is apart from the producer's: a SQLite file.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	applied := startAppliedConsumer(runCtx, t, &wg, sqliteChain(t), brokers, topic, source, nil)

	var relays []func()
	startRelay := func(id string) {
		w := outbox.NewKafkaWriter(brokers...)
		kp, err := outbox.NewKafkaPublisher(w)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ob.NewRelay(kp, outbox.RelayConfig{ID: id, Lease: 2 * time.Second, MaxMessages: 20, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rstop := context.WithCancel(runCtx)
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			defer w.Close()
			_ = r.Run(rctx)
		})
		relays = append(relays, func() { rstop(); <-done })
	}
	stopRelays := func() {
		for _, s := range relays {
			s()
		}
		relays = nil
	}
	var enqueued []string
	var enqMu sync.Mutex
	enqueue := func(prefix string, n int, pause time.Duration) {
		msgs := alignedMessages(topic, 0, n, 12)
		for i := range msgs {
			msgs[i].ID = fmt.Sprintf("%s-%03d", prefix, i)
		}
		for lo := 0; lo < n; lo += 5 {
			batch := msgs[lo:min(lo+5, n)]
			if err := appDB.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return ob.Enqueue(ctx, tx, batch...) }); err != nil {
				t.Errorf("enqueue %s: %v", batch[0].ID, err)
				return
			}
			enqMu.Lock()
			for _, m := range batch {
				enqueued = append(enqueued, m.ID)
			}
			enqMu.Unlock()
			time.Sleep(pause)
		}
	}
	waitApplied := func(stage string) {
		t.Helper()
		enqMu.Lock()
		want := int64(len(enqueued))
		enqMu.Unlock()
		deadline := time.Now().Add(time.Minute)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			if _, n := applied.count(); n >= want {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		rows, n := applied.count()
		t.Fatalf("%s: %d events applied (%d applications), want %d", stage, n, rows, want)
	}
	scalar := func(db *gorm.DB, query string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := db.WithContext(ctx).Raw(query, args...).Scan(&n).Error; err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	// unmarked is how many numbers the database handed out that it does
	// not hold marked published.
	unmarked := func(db *gorm.DB) int64 {
		return scalar(db, `SELECT (SELECT COALESCE(SUM(next_seq), 0) FROM `+table+`_shards) - (SELECT COALESCE(SUM(published_through), 0) FROM `+table+`_relay)`)
	}
	rowsLike := func(db *gorm.DB, prefix string) int64 {
		return scalar(db, `SELECT COUNT(*) FROM `+table+` WHERE event_id LIKE ?`, prefix+"-%")
	}

	startRelay("relay-0")
	for round, survives := range []bool{false, true} {
		p := fmt.Sprintf("r%d", round)
		how := "relays restarted"
		if survives {
			how = "relay lived through it"
		}
		t.Logf("round %d (%s): primary %s, standby %s", round, how, filepath.Base(primary), filepath.Base(standby))
		enqueue(p+"-a", 40, 0)
		waitApplied(p + ": before the failover")
		pdb := server(primary)

		// Rows the standby receives unpublished, then the link stops.
		stopRelays()
		enqueue(p+"-b", 10, 0)
		lsn := ""
		if err := pdb.Raw(`SELECT pg_current_wal_lsn()::text`).Scan(&lsn).Error; err != nil {
			t.Fatal(err)
		}
		for scalar(pdb, `SELECT COUNT(*) FROM pg_stat_replication WHERE replay_lsn >= ?::pg_lsn`, lsn) == 0 {
			if ctx.Err() != nil {
				t.Fatal("the standby did not replay the primary's WAL")
			}
			time.Sleep(20 * time.Millisecond)
		}
		pgScript("pause-wal", primary)

		// The primary publishes and marks them, and rows the standby never
		// gets; the consumer applies them all.
		startRelay(p + "-before")
		enqueue(p+"-c", 30, 0)
		waitApplied(p + ": on the primary, the standby cut off")
		for unmarked(pdb) != 0 {
			if ctx.Err() != nil {
				t.Fatal("the primary's relay did not mark what it published")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !survives {
			stopRelays()
		}
		wentBefore := wentBack.n.Load()
		pgScript("kill", primary)
		pgScript("promote", standby)
		sdb := server(standby)
		if n := rowsLike(sdb, p+"-c"); n != 0 {
			t.Fatalf("the promoted standby holds %d of the rows enqueued after the cut: no commits lost", n)
		}
		if n := rowsLike(sdb, p+"-b"); n != 10 {
			t.Fatalf("the promoted standby holds %d of the 10 rows it got unpublished", n)
		}
		// A relay that lived through it may have marked them already.
		if n := unmarked(sdb); !survives && n != 10 {
			t.Fatalf("the promoted standby has %d numbers not marked published, want the 10 rows it got unpublished", n)
		}

		// Enqueuers race the relay on the promoted database. Their idle
		// connections went with the primary: a service would retry the
		// transactions that failed on them, which need not be tested here.
		if sqlDB, err := appDB.DB(); err == nil {
			sqlDB.SetMaxIdleConns(0)
			sqlDB.SetMaxIdleConns(2)
		}
		var race sync.WaitGroup
		race.Go(func() { enqueue(p+"-d", 60, 10*time.Millisecond) })
		if !survives {
			startRelay(p + "-after")
		}
		race.Wait()
		waitApplied(p + ": after the promotion")
		time.Sleep(time.Second) // a late copy would show now
		rows, events := applied.count()
		enqMu.Lock()
		want := int64(len(enqueued))
		enqMu.Unlock()
		t.Logf("%s: %d of %d events applied, %d applications; the relays said the database went back %d times",
			p, events, want, rows, wentBack.n.Load()-wentBefore)
		if events != want || rows != want {
			t.Fatalf("%s: %d of %d events applied, %d applications: %d lost, %d applied twice", p, events, want, rows, want-events, rows-events)
		}
		if wentBack.n.Load() == wentBefore {
			t.Errorf("%s: no relay said at Warn that the database went back", p)
		}
		if round == 0 {
			// The killed primary comes back as the new standby.
			pgScript("rejoin", primary, standby, "async")
			primary, standby = standby, primary
		}
	}
	stopRelays()
	if missing := applied.missing(enqueued); len(missing) > 0 {
		t.Fatalf("%d events never applied: %v", len(missing), missing)
	}
}

// appliedLog is the record a test consumer's handler keeps of the events it
// applied, in the effect's transaction.
type appliedLog struct {
	t     *testing.T
	db    *gorm.DB
	table string
}

// count returns how many applications there were and of how many events.
func (a appliedLog) count() (rows, events int64) {
	if err := a.db.Raw(`SELECT COUNT(*) FROM ` + a.table).Scan(&rows).Error; err != nil {
		a.t.Fatal(err)
	}
	if err := a.db.Raw(`SELECT COUNT(DISTINCT event_id) FROM ` + a.table).Scan(&events).Error; err != nil {
		a.t.Fatal(err)
	}
	return rows, events
}

// missing returns the ids of want that were never applied.
func (a appliedLog) missing(want []string) []string {
	var got []string
	if err := a.db.Raw(`SELECT DISTINCT event_id FROM ` + a.table).Scan(&got).Error; err != nil {
		a.t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, id := range got {
		seen[id] = true
	}
	var out []string
	for _, id := range want {
		if !seen[id] {
			out = append(out, id)
		}
	}
	return out
}

// startAppliedConsumer runs, until ctx ends, a consumer of topic on c that
// lists source in Sequenced.Sources and records each event it applies. It
// logs to h, if not nil.
func startAppliedConsumer(ctx context.Context, t *testing.T, wg *sync.WaitGroup, c chainDB, brokers []string, topic, source string, h slog.Handler) appliedLog {
	t.Helper()
	sfx := conformance.RandomSuffix()
	log := appliedLog{t: t, db: c.db, table: "applied_" + sfx}
	c.drop(log.table)
	if err := c.db.Exec(`CREATE TABLE ` + log.table + ` (event_id VARCHAR(64) NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	clog := quiet
	if h != nil {
		clog = slog.New(h)
	}
	ibStore, err := c.newInbox("inbox_a_" + sfx)
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
	cons, err := consumer.New(consumer.Config{Brokers: brokers, GroupID: "applied-" + sfx, Topics: []string{topic}, Inbox: ib, Consumer: "apply",
		Sequenced: consumer.SequencedConfig{Sources: []string{source}}, Logger: clog, Kafka: consumer.KafkaConfig{MaxWait: 100 * time.Millisecond},
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			return tx.Exec(`INSERT INTO `+log.table+` (event_id) VALUES (?)`, msg.EventID).Error
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = cons.Run(ctx) })
	return log
}

// warnCounter is a slog handler that counts the Warn and Error records
// whose message contains match, and logs them and every Error record to
// the test.
type warnCounter struct {
	t     *testing.T
	match string
	n     atomic.Int64
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, w.match) {
		w.n.Add(1)
	} else if r.Level < slog.LevelError {
		return nil
	}
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	w.t.Logf("%s %s%s", r.Level, r.Message, b.String())
	return nil
}

func (w *warnCounter) WithAttrs(attrs []slog.Attr) slog.Handler { return w }
func (w *warnCounter) WithGroup(string) slog.Handler            { return w }
