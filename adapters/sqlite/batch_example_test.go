package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
)

// reservation is what an order event asks of the stock.
type reservation struct {
	sku string
	qty int
}

// A batch handler applies a whole batch with one statement. Two events of a
// batch can touch one row: UPDATE ... FROM a list with that row twice
// updates it once, from one of the two, and drops the other's change
// without an error while both inbox rows say processed
// (TestBatchHandlerTrap). So the handler sums the changes per row first.
func Example_batchHandlerSumsPerKey() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{})
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	db.Exec(`CREATE TABLE stock (sku TEXT PRIMARY KEY, reserved INTEGER NOT NULL)`)
	db.Exec(`INSERT INTO stock VALUES ('sku-1', 0), ('sku-2', 0)`)

	// The events' payloads, by event id (a consumer reads them from the
	// Kafka messages).
	events := map[string]reservation{"order-1": {"sku-1", 2}, "order-2": {"sku-2", 1}, "order-3": {"sku-1", 3}}
	reserve := func(ctx context.Context, tx *gorm.DB, msgs []inbox.Message) error {
		perSKU := map[string]int{}
		for _, m := range msgs {
			perSKU[events[m.ID].sku] += events[m.ID].qty
		}
		var values []string
		var args []any
		for _, sku := range slices.Sorted(maps.Keys(perSKU)) {
			values = append(values, "(?, ?)")
			args = append(args, sku, perSKU[sku])
		}
		return tx.Exec(`UPDATE stock SET reserved = reserved + v.column2
			FROM (VALUES `+strings.Join(values, ", ")+`) AS v WHERE stock.sku = v.column1`, args...).Error
	}
	var batch []inbox.Message
	for _, id := range []string{"order-1", "order-2", "order-3", "order-2"} { // order-2 redelivered
		batch = append(batch, inbox.Message{Consumer: "stock", ID: id, Time: time.Now(), Topic: "orders"})
	}
	results, err := ib.ProcessBatchFunc(ctx, batch, reserve)
	if err != nil {
		log.Fatal(err)
	}
	for i, r := range results {
		fmt.Println(batch[i].ID, r.Outcome)
	}
	var stock []struct {
		SKU      string
		Reserved int
	}
	db.Raw(`SELECT sku, reserved FROM stock ORDER BY sku`).Scan(&stock)
	fmt.Println(stock)
	// Output:
	// order-1 processed
	// order-2 processed
	// order-3 processed
	// order-2 duplicate
	// [{sku-1 5} {sku-2 1}]
}

// The trap the example avoids: one UPDATE ... FROM a list that names a row
// twice changes that row once.
func TestBatchHandlerTrap(t *testing.T) {
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "trap.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(`CREATE TABLE stock (sku TEXT PRIMARY KEY, reserved INTEGER NOT NULL)`)
	db.Exec(`INSERT INTO stock VALUES ('sku-1', 0)`)
	res := db.Exec(`UPDATE stock SET reserved = reserved + v.column2 FROM (VALUES (?, ?), (?, ?)) AS v WHERE stock.sku = v.column1`, "sku-1", 2, "sku-1", 3)
	if res.Error != nil {
		t.Fatal(res.Error)
	}
	var reserved int
	db.Raw(`SELECT reserved FROM stock`).Scan(&reserved)
	if reserved == 5 || res.RowsAffected != 1 {
		t.Fatalf("reserved %d (%d rows updated): SQLite applied both source rows; the batch handler's doc is wrong", reserved, res.RowsAffected)
	}
	t.Logf("two changes of one row in one UPDATE ... FROM: reserved %d, not 5", reserved)
}
