package sqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
)

// A deployment of several replicas starts at once, and each replica runs
// Migrate for everything it uses: the inbox tables of two consumers and the
// outbox, all in a database file without tables yet. Every Migrate, each on
// a connection pool of its own and all started at the same instant, must
// succeed, round after round: with the DSN the package recommends, and with
// a plain path (no immediate transactions, the driver's default busy
// timeout).

const migrateReplicas, migrateRounds = 4, 20

var migrateOpeners = map[string]func(path string) gorm.Dialector{
	"Open":       inboxsqlite.Open,
	"plain-path": func(path string) gorm.Dialector { return gormsqlite.Open(path) },
}

// migrateCalls are one replica's Migrate calls, each with a pool of its
// own on the database file path.
func migrateCalls(t testing.TB, open func(string) gorm.Dialector, path string) []func() error {
	t.Helper()
	inboxA, err := inboxsqlite.New(inboxsqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	inboxB, err := inboxsqlite.New(inboxsqlite.Options{Table: "billing_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	pools := make([]*gorm.DB, 3)
	for i := range pools {
		db, err := gorm.Open(open(path), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		})
		// A fresh file's first connection switches it to WAL, which takes
		// an exclusive lock that SQLite's busy handler does not wait for:
		// under several processes opening the file at once it can answer
		// SQLITE_BUSY at once (seen 1 round in 20 on a loaded machine).
		// That is the opening, not Migrate, so it is tried again here.
		for attempt := 1; ; attempt++ {
			err := db.Exec(`SELECT 1`).Error
			if err == nil {
				break
			}
			if !inboxA.IsRetryable(err) || attempt == 50 {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		pools[i] = db
	}
	ctx := context.Background()
	return []func() error{
		func() error { return inboxA.Migrate(ctx, pools[0]) },
		func() error { return inboxB.Migrate(ctx, pools[1]) },
		func() error { return out.Migrate(ctx, pools[2]) },
	}
}

func TestMigrateAtTheSameInstant(t *testing.T) {
	for name, open := range migrateOpeners {
		t.Run(name, func(t *testing.T) {
			for round := range migrateRounds {
				path := filepath.Join(t.TempDir(), "race.db")
				var calls []func() error
				for range migrateReplicas {
					calls = append(calls, migrateCalls(t, open, path)...)
				}
				if err := atOnce(calls...); err != nil {
					t.Fatalf("round %d: %d Migrate calls at once on a fresh database: %v", round+1, len(calls), err)
				}
			}
		})
	}
}

// The same with the replicas as processes of their own.
func TestMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	for name := range migrateOpeners {
		t.Run(name, func(t *testing.T) {
			for round := range migrateRounds {
				path := filepath.Join(t.TempDir(), "race.db")
				if err := processesAtOnce(t, migrateReplicas, "TestMigrateReplica", migratePathVar+"="+path, migrateOpenVar+"="+name); err != nil {
					t.Fatalf("round %d: %d processes migrating a fresh database at once: %v", round+1, migrateReplicas, err)
				}
			}
		})
	}
}

const migratePathVar, migrateOpenVar = "INBOX_TEST_MIGRATE_PATH", "INBOX_TEST_MIGRATE_OPEN"

// TestMigrateReplica is one replica of TestMigrateAtTheSameInstantFromProcesses;
// it does nothing in a normal test run.
func TestMigrateReplica(t *testing.T) {
	path := os.Getenv(migratePathVar)
	if path == "" {
		t.Skip("only run as a process of TestMigrateAtTheSameInstantFromProcesses")
	}
	calls := migrateCalls(t, migrateOpeners[os.Getenv(migrateOpenVar)], path)
	awaitStart()
	if err := atOnce(calls...); err != nil {
		t.Fatal(err)
	}
}

// atOnce runs fns, each in a goroutine of its own, released together once
// all have started, and returns their errors.
func atOnce(fns ...func() error) error {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, len(fns))
	for i, fn := range fns {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-start
			errs[i] = fn()
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	return errors.Join(errs...)
}

// processesAtOnce runs n processes of this test binary that run only the
// test child, with env added; each prepares, says so (awaitStart), and all
// are released together. It returns the output of each that failed.
func processesAtOnce(t *testing.T, n int, child string, env ...string) error {
	t.Helper()
	type proc struct {
		cmd     *exec.Cmd
		release *os.File
		lines   *bufio.Scanner
		out     strings.Builder
	}
	procs := make([]*proc, n)
	for i := range procs {
		p := &proc{cmd: exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^"+child+"$", "-test.count=1", "-test.v")}
		p.cmd.Env = append(os.Environ(), env...)
		p.cmd.Stderr = &p.out
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		p.cmd.Stdin, p.release = r, w
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		p.lines = bufio.NewScanner(stdout)
		procs[i] = p
	}
	for _, p := range procs {
		for p.lines.Scan() && p.lines.Text() != startLine {
			fmt.Fprintln(&p.out, p.lines.Text())
		}
	}
	for _, p := range procs {
		p.release.Close() // releases it: awaitStart reads EOF
	}
	var errs []error
	for i, p := range procs {
		for p.lines.Scan() {
			fmt.Fprintln(&p.out, p.lines.Text())
		}
		if err := p.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("process %d: %w:\n%s", i+1, err, p.out.String()))
		}
	}
	return errors.Join(errs...)
}

const startLine = "ready to start"

// awaitStart tells processesAtOnce that this process is ready, and waits
// until it releases every process together.
func awaitStart() {
	fmt.Println(startLine)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}
