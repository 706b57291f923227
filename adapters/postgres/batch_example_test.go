package postgres_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance/testservers"
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
// It needs a server, so it is only compiled here; TestBatchExample runs it.
func Example_batchHandlerSumsPerKey() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(os.Getenv("INBOX_POSTGRES_DSN")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, err := inboxpg.New(inboxpg.Options{Schema: "inbox_batch_example", Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	db.Exec(`CREATE TABLE inbox_batch_example.stock (sku text PRIMARY KEY, reserved int NOT NULL)`)
	db.Exec(`INSERT INTO inbox_batch_example.stock VALUES ('sku-1', 0), ('sku-2', 0)`)

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
			values = append(values, "(?::text, ?::int)")
			args = append(args, sku, perSKU[sku])
		}
		return tx.Exec(`UPDATE inbox_batch_example.stock s SET reserved = s.reserved + v.qty
			FROM (VALUES `+strings.Join(values, ", ")+`) AS v(sku, qty) WHERE s.sku = v.sku`, args...).Error
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
	db.Raw(`SELECT sku, reserved FROM inbox_batch_example.stock ORDER BY sku`).Scan(&stock)
	fmt.Println(stock)
}

func TestBatchExample(t *testing.T) {
	runExample(t, "inbox_batch_example", Example_batchHandlerSumsPerKey,
		"order-1 processed\norder-2 processed\norder-3 processed\norder-2 duplicate\n[{sku-1 5} {sku-2 1}]\n")
}

// The trap the example avoids: one UPDATE ... FROM a list that names a row
// twice changes that row once.
func TestBatchHandlerTrap(t *testing.T) {
	db, err := openDB(testservers.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeDB(db) }()
	table := "batch_trap_" + fmt.Sprint(time.Now().UnixNano())
	defer db.Exec(`DROP TABLE IF EXISTS ` + table)
	if err := db.Exec(`CREATE TABLE ` + table + ` (sku text PRIMARY KEY, reserved int NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	db.Exec(`INSERT INTO ` + table + ` VALUES ('sku-1', 0)`)
	res := db.Exec(`UPDATE `+table+` s SET reserved = s.reserved + v.qty FROM (VALUES (?::text, ?::int), (?::text, ?::int)) AS v(sku, qty) WHERE s.sku = v.sku`,
		"sku-1", 2, "sku-1", 3)
	if res.Error != nil {
		t.Fatal(res.Error)
	}
	var reserved int
	db.Raw(`SELECT reserved FROM ` + table).Scan(&reserved)
	if reserved == 5 || res.RowsAffected != 1 {
		t.Fatalf("reserved %d (%d rows updated): PostgreSQL applied both source rows; the batch handler's doc is wrong", reserved, res.RowsAffected)
	}
	t.Logf("two changes of one row in one UPDATE ... FROM: reserved %d, not 5", reserved)
}
