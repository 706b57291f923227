// Package franzgo is a transport.Client over github.com/twmb/franz-go, for
// consumer.Config.Kafka.Transport: the consumer's group membership, fetching,
// offset commits, log-offset and topic lookups and default dead-letter
// writer run on franz-go instead of kafka-go. Its Publisher is an outbox
// relay's publisher on franz-go's idempotent producer (NewPublisher).
//
// # When to choose it
//
// Its group uses the cooperative-sticky assignor (KIP-429): a rebalance
// revokes only the partitions that move to another member. The partitions
// a member keeps go on being fetched and processed, their in-flight
// batches finish and commit, and only the revoked partitions' functions are
// ended, and have returned (committing what they finished), before the
// revocation is acknowledged. A rolling deploy of N replicas then no
// longer stops every partition of the group N times, as kafka-go's eager
// rebalancing does. Its dead-letter writer is franz-go's idempotent
// producer.
//
// kafka-go stays the consumer's default: a user who does not import this
// module downloads nothing of franz-go.
//
// # How it works
//
// A Group runs two franz-go clients. The first is the group member
// (ConsumerGroup, ConsumeTopics, the cooperative-sticky balancer,
// autocommit disabled) with fetching paused: it takes part in rebalances,
// reports assignments and revocations through its OnPartitions callbacks,
// and commits. The second fetches the partitions the consumer's functions
// run, as a direct consumer that adds, moves and removes partitions as the
// readers ask: one poll loop hands each partition's records to its
// PartitionReader, and pauses fetching a partition whose reader holds a
// full buffer until the reader drains it. Generation IDs are the group's
// generations, which grow at every rebalance, so a partition's new owner
// writes stored offsets with a larger ID than its previous owner.
//
// Dead letters are partitioned as kafka-go's kafka.Hash does (FNV-1a of
// the key, Sarama's arithmetic), so a key lands on the partition it would
// have with the kafka-go transport; a message without a key goes to a
// sticky partition rather than round-robin. A cluster whose ACLs refuse
// idempotent writes to the consumer's principal needs
// kgo.DisableIdempotentWrite() in Options.ClientOptions.
//
// # The outbox relay's publisher
//
// NewPublisher returns an outbox.Publisher for outbox.Outbox.NewRelay, the
// counterpart of outbox.KafkaPublisher over outbox.NewKafkaWriter's
// writer: acknowledged by all in-sync replicas, keys on the partitions the
// Java client (and the kafka-go writer's murmur2 balancer) gives them, so
// a relay moves between the two without moving a key, and per partition
// the order given, across retries, by the idempotent producer. It pins an
// aligned outbox's messages to their shards' partitions and reads the
// partitions back for its sequence checks (outbox.PinningPublisher,
// outbox.Witness), and tells the relay the offsets the broker gave its
// messages, so a relay nobody raced asks no end offsets after a publish.
//
// # What it does not do
//
// A group must not mix members of both transports: kafka-go's members
// offer only eager assignors and this one only cooperative-sticky, and the
// coordinator refuses a join no protocol is common to
// (INCONSISTENT_GROUP_PROTOCOL). Moving a group from kafka-go to franz-go
// means stopping its kafka-go members before the first franz-go member
// joins. It does not use the KIP-848 consumer group protocol, static
// membership, transactions or regular-expression subscriptions, and it
// never creates a topic (its metadata requests do not allow auto
// creation).
package franzgo
