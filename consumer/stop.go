package consumer

import (
	"fmt"
)

// deadLetterRefused stops the partition at a message whose dead letter the
// producer refused for good (publishErr, after attempts tries): dropping the
// message would lose it, retrying would hang the partition without a word.
func (b *batchRunner) deadLetterRefused(it *item, reason string, cause error, attempts int, publishErr error) resolution {
	b.stopPartition(&PartitionStoppedError{
		Topic: b.topic, Partition: b.partition, Offset: it.msg.Offset, EventID: it.msg.EventID,
		Reason: ReasonDeadLetterFailed, Attempts: it.attempts,
		Err: fmt.Errorf("the dead letter to %s was refused for good: %w; the message had failed (%s): %w",
			b.deadLetterTopic, publishErr, reason, cause),
	}, "PARTITION STOPPED: the producer refused a dead letter for good (too large, topic missing or invalid, not authorized, misconfigured); nothing at or after the message is committed until the cause is fixed and the partition reassigned",
		"event_id", it.msg.EventID, "dead_letter_topic", b.deadLetterTopic, "publish_attempts", attempts)
	return stopped
}
