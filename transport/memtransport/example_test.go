//go:build cgo

package memtransport_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/transport/memtransport"
)

// noRetries classifies database errors for the consumer; in a real test
// pass the adapter's Store (adapters/sqlite, adapters/postgres, ...).
type noRetries struct{}

func (noRetries) IsRetryable(error) bool { return false }

// A handler tested with no broker: the cluster takes the place of Kafka in
// consumer.Config.Kafka.Transport, the test produces the messages, runs the
// consumer until the group's committed offset passes them, and checks the
// handler's effects and the dead letters.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	cluster := memtransport.NewCluster()
	for topic, partitions := range map[string]int{"stock": 1, "stock.dlq": 1} {
		if err := cluster.CreateTopic(topic, partitions); err != nil {
			panic(err)
		}
	}
	db, err := gorm.Open(sqlite.Open("file:example?mode=memory&cache=shared"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	if err := db.Exec(`CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)`).Error; err != nil {
		panic(err)
	}

	// The handler sets a SKU's stock level: the same however often it runs.
	setStock := func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
		qty, err := strconv.Atoi(string(m.Value))
		if err != nil {
			return inbox.Permanent(err) // no retry can fix it: a dead letter
		}
		return tx.Exec(`INSERT INTO stock (sku, qty) VALUES (?, ?) ON CONFLICT (sku) DO UPDATE SET qty = excluded.qty`,
			string(m.Key), qty).Error
	}
	c, err := consumer.New(consumer.Config{
		GroupID:             "warehouse",
		Topics:              []string{"stock"},
		Handler:             setStock,
		NaturallyIdempotent: true,
		DB:                  db,
		Classifier:          noRetries{},
		Kafka: consumer.KafkaConfig{
			Transport:      cluster.Client(memtransport.Eager),
			CommitInterval: 10 * time.Millisecond, // the test waits for the commit
		},
		Failure: consumer.FailureConfig{Policy: consumer.DeadLetter, DeadLetterTopic: "stock.dlq"},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil {
		panic(err)
	}

	if err := cluster.Produce("stock",
		kafka.Message{Key: []byte("sku-1"), Value: []byte("5")},
		kafka.Message{Key: []byte("sku-2"), Value: []byte("3")},
		kafka.Message{Key: []byte("sku-1"), Value: []byte("four")},
		kafka.Message{Key: []byte("sku-1"), Value: []byte("4")},
	); err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for {
		if next, _ := cluster.Committed("warehouse", "stock", 0); next == 4 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		panic(err)
	}

	next, _ := cluster.Committed("warehouse", "stock", 0)
	fmt.Println("committed offset:", next)
	var rows []struct {
		SKU string
		Qty int
	}
	db.Raw(`SELECT sku, qty FROM stock ORDER BY sku`).Scan(&rows)
	fmt.Println(rows)
	for _, m := range cluster.Messages("stock.dlq") {
		for _, h := range m.Headers {
			if h.Key == header.DLQReason {
				fmt.Printf("dead letter %s=%s: %s\n", m.Key, m.Value, h.Value)
			}
		}
	}
	// Output:
	// committed offset: 4
	// [{sku-1 4} {sku-2 3}]
	// dead letter sku-1=four: permanent
}
