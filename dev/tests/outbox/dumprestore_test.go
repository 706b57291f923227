//go:build cgo

package outbox_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// producerProcVar makes the test binary a producer process of
// TestProducerDumpRestore; the other INBOX_PP_ variables say what it does.
const producerProcVar = "INBOX_PRODUCER_PROC"

// TestProducerDumpRestore restores a producer's database from a real backup
// under a producer that runs as a separate OS process: PostgreSQL from
// pg_dump by pg_restore, MariaDB from mariadb-dump by the mariadb client,
// SQLite from a copy of its file taken while no producer process ran. The
// producer process (enqueuer and relay) publishes 90 events, applied by a
// consumer listing the outbox's source in Sequenced.Sources, and is killed
// (SIGKILL); another enqueues 10 more and stops; the backup is taken; a
// third publishes 100 more and is killed; the backup is restored; a fourth
// starts its relay and enqueues 150 new events on the restored database.
// Every event must be applied once, with no operator step: on an aligned
// outbox the relay finds what was published in the partitions (and says
// at Warn that the database went back), on default shards (not aligned)
// the consumer takes the source's inbox rows (and says at Warn that it is
// not aligned).
func TestProducerDumpRestore(t *testing.T) {
	if os.Getenv(producerProcVar) == "1" {
		runProducerProcess(t)
		return
	}
	for _, db := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			for _, aligned := range []bool{true, false} {
				name := "default shards"
				if aligned {
					name = "aligned"
				}
				t.Run(name, func(t *testing.T) { runProducerDumpRestore(t, db, aligned) })
			}
		})
	}
}

// producerDB is a producer's database a test backs up and restores with
// the database's own tools, and the environment of its producer processes.
type producerDB struct {
	env     []string
	backup  func(file string)
	restore func(file string)
}

func runProducerDumpRestore(t *testing.T, dialect string, aligned bool) {
	brokers := testservers.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sfx := conformance.RandomSuffix()
	const partitions = 4
	topic := "dump-" + sfx
	if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
		t.Fatal(err)
	}
	shards := 0 // the store's default, spread over the partitions
	alignedTopic := ""
	if aligned {
		shards, alignedTopic = partitions, topic
	}
	table := "outbox_d_" + sfx
	pdb := openProducerDB(t, dialect, table, shards)
	db, store := pdb.open(t)
	ob, err := outbox.New(db, store, outbox.Config{AlignedTopic: alignedTopic, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	source, _, err := store.(storage.Sequenced).Source(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	notAligned := &warnCounter{t: t, match: "trusted source is not aligned"}
	applied := startAppliedConsumer(runCtx, t, &wg, sqliteChain(t), brokers, topic, source, notAligned)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logs := t.TempDir()
	var procs int
	// producer starts a producer process that enqueues n events named
	// prefix-from.. and, with relay, publishes until it is killed; without,
	// it stops once they are enqueued. It returns once they are, and a
	// kill that waits for the process to end.
	producer := func(prefix string, from, n int, relay bool) (kill func()) {
		t.Helper()
		procs++
		logFile := filepath.Join(logs, fmt.Sprintf("producer-%d.log", procs))
		stderr, err := os.Create(logFile)
		if err != nil {
			t.Fatal(err)
		}
		defer stderr.Close()
		cmd := exec.CommandContext(ctx, self, "-test.run", "^TestProducerDumpRestore$", "-test.count", "1")
		cmd.Env = append(os.Environ(), pdb.env...)
		cmd.Env = append(cmd.Env, producerProcVar+"=1", "INBOX_PP_TOPIC="+topic, "INBOX_PP_ALIGNED="+strconv.FormatBool(aligned),
			"INBOX_PP_PREFIX="+prefix, "INBOX_PP_FROM="+strconv.Itoa(from), "INBOX_PP_N="+strconv.Itoa(n),
			"INBOX_PP_RELAY="+strconv.FormatBool(relay), "INBOX_PP_ID="+fmt.Sprintf("relay-%d", procs))
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		enqueued := false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "enqueued" {
				enqueued = true
				break
			}
		}
		done := make(chan error, 1)
		go func() {
			_, _ = io.Copy(io.Discard, out)
			done <- cmd.Wait()
		}()
		if !enqueued {
			err := <-done
			raw, _ := os.ReadFile(logFile)
			t.Fatalf("producer process %d ended before it enqueued (%v):\n%s", procs, err, raw)
		}
		if !relay {
			if err := <-done; err != nil {
				raw, _ := os.ReadFile(logFile)
				t.Fatalf("producer process %d: %v\n%s", procs, err, raw)
			}
			return func() {}
		}
		return func() {
			_ = cmd.Process.Kill()
			if err := <-done; err == nil || !strings.Contains(err.Error(), "killed") {
				raw, _ := os.ReadFile(logFile)
				t.Errorf("producer process %s ended before it was killed (%v):\n%s", filepath.Base(logFile), err, raw)
			}
		}
	}
	want := 0
	waitApplied := func(n int) {
		t.Helper()
		want += n
		deadline := time.Now().Add(time.Minute)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			if _, got := applied.count(); got >= int64(want) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		rows, got := applied.count()
		t.Fatalf("%d events applied (%d applications), want %d", got, rows, want)
	}

	kill := producer("ev", 0, 90, true)
	waitApplied(90)
	kill()
	producer("ev", 90, 10, false) // unpublished in the backup
	backup := filepath.Join(t.TempDir(), "backup")
	pdb.backup(backup)
	kill = producer("ev", 100, 100, true)
	waitApplied(110)
	kill()
	pdb.restore(backup)
	kill = producer("new", 0, 150, true)
	defer kill()
	waitApplied(150)
	time.Sleep(time.Second) // a late copy would show now
	rows, events := applied.count()
	t.Logf("%d events applied, %d applications", events, rows)
	if events != 350 || rows != 350 {
		t.Fatalf("%d of 350 events applied, %d applications: %d lost, %d applied twice", events, rows, 350-events, rows-events)
	}
	raw, err := os.ReadFile(filepath.Join(logs, fmt.Sprintf("producer-%d.log", procs)))
	if err != nil {
		t.Fatal(err)
	}
	wentBack := strings.Count(string(raw), "database went back")
	t.Logf("the restarted relay said %d times that the database went back; the consumer %d times that the source is not aligned", wentBack, notAligned.n.Load())
	if aligned && wentBack == 0 {
		t.Errorf("the relay on the restored database did not say at Warn that it went back:\n%s", raw)
	}
	if aligned && notAligned.n.Load() != 0 || !aligned && notAligned.n.Load() == 0 {
		t.Errorf("the consumer said %d times that the source is not aligned; the outbox is aligned: %v", notAligned.n.Load(), aligned)
	}
}

// openProducerDB makes a producer database of dialect on the shared
// servers (SQLite: a file), with its backup and restore by the database's
// own tools, and its producer processes' environment.
func openProducerDB(t *testing.T, dialect, table string, shards int) producerDB {
	t.Helper()
	env := []string{"INBOX_PP_DIALECT=" + dialect, "INBOX_PP_TABLE=" + table, "INBOX_PP_SHARDS=" + strconv.Itoa(shards)}
	run := func(stdin, stdout string, name string, args ...string) {
		t.Helper()
		path, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cmd := exec.Command(path, args...)
		var errOut strings.Builder
		cmd.Stderr = &errOut
		if stdin != "" {
			f, err := os.Open(stdin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd.Stdin = f
		}
		if stdout != "" {
			f, err := os.Create(stdout)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd.Stdout = f
		}
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, errOut.String())
		}
	}
	switch dialect {
	case "postgres":
		dsn := testservers.PostgresDSN(t)
		schema := "dump_" + conformance.RandomSuffix()
		t.Cleanup(func() {
			if db, err := gorm.Open(gormpg.Open(dsn), &gorm.Config{Logger: logger.Discard}); err == nil {
				db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
				if sqlDB, err := db.DB(); err == nil {
					sqlDB.Close()
				}
			}
		})
		return producerDB{
			env:    append(env, "INBOX_PP_DSN="+dsn, "INBOX_PP_SCHEMA="+schema),
			backup: func(file string) { run("", "", pgTool("pg_dump"), "-Fc", "-n", schema, "-f", file, "-d", dsn) },
			// Into an empty schema: pg_restore --clean cannot drop a
			// partitioned table's constraints from its partitions.
			restore: func(file string) {
				run("", "", pgTool("psql"), "-q", "-d", dsn, "-c", "DROP SCHEMA "+schema+" CASCADE")
				run("", "", pgTool("pg_restore"), "-d", dsn, file)
			},
		}
	case "mysql":
		dsn := testservers.MySQLDSN(t)
		cfg, err := gomysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := strings.Cut(cfg.Addr, ":")
		conn := []string{"--protocol=tcp", "-h", host, "-P", port, "-u", cfg.User}
		if cfg.Passwd != "" {
			conn = append(conn, "-p"+cfg.Passwd)
		}
		tables := []string{table, table + "_shards", table + "_relay", table + "_source"}
		t.Cleanup(func() {
			if d, err := inboxmysql.Open(dsn); err == nil {
				if db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard}); err == nil {
					for _, tb := range tables {
						db.Exec("DROP TABLE IF EXISTS `" + tb + "`")
					}
					if sqlDB, err := db.DB(); err == nil {
						sqlDB.Close()
					}
				}
			}
		})
		return producerDB{
			env: append(env, "INBOX_PP_DSN="+dsn),
			backup: func(file string) {
				run("", file, "mariadb-dump", append(append(conn, "--single-transaction", cfg.DBName), tables...)...)
			},
			restore: func(file string) { run(file, "", "mariadb", append(conn, cfg.DBName)...) },
		}
	default:
		path := filepath.Join(t.TempDir(), "producer.db")
		// The file and its write-ahead log, copied while no producer
		// process runs; a restore removes what the later processes left.
		files := []string{"", "-wal", "-shm"}
		copyFile := func(from, to string) {
			raw, err := os.ReadFile(from)
			if os.IsNotExist(err) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(to, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return producerDB{
			env: append(env, "INBOX_PP_DSN="+path),
			backup: func(file string) {
				for _, f := range files {
					copyFile(path+f, file+f)
				}
			},
			restore: func(file string) {
				for _, f := range files {
					if err := os.Remove(path + f); err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
					copyFile(file+f, path+f)
				}
			},
		}
	}
}

// open connects to the database of a producer process's environment (the
// test's own, or pdb's) and makes its outbox store.
func (pdb producerDB) open(t *testing.T) (*gorm.DB, storage.OutboxStore) {
	t.Helper()
	get := func(name string) string {
		for _, kv := range pdb.env {
			if v, ok := strings.CutPrefix(kv, name+"="); ok {
				return v
			}
		}
		return os.Getenv(name)
	}
	shards, _ := strconv.Atoi(get("INBOX_PP_SHARDS"))
	table, dsn := get("INBOX_PP_TABLE"), get("INBOX_PP_DSN")
	var d gorm.Dialector
	var store storage.OutboxStore
	var err error
	switch get("INBOX_PP_DIALECT") {
	case "postgres":
		d = gormpg.Open(dsn)
		store, err = inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: get("INBOX_PP_SCHEMA"), Table: table, Shards: shards})
	case "mysql":
		if d, err = inboxmysql.Open(dsn); err == nil {
			store, err = inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Shards: shards})
		}
	default:
		d = inboxsqlite.Open(dsn)
		store, err = inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: table, Shards: shards})
	}
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return db, store
}

// pgTool finds a PostgreSQL client as scripts/postgres.sh finds the
// server: in /usr/local/bin, the newest /usr/lib/postgresql/*/bin, or PATH.
func pgTool(name string) string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return n
	}
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range append([]string{"/usr/local/bin"}, dirs...) {
		if fi, err := os.Stat(filepath.Join(d, name)); err == nil && fi.Mode()&0o111 != 0 {
			return filepath.Join(d, name)
		}
	}
	return name
}

// runProducerProcess is a producer process: it enqueues its events, says
// "enqueued" on stdout, and either stops or runs its relay until killed;
// with a relay, the relay starts first, so that it races the enqueuers.
func runProducerProcess(t *testing.T) {
	pdb := producerDB{}
	db, store := pdb.open(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	topic := os.Getenv("INBOX_PP_TOPIC")
	cfg := outbox.Config{Logger: logger}
	if os.Getenv("INBOX_PP_ALIGNED") == "true" {
		cfg.AlignedTopic = topic
	}
	ob, err := outbox.New(db, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	if os.Getenv("INBOX_PP_RELAY") == "true" {
		kp, err := outbox.NewKafkaPublisher(outbox.NewKafkaWriter(testservers.KafkaBrokers(t)...))
		if err != nil {
			t.Fatal(err)
		}
		r, err := ob.NewRelay(kp, outbox.RelayConfig{ID: os.Getenv("INBOX_PP_ID"), Lease: 2 * time.Second, MaxMessages: 20, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		go func() { relayDone <- r.Run(ctx) }()
	}
	prefix := os.Getenv("INBOX_PP_PREFIX")
	from, _ := strconv.Atoi(os.Getenv("INBOX_PP_FROM"))
	n, _ := strconv.Atoi(os.Getenv("INBOX_PP_N"))
	msgs := alignedMessages(topic, from, n, 24)
	for i := range msgs {
		msgs[i].ID = fmt.Sprintf("%s-%04d", prefix, from+i)
	}
	for lo := 0; lo < n; lo += 5 {
		if err := enqueue(ctx, db, ob, msgs[lo:min(lo+5, n)]...); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("enqueued")
	if os.Getenv("INBOX_PP_RELAY") != "true" {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
		return
	}
	t.Fatalf("relay ended: %v", <-relayDone)
}
