package consumer_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
)

// The consumer reads the inbox key, the producer's event id and event time,
// from the message headers. The default extractor takes event_id /
// event_time, then the CloudEvents binary-mode headers ce_id / ce_time. A
// message without them is never processed: the error wraps ErrNoEventID (or
// ErrNoEventTime) and the message goes to Config.Failure.Policy.
func ExampleHeaderExtractor() {
	extract := consumer.HeaderExtractor(nil, nil)

	ours := kafka.Message{Headers: []kafka.Header{
		{Key: header.EventID, Value: []byte("order-42-placed")},
		{Key: header.EventTime, Value: []byte("2026-11-30T09:00:00Z")},
	}}
	cloudEvent := kafka.Message{Headers: []kafka.Header{
		{Key: "ce_specversion", Value: []byte("1.0")},
		{Key: header.CloudEventsID, Value: []byte("9b2c7d1e")},
		{Key: header.CloudEventsTime, Value: []byte("2026-11-30T10:15:00+01:00")},
	}}
	for _, m := range []kafka.Message{ours, cloudEvent} {
		id, at, err := extract(&m)
		fmt.Println(id, at.UTC().Format(time.RFC3339), err)
	}

	_, _, err := extract(&kafka.Message{Value: []byte(`{"order_id":"42"}`)})
	fmt.Println(errors.Is(err, consumer.ErrNoEventID))

	// A producer with headers of its own names them; the first key found
	// wins.
	custom := consumer.HeaderExtractor([]string{"x-message-id"}, []string{"x-occurred-at"})
	id, at, err := custom(&kafka.Message{Headers: []kafka.Header{
		{Key: "x-message-id", Value: []byte("pay-7781")},
		{Key: "x-occurred-at", Value: []byte("2026-11-30T23:59:59.5Z")},
	}})
	fmt.Println(id, at.Format(time.RFC3339Nano), err)
	// Output:
	// order-42-placed 2026-11-30T09:00:00Z <nil>
	// 9b2c7d1e 2026-11-30T09:15:00Z <nil>
	// true
	// pay-7781 2026-11-30T23:59:59.5Z <nil>
}

// Where the producer sets no event id, the message's position can serve as
// one: it covers Kafka's redeliveries (a crash before the offset commit, a
// rebalance), never a producer that sends the same event twice. Choose it
// explicitly: Config{Extract: consumer.ProvenanceExtractor()}.
func ExampleProvenanceExtractor() {
	m := kafka.Message{
		Topic: "orders", Partition: 3, Offset: 1017,
		Time: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC), // the broker's timestamp
	}
	id, at, err := consumer.ProvenanceExtractor()(&m)
	fmt.Println(id, at.Format(time.RFC3339), err)
	// Output: orders/3/1017 2026-11-30T09:00:00Z <nil>
}
