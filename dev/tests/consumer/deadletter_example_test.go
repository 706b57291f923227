package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
)

// A message the handler can never apply (here a truncated payload) must not
// hold its partition up forever, nor be skipped silently. Under the
// DeadLetter policy, once its attempts are used up it is published to the
// dead-letter topic with its key, value and headers and headers saying why;
// only then does the partition's offset pass it, and the messages after it
// are processed.
func Example_deadLetter() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "payments", "payments.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "billing.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	db.Exec(`CREATE TABLE charges (order_id TEXT PRIMARY KEY, cents INTEGER NOT NULL)`)

	// order-2's payload was cut off: no attempt will ever decode it.
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "payments", BatchTimeout: time.Millisecond}
	at := time.Now().UTC().Format(time.RFC3339)
	for _, p := range []struct{ id, value string }{
		{"order-1", `{"order_id":"order-1","cents":1250}`},
		{"order-2", `{"order_id":"order-2","ce`},
		{"order-3", `{"order_id":"order-3","cents":990}`},
	} {
		if err := w.WriteMessages(context.Background(), kafka.Message{Key: []byte(p.id), Value: []byte(p.value), Headers: []kafka.Header{
			{Key: header.EventID, Value: []byte("charge/" + p.id)},
			{Key: header.EventTime, Value: []byte(at)},
		}}); err != nil {
			log.Fatal(err)
		}
	}
	w.Close()

	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err := ib.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	var deadLettered atomic.Int32
	c, err := consumer.New(consumer.Config{
		Brokers:  brokers,
		GroupID:  "billing",
		Topics:   []string{"payments"},
		Inbox:    ib,
		Consumer: "charge",
		Handler: func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
			var charge struct {
				OrderID string `json:"order_id"`
				Cents   int    `json:"cents"`
			}
			if err := json.Unmarshal(msg.Value, &charge); err != nil {
				return fmt.Errorf("decode: %w", err)
			}
			return tx.Exec(`INSERT INTO charges VALUES (?, ?)`, charge.OrderID, charge.Cents).Error
		},
		Failure: consumer.FailureConfig{
			Policy:          consumer.DeadLetter,
			DeadLetterTopic: "payments.dlq",
			MaxAttempts:     3,
			MinBackoff:      10 * time.Millisecond,
		},
		Hooks: []hooks.Hook{hooks.EventFunc(func(ev hooks.Event) {
			if ev.Kind == hooks.DeadLettered {
				deadLettered.Add(1)
			}
		})},
		Logger: slog.New(slog.DiscardHandler), // the dead letter is logged at Error
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = c.Run(context.Background()) }()
	for ib.Counters().Processed < 2 || deadLettered.Load() < 1 {
		time.Sleep(20 * time.Millisecond)
	}
	c.Close()

	var charged int
	db.Raw(`SELECT COUNT(*) FROM charges`).Scan(&charged)
	fmt.Println("charged:", charged)

	// What an operator finds in the dead-letter topic.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: "payments.dlq", MaxWait: 100 * time.Millisecond})
	defer r.Close()
	dl, err := r.ReadMessage(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("key=%s value=%s\n", dl.Key, dl.Value)
	for _, h := range dl.Headers {
		switch h.Key {
		case header.DLQReason, header.DLQError, header.DLQAttempts,
			header.DLQTopic, header.DLQPartition, header.DLQOffset, header.DLQEventID:
			fmt.Printf("%s: %s\n", h.Key, h.Value)
		}
	}
	// Output:
	// charged: 2
	// key=order-2 value={"order_id":"order-2","ce
	// dlq_error: inbox: consumer "charge" event "charge/order-2": decode: unexpected end of JSON input
	// dlq_reason: handler-error
	// dlq_topic: payments
	// dlq_partition: 0
	// dlq_offset: 1
	// dlq_attempts: 3
	// dlq_event_id: charge/order-2
}
