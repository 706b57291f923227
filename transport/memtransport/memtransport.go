// Package memtransport is an in-memory Kafka cluster behind package
// transport's contract, for testing an application's consumer handlers
// with no broker: give consumer.Config.Kafka.Transport a [Cluster]'s
// [Cluster.Client], produce messages with [Cluster.Produce], and assert
// what the handlers did, the group's committed offsets
// ([Cluster.Committed]) and the dead letters the consumer wrote
// ([Cluster.Messages] of the dead-letter topic). A test knows the consumer
// is done with a message when the group's committed offset passed it; the
// consumer commits at its commit interval, which a test sets short. The
// Example shows a whole test. It is the library's own test double: the
// consumer's tests run on it.
//
// # What it models
//
// Topics of partitions, each an append-only log with offsets from 0;
// message keys, values, headers and timestamps kept as produced. Produce
// partitions by key with murmur2, as the outbox's relay writer
// (outbox.NewKafkaWriter) and the Java client do; the dead-letter writer
// of its clients partitions by key with kafka.Hash (FNV-1a), as the
// consumer's own dead-letter writer does on kafka-go and on franz-go.
// Consumer groups, each with its committed offsets and numbered
// generations; a partition the group has no offset for starts at
// GroupConfig.StartOffset. Rebalancing as the two clients the consumer
// ships with do it: [Eager] (kafka-go: every rebalance revokes every
// partition, and waits for all of them) or [Cooperative] (franz-go's
// cooperative-sticky: only the partitions that move are revoked, the ones
// a member keeps go on undisturbed). Commits refused from a member whose
// generation is over. Deleting a topic, and the records before an offset
// (Kafka's DeleteRecords). A session timeout outside the broker's default
// bounds (6 s to 30 min) is refused, as a broker does.
//
// # What it does not model
//
// One member per group: the cluster stands for the rest of the group,
// and [Cluster.Rebalance] for its members joining and leaving (a second
// member joining a group that has one is refused). No replication, no
// leaders or in-sync replicas, no retention by time or size, no
// compaction, no transactions, no quotas, no batching or fetch sizes, no
// network, no heartbeats or session expiry; no broker faults beyond the
// errors [Cluster.Fail] injects. Offsets are committed at once, and a
// produced message can be fetched at once.
package memtransport

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/transport"
)

// Rebalancing is how a Client's group revokes partitions at a rebalance.
type Rebalancing int

const (
	// Eager revokes every partition of the member at every rebalance, as
	// kafka-go (the consumer's default client) does.
	Eager Rebalancing = iota
	// Cooperative revokes only the partitions that move to other members,
	// as franz-go's cooperative-sticky assignor (the franzgo transport)
	// does.
	Cooperative
)

// Op is an operation of a Client that [Cluster.Fail] can make fail.
type Op int

const (
	// OpJoin is a join of the group (transport.Group.Next).
	OpJoin Op = iota
	// OpFetch is a fetch (transport.PartitionReader.Fetch).
	OpFetch
	// OpCommit is an offset commit (transport.Generation.Commit).
	OpCommit
	// OpDeadLetter is a write of the clients' dead-letter writer.
	OpDeadLetter
)

// Cluster is an in-memory Kafka cluster. Its methods may be called from
// several goroutines at once, while clients of it run.
type Cluster struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	topics  map[string][]*partitionLog
	groups  map[string]*groupState
	faults  map[Op][]error
	keys    kafka.Murmur2Balancer
	dlqKeys kafka.Hash
}

type partitionLog struct {
	start int64 // the log start offset
	next  int64 // the log end offset
	msgs  []kafka.Message
}

type topicPartition struct {
	topic     string
	partition int
}

// groupState is a consumer group: its committed offsets, its current
// generation, and its one member.
type groupState struct {
	committed map[topicPartition]int64
	// gen is the current generation's id; genCancel ends it (eager).
	gen       int32
	genCancel func(error)
	// keep, when set, is the partitions of each topic the next
	// generations assign (all of them otherwise).
	keep map[string][]int
	// rebalances counts the rebalances asked for (by Rebalance, or by a
	// partition's function returning on its own); a cooperative member
	// follows them.
	rebalances int
	member     *group
}

// NewCluster returns an empty cluster: no topics, no groups.
func NewCluster() *Cluster {
	return &Cluster{
		changed: make(chan struct{}),
		topics:  make(map[string][]*partitionLog),
		groups:  make(map[string]*groupState),
		faults:  make(map[Op][]error),
	}
}

// notify wakes the waiters; c.mu is held.
func (c *Cluster) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// group returns the state of group id, made on first use; c.mu is held.
func (c *Cluster) group(id string) *groupState {
	gs, ok := c.groups[id]
	if !ok {
		gs = &groupState{committed: make(map[topicPartition]int64)}
		c.groups[id] = gs
	}
	return gs
}

// log returns the partition's log; c.mu is held.
func (c *Cluster) log(topic string, partition int) (*partitionLog, error) {
	ps, ok := c.topics[topic]
	if !ok {
		return nil, fmt.Errorf("memtransport: topic %q: %w", topic, kafka.UnknownTopicOrPartition)
	}
	if partition < 0 || partition >= len(ps) {
		return nil, fmt.Errorf("memtransport: topic %q has no partition %d: %w", topic, partition, kafka.UnknownTopicOrPartition)
	}
	return ps[partition], nil
}

// CreateTopic creates topic with partitions empty partitions. It fails if
// the topic exists or partitions is not positive.
func (c *Cluster) CreateTopic(topic string, partitions int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if topic == "" || partitions < 1 {
		return fmt.Errorf("memtransport: topic %q with %d partitions: want a name and at least one partition", topic, partitions)
	}
	if _, ok := c.topics[topic]; ok {
		return fmt.Errorf("memtransport: topic %q: %w", topic, kafka.TopicAlreadyExists)
	}
	ps := make([]*partitionLog, partitions)
	for i := range ps {
		ps[i] = &partitionLog{}
	}
	c.topics[topic] = ps
	c.notify()
	return nil
}

// DeleteTopic deletes topic, its messages and the groups' committed
// offsets of it, as Kafka does. A topic created again under the same name
// starts empty, at offset 0.
func (c *Cluster) DeleteTopic(topic string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.topics[topic]; !ok {
		return fmt.Errorf("memtransport: topic %q: %w", topic, kafka.UnknownTopicOrPartition)
	}
	delete(c.topics, topic)
	for _, gs := range c.groups {
		for tp := range gs.committed {
			if tp.topic == topic {
				delete(gs.committed, tp)
			}
		}
	}
	c.notify()
	return nil
}

// Produce appends msgs to topic, each to the partition murmur2 of its key
// picks (as outbox.NewKafkaWriter's writer and the Java client do; a
// message with a nil key goes to a random partition). Each message keeps
// its Key, Value, Headers and Time (the time of the call if zero); Topic,
// Partition and Offset are set by the cluster. The messages of one call
// are appended in order, all or none: it fails if the topic does not
// exist.
func (c *Cluster) Produce(topic string, msgs ...kafka.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.appendBalanced(topic, c.keys, msgs)
}

// ProduceTo appends msgs to one partition of topic, as a producer that
// picks the partition itself does.
func (c *Cluster) ProduceTo(topic string, partition int, msgs ...kafka.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, err := c.log(topic, partition)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, m := range msgs {
		l.append(topic, partition, m, now)
	}
	c.notify()
	return nil
}

// appendBalanced appends msgs to topic's partitions as b picks them; c.mu
// is held.
func (c *Cluster) appendBalanced(topic string, b kafka.Balancer, msgs []kafka.Message) error {
	ps, ok := c.topics[topic]
	if !ok {
		return fmt.Errorf("memtransport: topic %q: %w", topic, kafka.UnknownTopicOrPartition)
	}
	ids := make([]int, len(ps))
	for i := range ids {
		ids[i] = i
	}
	now := time.Now()
	for _, m := range msgs {
		p := b.Balance(m, ids...)
		ps[p].append(topic, p, m, now)
	}
	c.notify()
	return nil
}

func (l *partitionLog) append(topic string, partition int, m kafka.Message, now time.Time) {
	m.Topic, m.Partition, m.Offset = topic, partition, l.next
	m.Headers = slices.Clone(m.Headers)
	if m.Time.IsZero() {
		m.Time = now
	}
	m.WriterData = nil
	l.msgs = append(l.msgs, m)
	l.next++
}

// Messages returns the messages of topic still in its logs (none if it
// does not exist), by partition and then by offset: what Produce,
// ProduceTo and the clients' dead-letter writers appended.
func (c *Cluster) Messages(topic string) []kafka.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []kafka.Message
	for _, l := range c.topics[topic] {
		for _, m := range l.msgs {
			m.Headers = slices.Clone(m.Headers)
			out = append(out, m)
		}
	}
	return out
}

// DeleteRecords deletes the partition's messages below offset before,
// moving its log start there, as Kafka's DeleteRecords (or retention)
// does: a reader positioned below it moves on to the log start.
func (c *Cluster) DeleteRecords(topic string, partition int, before int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, err := c.log(topic, partition)
	if err != nil {
		return err
	}
	if before < l.start || before > l.next {
		return fmt.Errorf("memtransport: delete records of %s/%d before %d: the log holds offsets %d to %d: %w",
			topic, partition, before, l.start, l.next, kafka.OffsetOutOfRange)
	}
	l.start = before
	l.msgs = slices.DeleteFunc(l.msgs, func(m kafka.Message) bool { return m.Offset < before })
	c.notify()
	return nil
}

// Committed returns group's committed offset of the partition: the next
// offset to read. ok is false if the group has committed none.
func (c *Cluster) Committed(group, topic string, partition int) (next int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gs, found := c.groups[group]
	if !found {
		return 0, false
	}
	next, ok = gs.committed[topicPartition{topic, partition}]
	return next, ok
}

// SetCommitted sets group's committed offset of the partition, as an
// offset reset (kafka-consumer-groups --reset-offsets) does; a member
// reads from there when the partition is next assigned to it.
func (c *Cluster) SetCommitted(group, topic string, partition int, next int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.group(group).committed[topicPartition{topic, partition}] = next
	c.notify()
}

// Generation returns the id of group's current generation: 0 before its
// first join, then one more at every join.
func (c *Cluster) Generation(group string) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gs, ok := c.groups[group]; ok {
		return gs.gen
	}
	return 0
}

// Rebalance makes group rebalance, as when members join or leave: its
// member keeps, from the next generation on, the partitions keep lists of
// each topic (nil: every partition of its topics; a topic missing from
// keep: none of its partitions), the others standing for partitions the
// rest of the group took. An eager member stops all its partitions and is
// given the kept ones again; a cooperative one stops only those it loses,
// and is given only the ones it did not have.
func (c *Cluster) Rebalance(group string, keep map[string][]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gs := c.group(group)
	gs.keep = keep
	gs.rebalances++
	if gs.genCancel != nil && (gs.member == nil || gs.member.mode == Eager) {
		gs.genCancel(errRebalance)
	}
	c.notify()
}

// Fail makes the next len(errs) calls of op, by any client of the
// cluster, return errs in order instead of doing their work: kafka.Error
// values (kafka.RequestTimedOut, kafka.LeaderNotAvailable,
// kafka.MessageSizeTooLarge, ...) stand for the broker's answers.
func (c *Cluster) Fail(op Op, errs ...error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[op] = append(c.faults[op], errs...)
}

// fault pops the next error injected for op; c.mu is held.
func (c *Cluster) fault(op Op) error {
	errs := c.faults[op]
	if len(errs) == 0 {
		return nil
	}
	c.faults[op] = errs[1:]
	return errs[0]
}

// Client returns a new client of the cluster, for consumer.Config.Kafka.Transport,
// whose groups rebalance as r says.
func (c *Cluster) Client(r Rebalancing) transport.Client { return &client{c: c, mode: r} }

// partitions returns the partitions of topic in order; c.mu is held.
func (c *Cluster) partitions(topic string) []int {
	ids := make([]int, len(c.topics[topic]))
	for i := range ids {
		ids[i] = i
	}
	return ids
}

var errRebalance = errors.New("memtransport: rebalance")
