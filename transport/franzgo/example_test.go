package franzgo_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// An outbox's relay publishing through franz-go's idempotent producer
// instead of kafka-go's writer. ob is the application's outbox
// (outbox.New over its database and an adapter's outbox store).
func ExampleNewPublisher() {
	var ob *outbox.Outbox

	pub, err := franzgo.NewPublisher(franzgo.Options{Brokers: []string{"localhost:9092"}})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close() // after the relay stopped
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := relay.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
