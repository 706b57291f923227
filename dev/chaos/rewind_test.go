package chaos_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/chaos"
)

// TestChaosRewind is the rewind phase, CI-sized: while service A places
// orders, its database (its orders and outbox A's tables) is put back
// twice to a backup taken a few seconds earlier that held rows not yet
// published, once with A's relays stopped and started again around the
// restore and once with them running through it. Every order the rewinds
// left to deliver (those still in A's table, and those whose OrderCreated
// was published before the restore took them back) must be reserved and
// booked once, in order per key, and the relays must have said at Warn
// that the database went back and published under a new epoch; no process
// may log an ERROR.
//
// It restarts no server, so it runs on the shared ones. INBOX_REWIND_DB
// (comma-separated) limits the databases.
func TestChaosRewind(t *testing.T) {
	const rewinds = 2
	runPhase(t, "INBOX_REWIND_DB", 3*time.Minute, []phaseDB{sqliteDB, postgresDB, mysqlDB},
		func(ctx context.Context, cfg chaos.Config, _ phaseDB) (*chaos.ChainReport, error) {
			cfg.Partitions = 4
			cfg.Session, cfg.Duration, cfg.CatchUp = 3*time.Second, 16*time.Second, 2*time.Minute
			return chaos.RunRewind(ctx, cfg, chaos.RewindConfig{Orders: 320, Rewinds: rewinds, Lease: 2 * time.Second})
		},
		func(t *testing.T, rep *chaos.ChainReport) {
			for _, p := range rep.Problems {
				t.Error(p)
			}
			if len(rep.Rewinds) != rewinds {
				t.Fatalf("%d rewinds, want %d", len(rep.Rewinds), rewinds)
			}
			if !rep.Rewinds[0].RelaysRestarted || rep.Rewinds[1].RelaysRestarted {
				t.Errorf("want the first restore with A's relays restarted, the second with them running through it")
			}
			if rep.RolledBackSent == 0 {
				t.Errorf("no order published before a restore took it back: the restores tested no renumbering")
			}
			if rep.OrdersTopic.Epochs < 2 {
				t.Errorf("%d epochs on A's topic: no relay published under a new one", rep.OrdersTopic.Epochs)
			}
		},
		chaos.RewindTable)
}

// rewindFailoverInnerVar marks the run of TestChaosRewindFailover inside
// its own PostgreSQL servers.
const rewindFailoverInnerVar = "INBOX_REWIND_FAILOVER_INNER"

// TestChaosRewindFailover is the rewind phase by failover, CI-sized: the
// chain's PostgreSQL database streams to an asynchronous standby; twice,
// the standby is cut off after it received rows of outbox A not yet
// published, orders are placed, published and applied for a few seconds,
// the primary is killed and the standby promoted (A's relays restarted
// around it the first time, running through it the second). The whole
// database goes back, B's and the ledger's tables too, so the consumers
// store their offsets. Every order the failovers left to deliver must be
// reserved and booked once, in order per key, and no process may log an
// ERROR. Like TestFailoverShort it runs itself again inside
// scripts/with-services.sh, on private PostgreSQL servers (the shared Kafka
// broker stays).
func TestChaosRewindFailover(t *testing.T) {
	if os.Getenv(rewindFailoverInnerVar) == "1" {
		runRewindFailover(t)
		return
	}
	testservers.KafkaBrokers(t)
	testservers.PostgresDSN(t)
	chaos.RunUnderStandby(t, "TestChaosRewindFailover", rewindFailoverInnerVar, false, 5*time.Minute, "rewind by failover on private PostgreSQL servers")
}

func runRewindFailover(t *testing.T) {
	const rewinds = 2
	dsn, standby := os.Getenv("INBOX_POSTGRES_FAILOVER_DSN"), os.Getenv("INBOX_POSTGRES_STANDBY_DIR")
	if dsn == "" || standby == "" {
		t.Fatal("no standby: run through scripts/with-services.sh --postgres-standby async")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := chaos.RunRewind(ctx, chaos.Config{
		Dialect: "postgres", DSN: dsn, Brokers: testservers.KafkaBrokers(t),
		DBDir: os.Getenv("INBOX_POSTGRES_DIR"), StandbyDir: standby, Replication: os.Getenv("INBOX_POSTGRES_REPLICATION"),
		StoreOffsets: true, Partitions: 4, Session: 3 * time.Second, Duration: 20 * time.Second, CatchUp: 2 * time.Minute,
		Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
	}, chaos.RewindConfig{Orders: 400, Rewinds: rewinds, Lease: 2 * time.Second})
	if rep != nil {
		t.Log("\n" + rep.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Problems {
		t.Error(p)
	}
	if len(rep.Rewinds) != rewinds {
		t.Fatalf("%d rewinds, want %d", len(rep.Rewinds), rewinds)
	}
	for i, rw := range rep.Rewinds {
		if !rw.Failover {
			t.Errorf("rewind %d was no failover", i+1)
		}
	}
	if !rep.Rewinds[0].RelaysRestarted || rep.Rewinds[1].RelaysRestarted {
		t.Errorf("want the first failover with A's relays restarted, the second with them running through it")
	}
	if rep.RolledBackSent == 0 {
		t.Errorf("no order published before a failover took it back: the failovers tested no renumbering")
	}
}
