//go:build cgo

package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
)

// Order is the example's business table.
type Order struct {
	ID  string `gorm:"primaryKey"`
	SKU string
}

// printer stands in for Kafka: it prints what the relay publishes.
type printer struct{}

func (printer) Publish(_ context.Context, msgs []kafka.Message) error {
	for _, m := range msgs {
		var id string
		for _, h := range m.Headers {
			if h.Key == consumer.HeaderEventID { // the id header the consumer reads
				id = string(h.Value)
			}
		}
		fmt.Printf("%s key=%s value=%s event_id=%s\n", m.Topic, m.Key, m.Value, id)
	}
	return nil
}

// Service A takes an order and enqueues OrderCreated in the same
// transaction; the relay publishes it. A rolled-back order publishes
// nothing.
func Example_outbox() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
	ob, err := outbox.New(db, store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	_ = db.AutoMigrate(&Order{})

	takeOrder := func(id string, fail bool) error {
		return db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&Order{ID: id, SKU: "sku-7"}).Error; err != nil {
				return err
			}
			if err := ob.Enqueue(ctx, tx, outbox.Message{
				Topic: "orders", Key: []byte("sku-7"), Value: []byte(`{"order":"` + id + `"}`),
				ID: "order-created-" + id, // stable: a retry of this transaction sends the same id
			}); err != nil {
				return err
			}
			if fail {
				return fmt.Errorf("payment declined")
			}
			return nil
		})
	}
	fmt.Println(takeOrder("o1", false))
	fmt.Println(takeOrder("o2", true))
	fmt.Println(takeOrder("o3", false))

	// A plain pool is not a transaction: the message would commit alone.
	fmt.Println(ob.Enqueue(ctx, db, outbox.Message{Topic: "orders", Value: []byte("x")}))

	relay, err := ob.NewRelay(printer{}, outbox.RelayConfig{ID: "relay-1", Lease: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.PublishOnce(ctx)
	fmt.Println(n, err)
	// Output:
	// <nil>
	// payment declined
	// <nil>
	// inbox: invalid configuration: Enqueue needs a *gorm.DB inside a transaction (db.Begin or db.Transaction): outside one the messages would commit without the effect
	// orders key=sku-7 value={"order":"o1"} event_id=order-created-o1
	// orders key=sku-7 value={"order":"o3"} event_id=order-created-o3
	// 2 <nil>
}

// InventoryStock is the inventory service's table in the chain example.
type InventoryStock struct {
	SKU      string `gorm:"primaryKey"`
	Reserved int
}

// The middle of the chain: service B consumes OrderCreated through the
// inbox, reserves stock and enqueues StockReserved in the same transaction.
// A redelivered OrderCreated is a duplicate: neither the reservation nor the
// StockReserved event happens twice, and the event id of StockReserved is
// derived from the order's, so even a re-run of the whole transaction sends
// the same id downstream.
func Example_outboxInInboxHandler() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-chain")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "inventory.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	inboxStore, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, inboxStore, inbox.Config{})
	outboxStore, _ := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
	ob, _ := outbox.New(db, outboxStore, outbox.Config{})
	if err := errors.Join(ib.Migrate(ctx), ob.Migrate(ctx), db.AutoMigrate(&InventoryStock{})); err != nil {
		log.Fatal(err)
	}
	db.Create(&InventoryStock{SKU: "sku-7"})

	reserve := func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
		if err := tx.Model(&InventoryStock{}).Where("sku = ?", "sku-7").Update("reserved", gorm.Expr("reserved + 1")).Error; err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, outbox.Message{
			Topic: "stock", Key: []byte("sku-7"), Value: []byte(`{"reserved":1}`),
			ID: "stock-reserved-for-" + msg.ID,
		})
	}
	orderCreated := inbox.Message{Consumer: "inventory", ID: "order-created-o1", Time: time.Now()}
	for range 2 { // the broker delivers it twice
		out, err := ib.Process(ctx, orderCreated, reserve)
		fmt.Println(out, err)
	}
	relay, _ := ob.NewRelay(printer{}, outbox.RelayConfig{ID: "relay-b"})
	if _, err := relay.PublishOnce(ctx); err != nil {
		log.Fatal(err)
	}
	var s InventoryStock
	db.First(&s, "sku = ?", "sku-7")
	fmt.Println("reserved:", s.Reserved)
	// Output:
	// processed <nil>
	// duplicate <nil>
	// stock key=sku-7 value={"reserved":1} event_id=stock-reserved-for-order-created-o1
	// reserved: 1
}
