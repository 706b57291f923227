package chaos_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/chaos"
)

// TestChaosPartition is the partition phase, CI-sized: three consumer
// processes, each reaching the database through a link of its own; one
// link freezes (nothing closed) while its member holds a transaction open,
// and is healed (PostgreSQL, with StoreOffsets) or cut (MariaDB, without).
// The frozen member's partitions must be committed on by a healthy member
// within MaxProcessingStall + SessionTimeout + the rebalance, the member
// must come back, every order must be applied once, and no message may be
// charged an attempt or logged as failed at Error.
//
// It restarts nothing, so it runs on the shared servers.
// INBOX_PARTITION_DB (comma-separated) limits the databases.
func TestChaosPartition(t *testing.T) {
	brokers := testservers.KafkaBrokers(t)
	only := os.Getenv("INBOX_PARTITION_DB")
	var reps []*chaos.PartitionReport
	for _, db := range []struct {
		dialect      string
		dsn          func(testing.TB) string
		storeOffsets bool
		end          string
	}{
		{"postgres", testservers.PostgresDSN, true, "heal"},
		{"mysql", testservers.MySQLDSN, false, "cut"},
	} {
		if only != "" && !strings.Contains(","+only+",", ","+db.dialect+",") {
			continue
		}
		t.Run(db.dialect, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := chaos.RunPartition(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers, StoreOffsets: db.storeOffsets,
				Orders: 1000, Partitions: 4, Consumers: 3, BatchSize: 1, Session: 2 * time.Second,
				CatchUp: time.Minute, Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			}, chaos.PartitionConfig{
				Freezes: 1, FreezeFor: 15 * time.Second, Ends: []string{db.end},
				DatabaseTimeout: time.Second, MaxProcessingStall: 4 * time.Second, IdleTxTimeout: 3 * time.Second,
			})
			if rep != nil {
				t.Log("\n" + rep.String())
				reps = append(reps, rep)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range rep.Problems {
				t.Error(p)
			}
			if len(rep.Freezes) != 1 || rep.Freezes[0].Open < 1 {
				t.Errorf("freezes %+v, want one, made while the member held a transaction open", rep.Freezes)
			}
		})
	}
	t.Log("\n" + chaos.PartitionTable(reps))
}
