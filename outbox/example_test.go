//go:build cgo

package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
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
			if h.Key == outbox.HeaderEventID {
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
func ExampleOutbox_Enqueue() {
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

// Event ids are UUIDv7 when the caller gives none: they carry the event
// time, and the event time header carries it too.
func ExampleNewEventID() {
	at := time.Date(2026, 12, 1, 3, 4, 5, 0, time.UTC)
	id := outbox.NewEventID(at)
	fmt.Println(len(id), id[:13], id[14:15])
	// Output: 36 01a22f8f-3888 7
}
