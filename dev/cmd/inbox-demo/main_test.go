package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
)

// The demo re-executes its own binary as consumer processes; under go test
// that binary is the test binary, which must then act as a consumer.
func TestMain(m *testing.M) {
	if ran, code := inventory.RunProcessFromEnv(os.Stderr); ran {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func runDemo(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	return out.String(), code
}

func expectVerified(t *testing.T, out string, code int) {
	t.Helper()
	if code != 0 || !strings.Contains(out, "verification           OK") {
		t.Fatalf("demo exit %d without a passing verification line", code)
	}
	if !strings.Contains(out, "chain verification     OK") {
		t.Fatalf("no passing chain verification line")
	}
	// B's outcomes are by watermark only, the ledger's by inbox row only
	// (the verification fails otherwise); the line must say so.
	if !regexp.MustCompile(`dedup paths +B [1-9][0-9]* outcomes by watermark .*, 0 by inbox row; ledger [1-9][0-9]* by inbox row, 0 by watermark`).MatchString(out) {
		t.Fatalf("no dedup paths line showing B on watermarks and the ledger on inbox rows")
	}
	if !strings.Contains(out, "applied, ") || strings.Contains(out, "FAILED") {
		t.Fatalf("unexpected report")
	}
}

func TestDemoDefault(t *testing.T) {
	out, code := runDemo(t, "-orders", "400")
	expectVerified(t, out, code)
	if !strings.Contains(out, "in-process Kafka") || !strings.Contains(out, "sqlite database") {
		t.Errorf("the default run is not SQLite with an in-process broker")
	}
}

func TestDemoRealKafkaAndDatabases(t *testing.T) {
	brokers := strings.Join(testservers.KafkaBrokers(t), ",")
	for _, db := range []struct {
		dialect string
		dsn     func(testing.TB) string
	}{
		{"sqlite", func(testing.TB) string { return "" }},
		{"postgres", testservers.PostgresDSN},
		{"mysql", testservers.MySQLDSN},
	} {
		t.Run(db.dialect, func(t *testing.T) {
			args := []string{"-orders", "400", "-brokers", brokers, "-db", db.dialect}
			if dsn := db.dsn(t); dsn != "" {
				args = append(args, "-dsn", dsn)
			}
			out, code := runDemo(t, args...)
			expectVerified(t, out, code)
		})
	}
}

func TestDemoUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-orders", "0"},
		{"-dup", "2"},
		{"-db", "oracle"},
		{"-db", "postgres"},
		{"stray"},
		{"-no-such-flag"},
	} {
		if _, code := runDemo(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
