// Package transport is the contract between package consumer and a Kafka
// client, as package storage is between the inbox and a database. The
// consumer (per-partition order, the offset tracker, the failure policy,
// stored offsets, dead letters) and its group loop use only these
// interfaces; a Client is what consumer.Config.Kafka.Transport takes.
//
// Two clients implement it: github.com/segmentio/kafka-go (package
// consumer's default, eager rebalancing) and github.com/twmb/franz-go (the
// module github.com/inboxgo/inbox/transport/franzgo, cooperative-sticky
// rebalancing), and both run the same real-broker suites.
//
// Messages are kafka.Message of github.com/segmentio/kafka-go whatever the
// client: consumer.Message embeds it, so every handler written against the
// consumer reads its fields, and a second message type would break them or
// cost a copy per message. A client other than kafka-go fills the struct;
// it uses nothing else of kafka-go.
//
// # Rebalancing
//
// A Group hands out generations. An eager client (kafka-go) revokes every
// partition at every rebalance: each generation's Assigned lists all of the
// member's partitions, and every function started in the previous
// generation has returned before Next hands out the next one. A
// cooperative client (franz-go's cooperative-sticky) revokes only the
// partitions that move: Assigned lists only the partitions new to this
// member, the functions of kept partitions go on running under the
// generation that started them, and only those of revoked partitions have
// their context ended, and have returned, before the revocation is
// acknowledged to the group. Either way a partition is never run by two
// functions of one member at once, and a revoked partition's function has
// committed (Generation.Commit) what it finished before another member can
// fetch the partition.
package transport

import (
	"context"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// The start offsets of a partition the group has no committed offset for:
// the values of GroupConfig.StartOffset, and the offset an Assignment
// carries then. The consumer resolves them against the log.
const (
	FirstOffset = kafka.FirstOffset // the log start
	LastOffset  = kafka.LastOffset  // the log end
)

// Client is the Kafka client of one consumer.Consumer, used by one Run at
// a time. Its methods other than Group may be called from several
// goroutines at once.
type Client interface {
	// Group returns a membership of the consumer group cfg names, not yet
	// joined (Group.Next joins). An error means the client refused the
	// configuration; the consumer returns it as invalid, so its text must
	// name the client.
	Group(cfg GroupConfig) (Group, error)
	// LogOffsets returns the partition's log start offset (the first
	// offset retention kept) and its log end offset (the offset the next
	// message produced will get), asking the partition's current leader.
	LogOffsets(ctx context.Context, topic string, partition int) (start, end int64, err error)
	// MissingTopics returns those of topics the cluster does not know (or
	// does not let this client describe), as its metadata says now; it
	// never creates a topic, whatever the brokers'
	// auto.create.topics.enable. An error means the cluster did not answer.
	MissingTopics(ctx context.Context, topics []string) ([]string, error)
	// DeadLetterWriter returns the producer of dead letters the consumer
	// uses when consumer.Config.Failure.DeadLetterWriter is nil. It must accept a
	// message of up to MaxDeadLetterBytes that names its topic, keep the
	// key's partitioning (a hash of the key), wait for all in-sync
	// replicas, and report the errors retrying cannot cure as kafka.Error
	// values (or io.ErrClosedPipe), as consumer.MessageWriter says. It is
	// called at most once per Client.
	DeadLetterWriter() Writer
	// Close releases what the client holds once Run is done with it: it
	// flushes and closes the writer DeadLetterWriter returned, then the
	// connections of the consumer's own requests. Failures are logged, not
	// returned.
	Close()
}

// Writer publishes messages: consumer.MessageWriter, which *kafka.Writer
// implements.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// MaxDeadLetterBytes is the largest dead letter a Client's DeadLetterWriter
// must accept: a fetched message of up to MaxFetchBytes and the headers
// the consumer adds.
const (
	MaxFetchBytes      = 10 << 20
	MaxDeadLetterBytes = MaxFetchBytes + 1<<20
)

// GroupConfig is what the consumer asks of its group membership, from
// consumer.Config.
type GroupConfig struct {
	GroupID string
	Topics  []string
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are the
	// group protocol's; JoinBackoff is the wait before a failed join is
	// tried again.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	RebalanceTimeout  time.Duration
	JoinBackoff       time.Duration
	// StartOffset is FirstOffset or LastOffset: where a partition the
	// group has no committed offset for starts.
	StartOffset int64
	// MaxWait bounds each fetch request's wait on the broker for new
	// messages.
	MaxWait time.Duration
	// Logger takes the client's own messages: Debug, and Warn for its
	// errors.
	Logger *slog.Logger
}

// Group is a membership of the consumer group. One goroutine (Run's group
// loop) calls it.
type Group interface {
	// Next joins the group (or rejoins it after the previous generation
	// ended) and returns the next generation: for an eager client only
	// after every function started in the previous generation returned.
	// An error is retried by the caller with backoff, unless Rejected says
	// otherwise; "Rebalance In Progress" and failed joins are such errors,
	// not a reason to stop.
	Next(ctx context.Context) (Generation, error)
	// Rejected reports whether an error of Next is the group coordinator
	// refusing this consumer's configuration or credentials (an invalid
	// session timeout or group id, failed authentication or
	// authorization): retrying cannot cure it.
	Rejected(err error) bool
	// Close ends the membership: the contexts of every function still
	// running end, Close waits for them to return (they commit what they
	// finished) and then leaves the group.
	Close() error
}

// Generation is one generation of the group as this member sees it.
type Generation interface {
	// ID and MemberID identify the generation and this member in it. The
	// consumer writes ID into a stored offset's row, where a newer
	// owner's larger ID fences an older one out: a client must hand a
	// partition's new owner a larger ID than its previous owner had.
	ID() int32
	MemberID() string
	// Assigned returns the partitions of topic this generation gives this
	// member to start (see the package doc: all of them for an eager
	// client, the new ones for a cooperative one), each with the group's
	// committed offset: the next offset to read, or FirstOffset /
	// LastOffset (GroupConfig.StartOffset) when the group has none.
	Assigned(topic string) []Assignment
	// Start runs fn in a goroutine of its own for one partition of
	// Assigned. fn's context ends when the partition is revoked from this
	// member (an eager client: when the generation ends), when the group
	// is closed, or when the client finds this member fenced out, and
	// context.Cause says which; fn must then return promptly, after its
	// last Commit. fn returning before that says the member's hold on the
	// partition is in doubt (a newer owner wrote its stored offset): the
	// client then makes the member rejoin the group (an eager client ends
	// the generation), and the partition no longer counts as this
	// member's: a later generation that gives it to this member lists it
	// in Assigned again.
	Start(a Assignment, fn func(ctx context.Context, r PartitionReader))
	// Commit commits next, the NEXT offset to read (the last finished
	// offset + 1), as the group's offset of the partition. It is called
	// only for partitions Start runs a function for, only while that
	// function runs, and one call at a time per partition. The
	// coordinator accepts it only from a current member, which makes it
	// the consumer's way to ask whether this member still owns the
	// partition (see Over).
	Commit(topic string, partition int, next int64) error
	// Over reports whether an error of Commit says that this member no
	// longer holds the partition: the coordinator no longer knows the
	// member (its session expired) or has moved on to a generation that
	// fenced it, which a member paused past its session timeout finds out
	// this way before its heartbeats tell it. Any other error (the
	// coordinator unreachable, moving, or in the middle of a rebalance)
	// says nothing either way.
	Over(err error) bool
}

// Assignment is one partition a generation assigns to this member.
type Assignment struct {
	Topic     string
	Partition int
	// Offset is the group's committed offset, or FirstOffset / LastOffset.
	Offset int64
}

// PartitionReader fetches the messages of one partition, in offset order,
// at most GroupConfig.MaxWait per request to the broker, and at most
// MaxFetchBytes per response. The function Start runs is its only user;
// the client closes the reader when that function returns, if it has not.
type PartitionReader interface {
	// SetOffset makes the next fetch start at offset (a concrete offset, never
	// FirstOffset or LastOffset). It fails only on a closed reader.
	SetOffset(offset int64) error
	// Fetch returns the next message: the one at the offset set, or
	// the next one after the last returned (a compaction gap is skipped),
	// waiting until one is produced or ctx ends (it then returns ctx's
	// error). Other errors are the client's and are retried by the caller.
	// An offset past the log end is not an error: Fetch waits there, as
	// for a message not produced yet (the consumer checks the log end
	// itself); an offset below the log start (retention) moves on to the
	// log start. The message carries its key, value, headers and timestamp
	// as the producer (or, with LogAppendTime, the broker) set them, the
	// same on every fetch: the consumer's check of a recreated topic
	// compares them.
	Fetch(ctx context.Context) (kafka.Message, error)
	// CaughtUp reports whether the last message Fetch returned was the
	// partition's last when the broker sent it: no message after it was
	// fetched or was waiting on the broker to be fetched, as of then. A
	// batch stops waiting for more messages when it is true.
	CaughtUp() bool
	// Close releases the reader (the consumer closes it before its last
	// Commit, so that no fetch runs past it). Further calls return nil.
	Close() error
}
