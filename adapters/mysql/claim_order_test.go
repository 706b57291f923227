package mysql_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/claimrace"
)

func isDeadlock(err error) bool { return number(err) == 1213 }

// TestClaimOppositeOrdersDoNotDeadlock: two transactions that claim the same
// new keys at the same moment, in opposite orders, must not deadlock (1213):
// Claim inserts in key order, whatever order the caller gives, so the second
// waits for the first instead. Inserting in the caller's order deadlocked in
// most rounds.
func TestClaimOppositeOrdersDoNotDeadlock(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	const rounds, n = 30, 200
	deadlocks, err := claimrace.OppositeOrders(t.Context(), db, store, rounds, n, isDeadlock)
	if err != nil {
		t.Fatal(err)
	}
	if deadlocks > 0 {
		t.Errorf("%d deadlocks in %d rounds of two claims of the same %d keys in opposite orders, want 0", deadlocks, rounds, n)
	}
}

// TestClaimOverlappingBatchesStress: several transactions at once claim
// overlapping, shuffled batches of the same keys; it logs the retries and
// deadlocks (the figures of the claim-order change) and fails on more than
// a few deadlocks. Run it on its own:
//
//	go test -count=1 -run ClaimOverlappingBatchesStress -v ./adapters/mysql/
func TestClaimOverlappingBatchesStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	const workers, rounds, pool, batch = 4, 50, 200, 100
	res, err := claimrace.Overlapping(t.Context(), db, store, workers, rounds, pool, batch, isDeadlock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d workers x %d rounds, batches of %d of %d keys: %d claims, %d retries, %d deadlocks",
		workers, rounds, batch, pool, res.Claims, res.Retries, res.Deadlocks)
	if res.Deadlocks > rounds/10 {
		t.Errorf("%d deadlocks in %d rounds, want (near) 0", res.Deadlocks, rounds)
	}
}

// TestClaimReportsInCallerOrder: Claim inserts in key order but reports
// inserted[i] for rows[i] as the caller gave them, across statement chunks.
func TestClaimReportsInCallerOrder(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	rows := claimrace.Keys("order", 2500)
	var before []inbox.Row
	for i, r := range rows {
		if i%3 == 0 {
			before = append(before, r)
		}
	}
	claimAll := func(rows []inbox.Row) []bool {
		var inserted []bool
		if err := db.Transaction(func(tx *gorm.DB) error {
			var err error
			inserted, err = store.Claim(t.Context(), tx, rows)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return inserted
	}
	claimAll(before)
	rand.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	got := claimAll(rows)
	var wrong int
	for i, r := range rows {
		var n int
		if _, err := fmt.Sscanf(r.EventID[len(r.EventID)-6:], "%d", &n); err != nil {
			t.Fatal(err)
		}
		if want := n%3 != 0; got[i] != want {
			wrong++
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d rows reported wrongly", wrong, len(rows))
	}
}
