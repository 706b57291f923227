// Package header names the Kafka message headers this library writes and
// reads: the event headers the outbox relay stamps on each message and the
// consumer finds the event id and time in, the sequence headers the relay
// stamps on each message with a key, and the headers a dead letter carries.
// They are the wire contract between a producer, the consumer and whoever
// reads a dead-letter topic.
//
// # Sequence headers
//
// An outbox numbers the messages of each of its shards without gaps, in
// commit order, and its relay stamps that place on every message with a key
// (see package outbox, "Sequence headers"):
//
//   - the source ([SeqSource]): the outbox table's id, made once when the
//     table is made (a UUID with this library's adapters; in general 1 to
//     64 bytes of ASCII letters, digits, '-', '_', '.' and ':'), so that
//     the numbers of two outbox tables are never confused;
//   - the epoch ([SeqEpoch]): a decimal integer from 1, raised by an
//     operator after the outbox's database was restored or failed over
//     with loss, when numbers already published are handed out again for
//     other events;
//   - the shard ([SeqShard]): the decimal shard number, from 0;
//   - the sequence number ([Seq]): the decimal place of the message in its
//     shard, from 1;
//   - the partitions ([SeqPartitions]), only on the messages of an aligned
//     outbox (see package outbox, "Aligned shards"): the decimal number of
//     partitions of the message's topic, which is the outbox's number of
//     shards.
//
// Within one source and epoch a (shard, sequence number) pair names one
// event, and a message carries the same values every time it is
// published in that epoch. A shard holds keys of many topics and partitions, so the
// numbers one partition sees of a shard go up (the first copy of each
// message arrives after the first copies of the shard's earlier messages
// to that partition) but are not contiguous. The numbers are written in
// decimal without sign or leading zeros, except in CloudEventsSequence.
// Messages without a key carry no sequence headers, except an aligned
// outbox's.
//
// A message with SeqPartitions comes from an aligned outbox: all its
// messages go to one topic, a message's shard is the partition Kafka's
// default partitioner gives its key (murmur2, as the Java client does; a
// message without a key by its event id), and the relay publishes it to
// that partition. So the message's partition equals its shard, its topic
// has SeqPartitions partitions, and each (source, epoch, topic, partition)
// stream holds the numbers of one shard only, all of them: in offset order
// the first copies of its messages are 1, 2, 3, ... without holes (copies
// of earlier ones may follow them). A hole then means a lost or reordered
// message, as long as the topic is not compacted and retention has not
// removed the start of the stream. A message whose partition differs from
// its shard, or whose SeqPartitions differs from its topic's partition
// count, is not in such a stream: its holes mean nothing.
//
// In the CloudEvents header style (CloudEvents' Kafka binary mode) the
// sequence number goes in CloudEvents' sequence extension attribute
// ([CloudEventsSequence]), a string whose lexicographic order must be the
// order of the events: it is the decimal number zero-padded to
// [CloudEventsSequenceDigits] digits, so that string order is numeric
// order. The source, epoch and shard go in extension attributes of the
// library's own ([CloudEventsSeqSource], [CloudEventsSeqEpoch],
// [CloudEventsSeqShard], [CloudEventsSeqPartitions]), with the values
// described above.
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

// The sequence headers the outbox relay writes on each message with a key
// (see the package doc): SeqSource, SeqEpoch, SeqShard and Seq, or in the
// CloudEvents style the four CloudEvents* ones; on every message of an
// aligned outbox, with SeqPartitions (CloudEventsSeqPartitions) as well.
const (
	SeqSource     = "inbox_source"     // the outbox table's id
	SeqEpoch      = "inbox_epoch"      // decimal, from 1
	SeqShard      = "inbox_shard"      // decimal, from 0
	Seq           = "inbox_seq"        // decimal, from 1
	SeqPartitions = "inbox_partitions" // decimal, from 1: aligned outboxes only

	CloudEventsSeqSource     = "ce_inboxsource"     // extension inboxsource
	CloudEventsSeqEpoch      = "ce_inboxepoch"      // extension inboxepoch
	CloudEventsSeqShard      = "ce_inboxshard"      // extension inboxshard
	CloudEventsSequence      = "ce_sequence"        // extension sequence: CloudEventsSequenceDigits digits, zero-padded
	CloudEventsSeqPartitions = "ce_inboxpartitions" // extension inboxpartitions: aligned outboxes only
)

// CloudEventsSequenceDigits is the length of a CloudEventsSequence value:
// every sequence number (a positive int64) fits in it.
const CloudEventsSequenceDigits = 19

// The headers the consumer adds to a dead letter, after the original
// message's headers. Those it keeps as they are, except the sequence
// headers (SeqSource, SeqEpoch, SeqShard, Seq, SeqPartitions and their
// CloudEvents* counterparts), which it renames with [DLQSequencePrefix]:
// a dead letter carries no live sequence headers, so a copy of it put
// back on the source topic as it is (a redrive) is deduplicated by its
// inbox row, never by a watermark that already passed the original.
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

// DLQSequencePrefix is put before the name of each sequence header a dead
// letter carries: inbox_seq becomes dlq_inbox_seq, ce_sequence
// dlq_ce_sequence. The values are kept, for inspection.
const DLQSequencePrefix = "dlq_"

// DLQRedrivenFrom is the header a redrive adds (inboxctl deadletters
// redrive) to the copy of a dead letter it puts back on the original
// topic, for audit: the dead letter's own place, "topic/partition/offset"
// (partition and offset decimal). The copy keeps the dead letter's key,
// value and headers as they are, dlq_* included: its sequence headers
// stay renamed ([DLQSequencePrefix]), so the consumer deduplicates it by
// its inbox row. A copy dead-lettered again carries the dlq_* headers of
// both failures, the later ones last.
const DLQRedrivenFrom = "dlq_redriven_from"
