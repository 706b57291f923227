// Package header names the Kafka message headers this library writes and
// reads: the event headers the outbox relay stamps on each message and the
// consumer finds the event id and time in, and the headers a dead letter
// carries. They are the wire contract between a producer, the consumer and
// whoever reads a dead-letter topic.
package header

// The event headers: the outbox relay writes EventID and EventTime (or, in
// the CloudEvents style, CloudEventsID and CloudEventsTime), and the
// consumer's default extractor reads them in that order.
const (
	EventID         = "event_id"
	EventTime       = "event_time" // RFC 3339, UTC
	CloudEventsID   = "ce_id"      // CloudEvents Kafka binary mode
	CloudEventsTime = "ce_time"    // CloudEvents Kafka binary mode
)

// The headers the consumer adds to a dead letter, after the original
// message's headers.
const (
	DLQError     = "dlq_error"      // the error text
	DLQReason    = "dlq_reason"     // a consumer.Reason
	DLQTopic     = "dlq_topic"      // original topic
	DLQPartition = "dlq_partition"  // original partition, decimal
	DLQOffset    = "dlq_offset"     // original offset, decimal
	DLQGroup     = "dlq_group"      // consumer group
	DLQConsumer  = "dlq_consumer"   // inbox consumer name
	DLQAttempts  = "dlq_attempts"   // tries made, decimal
	DLQTime      = "dlq_time"       // when it was dead-lettered, RFC 3339 UTC
	DLQEventID   = "dlq_event_id"   // the event id, when one was found
	DLQEventTime = "dlq_event_time" // the event time, when one was found
	// DLQPanicStack holds the stack of a handler panic
	// (*inbox.PanicError), when that was the failure.
	DLQPanicStack = "dlq_panic_stack"
)
