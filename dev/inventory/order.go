package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/segmentio/kafka-go"
)

// Order is the OrderCreated event's payload.
type Order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int64  `json:"qty"`
}

// SKUs are the stock-keeping units the generated orders use.
var SKUs = func() []string {
	s := make([]string, 20)
	for i := range s {
		s[i] = fmt.Sprintf("sku-%02d", i+1)
	}
	return s
}()

// Batch is a generated stream of orders: every order once, some twice.
type Batch struct {
	Orders     []Order         // each order once, in production order
	Messages   []kafka.Message // what is written to Kafka, producer duplicates included
	Duplicates int             // messages that repeat an earlier one
}

// Generate makes n orders with ids unique to runID; each order is sent a
// second time, a little later and with the same id, time and key, with
// probability dupRate, the way a relay resends after a crash. The event time
// is set here, by the producer.
func Generate(runID string, n int, dupRate float64, seed uint64) Batch {
	rng := rand.New(rand.NewPCG(seed, 7))
	base := time.Now().UTC().Add(-time.Hour)
	var b Batch
	var resend []kafka.Message
	for i := range n {
		o := Order{OrderID: fmt.Sprintf("order-%s-%07d", runID, i), SKU: SKUs[rng.IntN(len(SKUs))], Qty: 1 + rng.Int64N(5)}
		b.Orders = append(b.Orders, o)
		m := Message(o, base.Add(time.Duration(i)*time.Millisecond))
		b.Messages = append(b.Messages, m)
		if rng.Float64() < dupRate {
			resend = append(resend, m)
		}
		if len(resend) > 0 && rng.IntN(4) == 0 {
			b.Messages = append(b.Messages, resend[0])
			resend = resend[1:]
			b.Duplicates++
		}
	}
	b.Messages = append(b.Messages, resend...)
	b.Duplicates += len(resend)
	return b
}

// Message is the Kafka message of an OrderCreated event: the order id is the
// key (one partition per order) and the event id; the event time travels in
// the event_time header.
func Message(o Order, at time.Time) kafka.Message {
	value, _ := json.Marshal(o)
	return kafka.Message{Key: []byte(o.OrderID), Value: value, Headers: []kafka.Header{
		{Key: "event_id", Value: []byte(o.OrderID)},
		{Key: "event_time", Value: []byte(at.UTC().Format(time.RFC3339Nano))},
		{Key: "type", Value: []byte("OrderCreated")},
	}}
}

// Writer returns a producer for topic that waits for every in-sync replica.
func Writer(brokers []string, topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    200,
		BatchTimeout: 5 * time.Millisecond,
	}
}

// Write writes msgs in chunks, retrying each chunk while the broker is
// unavailable, until ctx ends. A chunk that failed may have been written in
// part: retrying it produces more duplicates, which the inbox absorbs.
func Write(ctx context.Context, w *kafka.Writer, msgs []kafka.Message) error {
	for lo := 0; lo < len(msgs); lo += 500 {
		hi := min(lo+500, len(msgs))
		for {
			err := w.WriteMessages(ctx, msgs[lo:hi]...)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("write orders: %w", err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return nil
}
