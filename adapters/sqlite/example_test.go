package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
)

// Stock is the business table of the example: reserving stock is an
// increment, which is never idempotent on its own.
type Stock struct {
	SKU      string `gorm:"primaryKey"`
	Reserved int
}

// The seeds' scenario: an OrderCreated event is delivered twice (a rebalance
// redelivered it); the reservation is applied once.
func Example_process() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)

	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, err := inbox.New(db, store, inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Stock{}); err != nil {
		log.Fatal(err)
	}
	db.Create(&Stock{SKU: "sku-7"})

	reserve := func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
		return tx.Model(&Stock{}).Where("sku = ?", "sku-7").
			Update("reserved", gorm.Expr("reserved + ?", 2)).Error
	}
	msg := inbox.Message{
		Consumer: "inventory",
		ID:       "7f1c9e2a-5b6d-4a31-9c1e-2d8f7b3a6e10",
		Time:     time.Now(), // in real code: the event time the producer set
		Topic:    "orders", Partition: 3, Offset: 88121,
	}
	for range 2 {
		out, err := ib.Process(ctx, msg, reserve)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out)
	}
	var s Stock
	db.First(&s, "sku = ?", "sku-7")
	fmt.Println("reserved:", s.Reserved)
	// Output:
	// processed
	// duplicate
	// reserved: 2
}

// A batch claims all its inbox rows with one statement; the handler runs only
// for the new messages, and a failing one is isolated.
func Example_processBatch() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, _ := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{})
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	now := time.Now()
	msg := func(id string) inbox.Message { return inbox.Message{Consumer: "billing", ID: id, Time: now} }
	handler := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		if m.ID == "poison" {
			return fmt.Errorf("cannot bill %s", m.ID)
		}
		return nil
	}
	results, err := ib.ProcessBatch(ctx, []inbox.Message{msg("a"), msg("b"), msg("a"), msg("poison")}, handler)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Println(r.Outcome, r.Err)
	}
	// Output:
	// processed <nil>
	// processed <nil>
	// duplicate <nil>
	// failed inbox: consumer "billing" event "poison": cannot bill poison
}
