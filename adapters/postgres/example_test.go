package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
)

// A consumer that applies each order event once, with its inbox in a
// PostgreSQL table partitioned by day. It needs a server, so it is only
// compiled here; TestExample runs it against the test server.
func Example() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(os.Getenv("INBOX_POSTGRES_DSN")), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	store, err := inboxpg.New(inboxpg.Options{Schema: "inbox_example", Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{RetentionDays: 30})
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// Create the coming days' partitions. A service keeps doing it, and
	// drops expired days as whole partitions, with
	//	go ib.RunMaintenance(ctx, time.Hour)
	if _, err := ib.Maintain(ctx); err != nil {
		log.Fatal(err)
	}

	if err := db.Exec(`CREATE TABLE IF NOT EXISTS inbox_example.stock (sku text PRIMARY KEY, reserved int NOT NULL)`).Error; err != nil {
		log.Fatal(err)
	}
	reserve := func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
		// Not idempotent by itself: the inbox row makes it run once.
		return tx.Exec(`INSERT INTO inbox_example.stock (sku, reserved) VALUES ('sku-1', 1)
			ON CONFLICT (sku) DO UPDATE SET reserved = stock.reserved + 1`).Error
	}
	msg := inbox.Message{
		Consumer: "stock-reserver",
		ID:       "order-42-placed", // set by the producer
		Time:     time.Now(),        // the event time set by the producer, never the processing time
		Topic:    "orders", Partition: 3, Offset: 1017,
	}
	for range 2 { // the broker redelivers
		out, err := ib.Process(ctx, msg, reserve)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out) // commit the broker offset only now
	}
	var reserved int
	db.Raw(`SELECT reserved FROM inbox_example.stock WHERE sku = 'sku-1'`).Scan(&reserved)
	fmt.Println("reserved:", reserved)
}
