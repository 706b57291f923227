package chaos_test

import (
	"context"
	"testing"
	"time"

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
	pg, my := postgresDB, mysqlDB
	pg.storeOffsets, pg.end = true, "heal"
	my.end = "cut"
	runPhase(t, "INBOX_PARTITION_DB", 3*time.Minute, []phaseDB{pg, my},
		func(ctx context.Context, cfg chaos.Config, db phaseDB) (*chaos.PartitionReport, error) {
			cfg.Orders, cfg.Partitions, cfg.Consumers, cfg.BatchSize = 1000, 4, 3, 1
			cfg.Session, cfg.CatchUp = 2*time.Second, time.Minute
			return chaos.RunPartition(ctx, cfg, chaos.PartitionConfig{
				Freezes: 1, FreezeFor: 15 * time.Second, Ends: []string{db.end},
				DatabaseTimeout: time.Second, MaxProcessingStall: 4 * time.Second, IdleTxTimeout: 3 * time.Second,
			})
		},
		func(t *testing.T, rep *chaos.PartitionReport) {
			for _, p := range rep.Problems {
				t.Error(p)
			}
			if len(rep.Freezes) != 1 || rep.Freezes[0].Open < 1 {
				t.Errorf("freezes %+v, want one, made while the member held a transaction open", rep.Freezes)
			}
		},
		chaos.PartitionTable)
}
