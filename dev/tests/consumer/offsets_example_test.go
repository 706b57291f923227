package consumer_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
)

// With Offsets.Store the next offset of each partition is written into the
// database (the table inbox_offsets, made by Consumer.Migrate) in the same
// transaction as the effect and its inbox row, and an assigned partition
// starts there. A crash between the database commit and the Kafka commit
// then redelivers nothing, and after a failover to a replica that lost the
// last commits the consumer resumes from the database's position and
// applies those messages again, exactly once.
func Example_storeOffsets() {
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
	send(brokers, "order-1", "order-2", "order-3", "order-4")

	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{})
	if err := ib.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Brokers:  brokers,
		GroupID:  "inventory",
		Topics:   []string{"orders"},
		Inbox:    ib,
		Consumer: "reserve-stock",
		Offsets:  consumer.OffsetsConfig{Store: true},
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			return tx.Exec(`UPDATE stock SET reserved = reserved + 1 WHERE sku = 'sku-7'`).Error
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil { // the offsets table
		log.Fatal(err)
	}
	go func() { _ = c.Run(context.Background()) }()
	for ib.Counters().Processed < 4 {
		time.Sleep(20 * time.Millisecond)
	}
	c.Close()

	var rows []struct {
		GroupID    string
		Topic      string
		Partition  int
		NextOffset int64
	}
	db.Raw(`SELECT group_id, topic, partition, next_offset FROM inbox_offsets ORDER BY partition`).Scan(&rows)
	for _, r := range rows {
		fmt.Printf("%s %s/%d: next offset %d\n", r.GroupID, r.Topic, r.Partition, r.NextOffset)
	}
	// Output:
	// inventory orders/0: next offset 2
	// inventory orders/1: next offset 2
}
