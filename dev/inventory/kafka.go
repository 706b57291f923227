package inventory

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// CreateTopic creates topic on a real broker, with one replica per
// partition, and waits until its partitions are visible.
func CreateTopic(ctx context.Context, broker, topic string, partitions int) error {
	return CreateReplicatedTopic(ctx, broker, topic, partitions, 1)
}

// CreateReplicatedTopic is CreateTopic with replicas replicas per partition
// (the cluster's min.insync.replicas applies).
func CreateReplicatedTopic(ctx context.Context, broker, topic string, partitions, replicas int) error {
	dialer := &kafka.Dialer{Timeout: 10 * time.Second}
	conn, err := dialer.DialContext(ctx, "tcp", broker)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", broker, err)
	}
	defer conn.Close()
	controller, err := conn.Controller()
	if err != nil {
		return err
	}
	cc, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(controller.Host, strconv.Itoa(controller.Port)))
	if err != nil {
		return err
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: replicas}); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for {
		if ps, err := conn.ReadPartitions(topic); err == nil && len(ps) == partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s did not appear: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Progress is how far a consumer group has committed through a topic.
type Progress struct {
	Committed int64 // messages below the committed offsets
	Total     int64 // messages in the topic
	Done      bool  // every partition committed up to its end

	Ends    map[int]int64 // each partition's log end offset
	Offsets map[int]int64 // each partition's committed offset (absent: none)
}

func (p Progress) String() string {
	return fmt.Sprintf("%d/%d messages consumed and committed", p.Committed, p.Total)
}

// GroupProgress compares group's committed offsets with the end offsets of
// topic's partitions.
func GroupProgress(ctx context.Context, brokers []string, group, topic string, partitions int) (Progress, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	req := make([]kafka.OffsetRequest, partitions)
	parts := make([]int, partitions)
	for i := range req {
		req[i] = kafka.LastOffsetOf(i)
		parts[i] = i
	}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: req}})
	if err != nil {
		return Progress{}, err
	}
	ends := map[int]int64{}
	for _, p := range offs.Topics[topic] {
		if p.Error != nil {
			return Progress{}, p.Error
		}
		ends[p.Partition] = p.LastOffset
	}
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return Progress{}, err
	}
	pr := Progress{Done: len(res.Topics[topic]) == partitions && len(ends) == partitions, Ends: ends, Offsets: map[int]int64{}}
	for _, end := range ends {
		pr.Total += end
	}
	for _, p := range res.Topics[topic] {
		if p.CommittedOffset >= 0 {
			pr.Offsets[p.Partition] = p.CommittedOffset
		}
		if p.CommittedOffset > 0 {
			pr.Committed += min(p.CommittedOffset, ends[p.Partition])
		}
		if p.CommittedOffset < ends[p.Partition] {
			pr.Done = false
		}
	}
	return pr, nil
}

// TopicSize returns how many messages the partitions of topic hold (the
// sum of their log end offsets; nothing is deleted during a run).
func TopicSize(ctx context.Context, brokers []string, topic string, partitions int) (int64, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	req := make([]kafka.OffsetRequest, partitions)
	for i := range req {
		req[i] = kafka.LastOffsetOf(i)
	}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: req}})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range offs.Topics[topic] {
		if p.Error != nil {
			return 0, p.Error
		}
		n += p.LastOffset
	}
	return n, nil
}
