package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/chaos"
)

// failoverInnerVar marks the run of TestFailoverShort inside its own services.
const failoverInnerVar = "INBOX_FAILOVER_INNER"

// TestFailoverShort is the short failover run of make test: a PostgreSQL
// primary with an asynchronous streaming standby, killed with SIGKILL twice
// under load (its WAL senders paused for a second first, so that the
// standby lacks the last acknowledged commits), the standby promoted, the
// consumers (StoreOffsets) reconnecting through a multi-host DSN. Nothing
// may be lost or applied twice. Like TestChaosShort it runs itself again
// inside scripts/with-services.sh, on private servers.
func TestFailoverShort(t *testing.T) {
	if os.Getenv(failoverInnerVar) == "1" {
		runFailoverShort(t)
		return
	}
	testservers.KafkaBrokers(t)
	testservers.PostgresDSN(t)
	chaos.RunUnderStandby(t, "TestFailoverShort", failoverInnerVar, true, 6*time.Minute, "short failover run on private servers")
}

func runFailoverShort(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	dsn, standby := os.Getenv("INBOX_POSTGRES_FAILOVER_DSN"), os.Getenv("INBOX_POSTGRES_STANDBY_DIR")
	if dsn == "" || standby == "" {
		t.Fatal("no standby: run through scripts/with-services.sh --postgres-standby")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := chaos.Run(ctx, chaos.Config{
		Dialect: "postgres", DSN: dsn, Brokers: brokers,
		DBDir: os.Getenv("INBOX_POSTGRES_DIR"), StandbyDir: standby, Replication: os.Getenv("INBOX_POSTGRES_REPLICATION"),
		Strict: true, StoreOffsets: true, Failovers: 2, LagWindow: time.Second,
		Orders: 800, DupRate: 0.1, Waves: 6, Partitions: 4, Consumers: 3, BatchSize: 3,
		Session: 3 * time.Second, Duration: 30 * time.Second, Kills: 3, CatchUp: 2 * time.Minute,
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
	if n := len(rep.FailoverStats); n != 2 {
		t.Errorf("%d failovers, want 2", n)
	}
}
