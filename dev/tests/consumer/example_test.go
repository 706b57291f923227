package consumer_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// An inventory service reserves stock on each OrderCreated. The producer
// sends order-2 twice (a retry after a lost acknowledgement): the inbox
// applies it once.
func Example() {
	// An in-process Kafka cluster stands in for the real one.
	cluster, err := kfake.NewCluster(kfake.SeedTopics(2, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)

	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "shop.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	db.Exec(`CREATE TABLE stock (sku TEXT PRIMARY KEY, reserved INTEGER NOT NULL)`)
	db.Exec(`INSERT INTO stock VALUES ('sku-7', 0)`)
	send(brokers, "order-1", "order-2", "order-2", "order-3")

	// The service's part: an inbox, and a consumer that runs the handler
	// in the inbox's transaction.
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{})
	if err := ib.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	c, err := consumer.New(consumer.Config{
		Brokers:  brokers,
		GroupID:  "inventory",
		Topics:   []string{"orders"},
		Inbox:    ib,
		Consumer: "reserve-stock",
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			return tx.Exec(`UPDATE stock SET reserved = reserved + 1 WHERE sku = 'sku-7'`).Error
		},
		Logger: quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = c.Run(context.Background()) }()
	defer c.Close()

	// Wait for the four messages, then look at the stock.
	for ib.Counters().Processed+ib.Counters().Duplicates < 4 {
		time.Sleep(20 * time.Millisecond)
	}
	var reserved int
	db.Raw(`SELECT reserved FROM stock WHERE sku = 'sku-7'`).Scan(&reserved)
	fmt.Println("reserved:", reserved, "duplicates skipped:", ib.Counters().Duplicates)
	// Output: reserved: 3 duplicates skipped: 1
}

// send produces one OrderCreated per order id, with the producer's event id
// and time in headers; the same order id means the same event.
func send(brokers []string, orders ...string) {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "orders", Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond}
	defer w.Close()
	at := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	for _, id := range orders {
		err := w.WriteMessages(context.Background(), kafka.Message{
			Key:   []byte(id),
			Value: []byte(`{"order_id":"` + id + `","sku":"sku-7","qty":1}`),
			Headers: []kafka.Header{
				{Key: "event_id", Value: []byte("OrderCreated/" + id)},
				{Key: "event_time", Value: []byte(at)},
			},
		})
		if err != nil {
			log.Fatal(err)
		}
	}
}

// A naturally idempotent handler, here an upsert of the order's latest
// state, needs no inbox row: running it twice changes nothing. Increments
// (reserved = reserved + n) are never naturally idempotent.
func Example_naturallyIdempotent() {
	var db *gorm.DB              // the service's database
	var store storage.InboxStore // its adapter's Store, for its error classification
	type OrderState struct {
		OrderID string `gorm:"primaryKey"`
		Status  string
	}
	c, err := consumer.New(consumer.Config{
		Brokers:             []string{"localhost:9092"},
		GroupID:             "order-view",
		Topics:              []string{"orders"},
		DB:                  db,
		Classifier:          store,
		NaturallyIdempotent: true,
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			return tx.Clauses(clause.OnConflict{UpdateAll: true}).
				Create(&OrderState{OrderID: string(msg.Key), Status: "created"}).Error
		},
	})
	_, _ = c, err
}
