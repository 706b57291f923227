package consumer

import (
	"errors"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
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
// for good (see Config.Failure.Policy). It never appears in a dlq_reason header.
const ReasonDeadLetterFailed = "dead-letter-failed"

// ReasonOffsetBeyondLogEnd is the Reason of a partition stopped on
// assignment because the offset it would start at (the stored one with
// Config.Offsets.Store, or the group's committed one) is past the
// partition's log end; see ErrOffsetBeyondLogEnd. It never appears in a
// dlq_reason header.
const ReasonOffsetBeyondLogEnd = "offset-beyond-log-end"

// ReasonTopicRecreated is the Reason of a partition stopped on assignment
// because, with Config.Offsets.Store, the message before the stored offset
// is not the one the group processed there: the topic was deleted and
// recreated and has already grown past the stored offset (see
// Config.Offsets.Store). Tell it by this Reason of the
// *PartitionStoppedError (errors.As). It never appears in a dlq_reason
// header.
const ReasonTopicRecreated = "topic-recreated"

// deadLetter builds the dead letter of m: its key, value and headers, plus
// headers saying what failed. The original timestamp is kept. Its
// sequence headers are renamed (header.DLQSequencePrefix): the watermark
// moved past the original, so a copy put back on the topic as it is must
// take its inbox row, where it is applied once, rather than be taken for a
// duplicate of itself.
func deadLetter(topic string, m *Message, reason string, attempts int, cause error, group, consumer string, now time.Time) kafka.Message {
	hs := make([]kafka.Header, 0, len(m.Headers)+11)
	for _, h := range m.Headers {
		if sequenceHeaders[h.Key] {
			h.Key = header.DLQSequencePrefix + h.Key
		}
		hs = append(hs, h)
	}
	add := func(k, v string) { hs = append(hs, kafka.Header{Key: k, Value: []byte(v)}) }
	errText := "unknown error"
	if cause != nil {
		errText = cause.Error()
	}
	add(header.DLQError, errText)
	add(header.DLQReason, reason)
	add(header.DLQTopic, m.Topic)
	add(header.DLQPartition, strconv.Itoa(m.Partition))
	add(header.DLQOffset, strconv.FormatInt(m.Offset, 10))
	add(header.DLQGroup, group)
	if consumer != "" {
		add(header.DLQConsumer, consumer)
	}
	add(header.DLQAttempts, strconv.Itoa(attempts))
	add(header.DLQTime, now.UTC().Format(time.RFC3339Nano))
	if stack := panicStack(cause); stack != "" {
		add(header.DLQPanicStack, stack)
	}
	if m.EventID != "" {
		add(header.DLQEventID, m.EventID)
		add(header.DLQEventTime, m.EventTime.UTC().Format(time.RFC3339Nano))
	}
	return kafka.Message{
		Topic:   topic,
		Key:     m.Key,
		Value:   m.Value,
		Headers: hs,
		Time:    m.Time,
	}
}

// sequenceHeaders are the headers a dead letter carries renamed.
var sequenceHeaders = map[string]bool{
	header.SeqSource: true, header.SeqEpoch: true, header.SeqShard: true, header.Seq: true, header.SeqPartitions: true,
	header.CloudEventsSeqSource: true, header.CloudEventsSeqEpoch: true, header.CloudEventsSeqShard: true,
	header.CloudEventsSequence: true, header.CloudEventsSeqPartitions: true,
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

// ReasonSequenceGap is the Reason of a partition stopped at a message of
// an aligned sequenced stream whose number is past the next one expected:
// a message was lost or reordered upstream (see "Sequenced dedup" in the
// package doc). The error names the source, epoch, shard and the missing
// numbers. It never appears in a dlq_reason header: the message at the gap
// did nothing wrong.
const ReasonSequenceGap = "sequence-gap"
