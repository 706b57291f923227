package chaos

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
)

// RunUnderStandby runs test (the calling test's name) again, in the same
// test binary, inside scripts/with-services.sh --postgres-standby async
// --kafka: on private PostgreSQL servers, a primary and its asynchronous
// standby, and with ownKafka a private Kafka broker too (otherwise the
// shared one stays). The run sets inner=1, which the test reads to do its
// work instead of starting servers; it fails t if the run fails, and logs
// its output as what, with its duration. The servers' variables of the
// outer run, and every INBOX_*_INNER marker, are left out of its
// environment.
func RunUnderStandby(t *testing.T, test, inner string, ownKafka bool, timeout time.Duration, what string) {
	t.Helper()
	scripts, err := FindScripts()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(scripts, "with-services.sh"), "--postgres-standby", "async", "--kafka", "--",
		self, "-test.run", "^"+test+"$", "-test.v", "-test.count", "1", "-test.timeout", (timeout - time.Minute).String())
	cmd.Env = []string{inner + "=1"}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case testservers.PostgresVar, testservers.MySQLVar, "INBOX_POSTGRES_DIR", "INBOX_MYSQL_DIR",
			"INBOX_POSTGRES_STANDBY_DIR", "INBOX_POSTGRES_FAILOVER_DSN", "INBOX_POSTGRES_REPLICATION":
			continue
		case testservers.KafkaVar, "INBOX_KAFKA_DIR":
			if ownKafka {
				continue
			}
		}
		if strings.HasPrefix(name, "INBOX_") && strings.HasSuffix(name, "_INNER") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 30 * time.Second
	start := time.Now()
	err = cmd.Run()
	t.Logf("%s, %.1fs:\n%s", what, time.Since(start).Seconds(), out.String())
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
