package consumer

// The Kafka client behind a Consumer. The worker (per-partition order, the
// offset tracker, the failure policy, stored offsets, dead letters) and the
// generation loop use only these interfaces; transport_kafkago.go implements
// them with github.com/segmentio/kafka-go. Messages are kafka.Message (the
// type Message embeds) whatever the client.

import (
	"context"
	"log/slog"

	"github.com/segmentio/kafka-go"
)

// The start offsets of a partition the group has no committed offset for:
// the values of Config.StartOffset. A transport hands them out as the
// assignment's offset; checkLog resolves them against the log.
const (
	offsetFirst = kafka.FirstOffset // the log start
	offsetLast  = kafka.LastOffset  // the log end
)

// transport is the Kafka client of one Consumer, built by New from its
// Config and used by one Run.
type transport interface {
	// group returns the consumer group of Config.GroupID over
	// Config.Topics, with the Config's session, heartbeat and rebalance
	// timeouts and its StartOffset. It does not wait for the brokers; an
	// error means the client refused the configuration, which Run returns
	// as invalid (its text names the client).
	group() (consumerGroup, error)
	// reader returns a reader of one partition, not yet positioned (see
	// partitionReader). log takes the client's own messages (Debug, and
	// Warn for its errors).
	reader(topic string, partition int, log *slog.Logger) partitionReader
	// logOffsets returns the partition's log start offset (the first
	// offset retention kept) and its log end offset (the offset the next
	// message produced will get), asking the partition's current leader.
	// It is called from every worker, concurrently.
	logOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error)
	// missingTopics returns those of topics the cluster does not know (or
	// does not let this client describe), as its metadata says now; it
	// never creates a topic, whatever the brokers' auto.create.topics.enable.
	// An error means the cluster did not answer.
	missingTopics(ctx context.Context, topics []string) ([]string, error)
	// deadLetterWriter returns the producer of dead letters used when
	// Config.DeadLetterWriter is nil: it must accept a message of up to
	// deadLetterMaxBytes that names its topic, keep the key's partitioning
	// (a hash of the key), wait for all in-sync replicas and report the
	// errors internal/kafkaerr classifies. New calls it at most once.
	deadLetterWriter() MessageWriter
	// close releases what the transport holds once Run is done with it:
	// it flushes and closes the writer deadLetterWriter returned, then
	// closes the connections and goroutines of the consumer's own requests.
	// Failures are logged, not returned.
	close()
}

// consumerGroup is a membership of the consumer group. One goroutine (Run's
// generation loop) calls it.
type consumerGroup interface {
	// next joins the group (or rejoins it after the previous generation
	// ended) and returns the next generation. It returns only after every
	// function started in the previous generation returned. An error is
	// retried by the caller with backoff, unless rejected says otherwise;
	// "Rebalance In Progress" and failed joins are such errors, not a
	// reason to stop.
	next(ctx context.Context) (generation, error)
	// rejected reports whether an error of next is the group coordinator
	// refusing this consumer's configuration or credentials (an invalid
	// session timeout or group id, failed authentication or
	// authorization): retrying cannot cure it.
	rejected(err error) bool
	// close ends the current generation, waits for the functions it
	// started to return (they commit what they finished) and leaves the
	// group.
	close() error
}

// generation is one generation of the group: the partitions this member
// was assigned, until the next rebalance.
type generation interface {
	// id and memberID identify the generation and this member in it (for
	// the logs).
	id() int32
	memberID() string
	// assignments returns the partitions of topic assigned to this member,
	// each with the group's committed offset: the next offset to read, or
	// offsetFirst / offsetLast (Config.StartOffset) when the group has none.
	assignments(topic string) []assignment
	// start runs fn in a goroutine of its own, bound to the generation.
	// fn's context ends when the generation does (a rebalance, the group's
	// close, or any function started in it returning), and context.Cause
	// of it says so; fn must then return promptly: the next generation is
	// not handed out before every fn of this one returned. The generation
	// ends as soon as one fn returns.
	start(fn func(ctx context.Context))
	// commit commits next, the NEXT offset to read (the last finished
	// offset + 1), as the group's offset of the partition. It is called
	// only for partitions of this generation's assignments, and only while
	// fn runs; the caller serialises the calls of one generation. The group
	// coordinator accepts it only from a member of its current generation,
	// which makes it the consumer's way to ask whether this generation is
	// still current (see over).
	commit(topic string, partition int, next int64) error
	// over reports whether an error of commit says that this generation is
	// over for this member: the coordinator no longer knows the member (its
	// session expired) or has moved on to a newer generation, which a
	// member paused past its session timeout finds out this way before its
	// heartbeats tell it. Any other error (the coordinator unreachable,
	// moving, or in the middle of a rebalance) says nothing either way.
	over(err error) bool
}

// assignment is one partition of a generation.
type assignment struct {
	partition int
	offset    int64 // the group's committed offset, or offsetFirst / offsetLast
}

// partitionReader fetches the messages of one partition, in offset order,
// at most Config.MaxWait per request to the broker. One worker uses it.
type partitionReader interface {
	// seek makes the next fetch start at offset (a concrete offset, never
	// a sentinel). It fails only on a closed reader.
	seek(offset int64) error
	// fetch returns the next message: the one at the offset sought, or
	// the next one after the last returned (a compaction gap is skipped),
	// waiting until one is produced or ctx ends (it then returns ctx's
	// error). Other errors are the client's and are retried by the caller.
	// An offset past the log end is not an error: fetch waits there, as
	// for a message not produced yet (the worker's log-end checks catch
	// that case; see checkLog and pastLogEnd); an offset below the log
	// start (retention) moves on to the log start. The message fetched
	// carries its key, value, headers and timestamp as the producer (or,
	// with LogAppendTime, the broker) set them, the same on every fetch:
	// the worker's check of a recreated topic compares them (see
	// checkLast).
	fetch(ctx context.Context) (kafka.Message, error)
	// close releases the reader; the worker calls it before its final
	// commit.
	close() error
}

// caughtUpReader is the optional partitionReader capability by which a
// batch stops waiting for more messages when the partition has nothing
// more to give.
type caughtUpReader interface {
	// caughtUp reports whether the last message fetch returned was the
	// partition's last when the broker sent it: no message after it was
	// fetched or is waiting on the broker to be fetched, as of then.
	caughtUp() bool
}
