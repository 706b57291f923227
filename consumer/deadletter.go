package consumer

import (
	"errors"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/inbox"
)

// Headers added to a dead letter, after the original message's headers.
const (
	HeaderDLQError     = "dlq_error"      // the error text
	HeaderDLQReason    = "dlq_reason"     // a DLQReason
	HeaderDLQTopic     = "dlq_topic"      // original topic
	HeaderDLQPartition = "dlq_partition"  // original partition, decimal
	HeaderDLQOffset    = "dlq_offset"     // original offset, decimal
	HeaderDLQGroup     = "dlq_group"      // consumer group
	HeaderDLQConsumer  = "dlq_consumer"   // inbox consumer name
	HeaderDLQAttempts  = "dlq_attempts"   // tries made, decimal
	HeaderDLQTime      = "dlq_time"       // when it was dead-lettered, RFC 3339 UTC
	HeaderDLQEventID   = "dlq_event_id"   // the event id, when one was found
	HeaderDLQEventTime = "dlq_event_time" // the event time, when one was found
	// HeaderDLQPanicStack holds the stack of a handler panic
	// (*inbox.PanicError), when that was the failure.
	HeaderDLQPanicStack = "dlq_panic_stack"
)

const (
	// readerMaxBytes is the most a partition reader fetches at once, and so
	// about the largest message the consumer can be handed.
	readerMaxBytes = 10 << 20
	// deadLetterMaxBytes is the largest dead letter the default writer
	// accepts: a message the reader took plus room for the dlq_* headers.
	// (kafka-go's default, 1 MiB, refused larger messages client-side.)
	deadLetterMaxBytes = readerMaxBytes + 1<<20
)

// DLQ reasons, the values of the dlq_reason header.
const (
	ReasonHandlerError = "handler-error" // retries used up
	ReasonNoEventID    = "no-event-id"   // the Extractor found no id or time
	ReasonInvalid      = "invalid"       // inbox.ErrInvalidMessage
	ReasonExpired      = "expired"       // inbox.ErrExpired
)

// ReasonDeadLetterFailed is the Reason of a partition stopped under the
// DeadLetter policy because the producer refused the message's dead letter
// for good (see Config.OnFailure). It never appears in a dlq_reason header.
const ReasonDeadLetterFailed = "dead-letter-failed"

// ReasonOffsetBeyondLogEnd is the Reason of a partition stopped on
// assignment because the offset it would start at (the stored one with
// Config.StoreOffsets, or the group's committed one) is past the
// partition's log end; see ErrOffsetBeyondLogEnd. It never appears in a
// dlq_reason header.
const ReasonOffsetBeyondLogEnd = "offset-beyond-log-end"

// deadLetterUnknownTopicAttempts is how many publish attempts in a row must
// find the dead-letter topic unknown before that counts as permanent: a topic
// just created is unknown to some brokers for a moment.
const deadLetterUnknownTopicAttempts = 10

// deadLetter builds the dead letter of m: its key, value and headers, plus
// headers saying what failed. The original timestamp is kept.
func deadLetter(topic string, m *Message, reason string, attempts int, cause error, group, consumer string, now time.Time) kafka.Message {
	hs := make([]kafka.Header, 0, len(m.Headers)+11)
	hs = append(hs, m.Headers...)
	add := func(k, v string) { hs = append(hs, kafka.Header{Key: k, Value: []byte(v)}) }
	errText := "unknown error"
	if cause != nil {
		errText = cause.Error()
	}
	add(HeaderDLQError, errText)
	add(HeaderDLQReason, reason)
	add(HeaderDLQTopic, m.Topic)
	add(HeaderDLQPartition, strconv.Itoa(m.Partition))
	add(HeaderDLQOffset, strconv.FormatInt(m.Offset, 10))
	add(HeaderDLQGroup, group)
	if consumer != "" {
		add(HeaderDLQConsumer, consumer)
	}
	add(HeaderDLQAttempts, strconv.Itoa(attempts))
	add(HeaderDLQTime, now.UTC().Format(time.RFC3339Nano))
	if stack := panicStack(cause); stack != "" {
		add(HeaderDLQPanicStack, stack)
	}
	if m.EventID != "" {
		add(HeaderDLQEventID, m.EventID)
		add(HeaderDLQEventTime, m.EventTime.UTC().Format(time.RFC3339Nano))
	}
	return kafka.Message{
		Topic:   topic,
		Key:     m.Key,
		Value:   m.Value,
		Headers: hs,
		Time:    m.Time,
	}
}

// panicStack returns the stack of a handler panic in err, or "".
func panicStack(err error) string {
	var pe *inbox.PanicError
	if errors.As(err, &pe) {
		return string(pe.Stack)
	}
	return ""
}

// failureAttrs are the log attributes of a message's failure: the error,
// and the panic's stack when the handler panicked.
func failureAttrs(err error) []any {
	attrs := []any{"error", err}
	if stack := panicStack(err); stack != "" {
		attrs = append(attrs, "panic_stack", stack)
	}
	return attrs
}
