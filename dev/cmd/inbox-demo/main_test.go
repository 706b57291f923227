package main

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
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
	// Each figure says where it comes from, and the parts add up.
	dups := figures(t, out, `duplicates skipped +(\d+) +\((\d+) sent twice by the producer \+ (\d+) redelivered by Kafka`)
	if dups[0] != dups[1]+dups[2] || dups[1] == 0 {
		t.Errorf("duplicates skipped %d, want the producer's %d + the %d redelivered", dups[0], dups[1], dups[2])
	}
	applied := figures(t, out, `reservations applied +(\d+)`)[0]
	naive := figures(t, out, `without the inbox +(\d+) +reservations the same deliveries would have applied: (\d+) too many \((\d+) duplicates in the first group, (\d+) by the replay\)`)
	if naive[0] != applied+naive[1] || naive[1] != naive[2]+naive[3] || naive[2] != dups[0] || naive[3] == 0 {
		t.Errorf("without the inbox %v: want %d applied + the %d duplicates + the replay's deliveries", naive, applied, dups[0])
	}
	b := figures(t, out, `duplicates dropped +(\d+) +by B's watermarks: (\d+) copies relay A published again \+ (-?\d+) redelivered by Kafka`)
	l := figures(t, out, `(\d+) +by the ledger's inbox rows: (\d+) copies relay B published again \+ (-?\d+) redelivered by Kafka`)
	for _, f := range [][]int{b, l} {
		if f[0] != f[1]+f[2] || f[2] < 0 {
			t.Errorf("duplicates dropped %d: want %d published again + %d (not negative) redelivered", f[0], f[1], f[2])
		}
	}
	chain := figures(t, out, `without dedup +B would have reserved (\d+) times for (\d+) orders \((\d+) too many\) and the ledger booked (\d+) times \((\d+) too many`)
	if chain[0] != chain[1]+chain[2] || chain[2] != b[0] || chain[3] != chain[1]+chain[4] || chain[4] != l[0] {
		t.Errorf("without dedup %v: want the orders plus the duplicates B (%d) and the ledger (%d) dropped", chain, b[0], l[0])
	}
}

// figures returns the numbers pattern's groups match in out, failing t if
// it does not match.
func figures(t *testing.T, out, pattern string) []int {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no line matches %s", pattern)
	}
	ns := make([]int, len(m)-1)
	for i, g := range m[1:] {
		n, err := strconv.Atoi(g)
		if err != nil {
			t.Fatal(err)
		}
		ns[i] = n
	}
	return ns
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
