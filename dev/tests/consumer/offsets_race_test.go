package consumer_test

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

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/internal/offsets"
)

// A deployment of several replicas of a consumer with StoreOffsets starts
// at once, and each replica runs Consumer.Migrate, which creates the
// offsets table: every call, each on a connection pool of its own and all
// started at the same instant, must succeed on a database without the
// table, round after round, on every database.

const offsetsReplicas, offsetsRounds = 4, 20

// offsetsDatabases open a connection pool on each database; where is the
// SQLite file (unused by the servers).
var offsetsDatabases = map[string]func(t testing.TB, where string) gorm.Dialector{
	"sqlite":       func(_ testing.TB, where string) gorm.Dialector { return inboxsqlite.Open(where) },
	"sqlite-plain": func(_ testing.TB, where string) gorm.Dialector { return gormsqlite.Open(where) },
	"postgres":     func(t testing.TB, _ string) gorm.Dialector { return postgres.Open(testservers.PostgresDSN(t)) },
	"mysql":        func(t testing.TB, _ string) gorm.Dialector { return mysql.Open(testservers.MySQLDSN(t)) },
}

// openOffsetsPool opens a connection pool on the database name, with a
// connection made.
func openOffsetsPool(t testing.TB, name, where string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(offsetsDatabases[name](t, where), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	if err := db.Exec(`SELECT 1`).Error; err != nil {
		t.Fatal(err)
	}
	return db
}

// freshOffsetsTable returns a new offsets table name, and drops the table
// through db when the test ends.
func freshOffsetsTable(t *testing.T, db *gorm.DB) string {
	table := "inbox_offsets_" + conformance.RandomSuffix()
	t.Cleanup(func() { _ = db.Exec(`DROP TABLE IF EXISTS ` + table).Error })
	return table
}

func TestOffsetsMigrateAtTheSameInstant(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for round := range offsetsRounds {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				table := freshOffsetsTable(t, openOffsetsPool(t, name, where))
				calls := make([]func() error, offsetsReplicas)
				for i := range calls {
					db := openOffsetsPool(t, name, where)
					calls[i] = func() error { return offsets.Store{Table: table, Group: "g"}.Migrate(context.Background(), db) }
				}
				if err := atOnce(calls...); err != nil {
					t.Fatalf("round %d: %d Migrate calls at once without the offsets table: %v", round+1, len(calls), err)
				}
			}
		})
	}
}

// The same on a table made by an older version: every replica of the new
// version adds the missing columns at the same instant.
func TestOffsetsMigrateAddsColumnsAtTheSameInstant(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for round := range offsetsRounds / 2 {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				first := openOffsetsPool(t, name, where)
				table := freshOffsetsTable(t, first)
				createOldOffsetsTable(t, first, table)
				calls := make([]func() error, offsetsReplicas)
				for i := range calls {
					db := openOffsetsPool(t, name, where)
					calls[i] = func() error { return offsets.Store{Table: table, Group: "g"}.Migrate(context.Background(), db) }
				}
				if err := atOnce(calls...); err != nil {
					t.Fatalf("round %d: %d Migrate calls at once on an old offsets table: %v", round+1, len(calls), err)
				}
				row, found, err := offsets.Store{Table: table, Group: "g"}.Read(context.Background(), first, "orders", 0)
				if err != nil || !found || row.Next != 41 {
					t.Fatalf("round %d: the old row after Migrate: %+v (%v, %v)", round+1, row, found, err)
				}
			}
		})
	}
}

// The same with the replicas as processes of their own.
func TestOffsetsMigrateAtTheSameInstantFromProcesses(t *testing.T) {
	for name := range offsetsDatabases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for round := range offsetsRounds {
				where := filepath.Join(dir, fmt.Sprint(round, ".db"))
				table := freshOffsetsTable(t, openOffsetsPool(t, name, where))
				err := processesAtOnce(t, offsetsReplicas, "TestOffsetsMigrateReplica",
					offsetsDatabaseVar+"="+name, offsetsWhereVar+"="+where, offsetsTableVar+"="+table)
				if err != nil {
					t.Fatalf("round %d: %d processes creating the offsets table at once: %v", round+1, offsetsReplicas, err)
				}
			}
		})
	}
}

const offsetsDatabaseVar, offsetsWhereVar, offsetsTableVar = "INBOX_TEST_OFFSETS_DATABASE", "INBOX_TEST_OFFSETS_WHERE", "INBOX_TEST_OFFSETS_TABLE"

// TestOffsetsMigrateReplica is one replica of
// TestOffsetsMigrateAtTheSameInstantFromProcesses; it does nothing in a
// normal test run.
func TestOffsetsMigrateReplica(t *testing.T) {
	name := os.Getenv(offsetsDatabaseVar)
	if name == "" {
		t.Skip("only run as a process of TestOffsetsMigrateAtTheSameInstantFromProcesses")
	}
	db := openOffsetsPool(t, name, os.Getenv(offsetsWhereVar))
	awaitStart()
	if err := (offsets.Store{Table: os.Getenv(offsetsTableVar), Group: "g"}).Migrate(context.Background(), db); err != nil {
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
