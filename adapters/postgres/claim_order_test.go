package postgres_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance/claimrace"
)

// isDeadlock: SQLSTATE 40P01, deadlock_detected.
func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}

// TestClaimOppositeOrdersDoNotDeadlock: two transactions that claim the same
// new keys at the same moment, in opposite orders, must not deadlock
// (40P01): Claim inserts in key order, whatever order the caller gives, so
// the second waits for the first instead. Inserting in the caller's order
// deadlocked in most rounds of 1000 keys (each deadlock is found after
// deadlock_timeout, 1 s by default).
func TestClaimOppositeOrdersDoNotDeadlock(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	claimrace.TestOppositeOrders(t, db, store, 20, 1000, isDeadlock)
}

// TestClaimOverlappingBatchesStress: several transactions at once claim
// overlapping, shuffled batches of the same keys; it logs the retries and
// deadlocks:
//
//	go test -count=1 -run ClaimOverlappingBatchesStress -v ./adapters/postgres/
func TestClaimOverlappingBatchesStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	db, store := fresh(t, inboxpg.Options{})
	claimrace.TestStress(t, db, store, isDeadlock)
}

// TestClaimReportsInCallerOrder: Claim inserts in key order but reports
// inserted[i] for rows[i] as the caller gave them, across statement chunks.
func TestClaimReportsInCallerOrder(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	if err := claimrace.CallerOrder(t.Context(), db, store, 2500); err != nil {
		t.Fatal(err)
	}
}
