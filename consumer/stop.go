package consumer

import (
	"fmt"

	"github.com/inboxgo/inbox/hooks"
)

// stopPartition records e as the partition's stop, logs msg at Error with
// attrs (slog key-value pairs) and reports EventPartitionStopped. The caller
// then holds the partition: nothing at or after e.Offset may be committed or
// stored until the stop clears (see Consumer.clearStopped).
func (w *worker) stopPartition(e *PartitionStoppedError, msg string, attrs ...any) {
	w.c.setStopped(e)
	attrs = append(attrs, "offset", e.Offset, "reason", e.Reason, "error", e.Err)
	w.log.Error(msg, attrs...)
	w.c.emit(hooks.Event{Kind: hooks.PartitionStopped, Topic: w.topic, Partition: w.partition, Offset: e.Offset, Err: e})
}

// deadLetterRefused stops the partition at a message whose dead letter the
// producer refused for good (publishErr, after attempts tries): dropping the
// message would lose it, retrying would hang the partition without a word.
func (w *worker) deadLetterRefused(it *item, reason string, cause error, attempts int, publishErr error) resolution {
	w.stopPartition(&PartitionStoppedError{
		Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset, EventID: it.msg.EventID,
		Reason: ReasonDeadLetterFailed, Attempts: it.attempts,
		Err: fmt.Errorf("the dead letter to %s was refused for good: %w; the message had failed (%s): %w",
			w.c.cfg.Failure.DeadLetterTopic, publishErr, reason, cause),
	}, "PARTITION STOPPED: the producer refused a dead letter for good (too large, topic missing or invalid, not authorized, misconfigured); nothing at or after the message is committed until the cause is fixed and the partition reassigned",
		"event_id", it.msg.EventID, "dead_letter_topic", w.c.cfg.Failure.DeadLetterTopic, "publish_attempts", attempts)
	return stopped
}
