package mysql_test

import (
	"testing"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance/claimrace"
)

func isDeadlock(err error) bool { return number(err) == 1213 }

// TestClaimOppositeOrdersDoNotDeadlock: two transactions that claim the same
// new keys at the same moment, in opposite orders, must not deadlock (1213):
// Claim inserts in key order, whatever order the caller gives, so the second
// waits for the first instead. Inserting in the caller's order deadlocked in
// about half of the rounds.
func TestClaimOppositeOrdersDoNotDeadlock(t *testing.T) {
	db := testDB(t, nil)
	claimrace.TestOppositeOrders(t, db, newStore(t, db, inboxmysql.Options{}), 30, 200, isDeadlock)
}

// TestClaimOverlappingBatchesStress: several transactions at once claim
// overlapping, shuffled batches of the same keys; it logs the retries and
// deadlocks:
//
//	go test -count=1 -run ClaimOverlappingBatchesStress -v ./adapters/mysql/
func TestClaimOverlappingBatchesStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	db := testDB(t, nil)
	claimrace.TestStress(t, db, newStore(t, db, inboxmysql.Options{}), isDeadlock)
}

// TestClaimReportsInCallerOrder: Claim inserts in key order but reports
// inserted[i] for rows[i] as the caller gave them, across statement chunks.
func TestClaimReportsInCallerOrder(t *testing.T) {
	db := testDB(t, nil)
	if err := claimrace.CallerOrder(t.Context(), db, newStore(t, db, inboxmysql.Options{}), 2500); err != nil {
		t.Fatal(err)
	}
}
