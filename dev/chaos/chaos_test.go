package chaos_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/chaos"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/dev/testtransport"
)

// The consumer processes are this test binary, re-executed.
func TestMain(m *testing.M) {
	if ran, code := inventory.RunProcessFromEnv(os.Stderr); ran {
		os.Exit(code)
	}
	// An unknown client name fails here, not as a run on the default one.
	if _, err := testtransport.Name(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// innerVar marks the run of TestChaosShort inside its own services.
const innerVar = "INBOX_CHAOS_INNER"

// TestChaosShort is the short chaos run of make test: SQLite, PostgreSQL
// and MariaDB in turn, each with consumer kills, a broker restart, a
// database restart, connection terminations and producer duplicates.
//
// Restarting a server would break the other packages' tests that share it
// (go test runs packages in parallel), so the test runs itself again inside
// scripts/with-services.sh, on private servers it may restart at will. The
// shared servers' variables only tell it that the backends are available
// (missing ones skip it locally and fail it under CI, as everywhere).
func TestChaosShort(t *testing.T) {
	if os.Getenv(innerVar) == "1" {
		runShort(t)
		return
	}
	testservers.KafkaBrokers(t)
	testservers.PostgresDSN(t)
	testservers.MySQLDSN(t)
	scripts, err := chaos.FindScripts()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(scripts, "with-services.sh"), "--postgres", "--mariadb", "--kafka", "--",
		self, "-test.run", "^TestChaosShort$", "-test.v", "-test.count", "1", "-test.timeout", "7m")
	cmd.Env = []string{innerVar + "=1"}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case testservers.KafkaVar, testservers.PostgresVar, testservers.MySQLVar, "INBOX_KAFKA_DIR", "INBOX_POSTGRES_DIR", "INBOX_MYSQL_DIR", innerVar:
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 30 * time.Second
	start := time.Now()
	err = cmd.Run()
	t.Logf("short chaos run on private servers, %.1fs:\n%s", time.Since(start).Seconds(), out.String())
	if err != nil {
		t.Fatalf("short chaos run: %v", err)
	}
}

func runShort(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	// Batches of the scenario's hot rows deadlock on the server databases
	// (docs/RELIABILITY.md): smaller ones there keep the run short.
	for _, db := range []struct {
		dialect string
		dsn     func(testing.TB) string
		dir     string
		batch   int
	}{
		{"sqlite", func(testing.TB) string { return "" }, "", 10},
		{"postgres", testservers.PostgresDSN, os.Getenv("INBOX_POSTGRES_DIR"), 3},
		{"mysql", testservers.MySQLDSN, os.Getenv("INBOX_MYSQL_DIR"), 3},
	} {
		t.Run(db.dialect, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			rep, err := chaos.Run(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers,
				KafkaDir: os.Getenv("INBOX_KAFKA_DIR"), DBDir: db.dir, Strict: testservers.Required(),
				Orders: 500, DupRate: 0.1, Waves: 3, Partitions: 4, Consumers: 3, BatchSize: db.batch,
				Session: 3 * time.Second, Duration: 20 * time.Second, Kills: 5,
				BrokerRestarts: 1, DBRestarts: 1, Terminations: 2, Storms: 1, StormLength: 2 * time.Second, CatchUp: 2 * time.Minute,
				Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			})
			if rep != nil {
				t.Log("\n" + rep.String())
			}
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK() {
				t.Fatalf("ledger check failed: %v", rep.Problems)
			}
			if rep.Kills < 5 {
				t.Errorf("%d kills, want 5", rep.Kills)
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
