package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// brokersEnv names the environment variable --brokers defaults to.
const brokersEnv = "INBOX_KAFKA_BROKERS"

// splitBrokers turns a comma-separated --brokers value (or $INBOX_KAFKA_BROKERS
// when it is empty) into addresses.
func splitBrokers(flagValue string, fromEnv bool) []string {
	v := strings.TrimSpace(flagValue)
	if v == "" && fromEnv {
		v = strings.TrimSpace(os.Getenv(brokersEnv))
	}
	var out []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// errNoTopic is wrapped by the error for a topic that does not exist.
var errNoTopic = errors.New("does not exist")

// kafkaClient is what the commands ask the brokers.
type kafkaClient struct {
	c *kafka.Client
}

func newKafkaClient(brokers []string) *kafkaClient {
	return &kafkaClient{c: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}}
}

// partitions returns the partition numbers of topic, sorted; an error when
// the topic does not exist.
func (k *kafkaClient) partitions(ctx context.Context, topic string) ([]int, error) {
	md, err := k.c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("read the metadata of topic %s: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("topic %s %w", topic, errNoTopic)
			}
			return nil, fmt.Errorf("read the metadata of topic %s: %w", topic, t.Error)
		}
		ps := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ps = append(ps, p.ID)
		}
		slices.Sort(ps)
		if len(ps) == 0 {
			return nil, fmt.Errorf("topic %s %w", topic, errNoTopic)
		}
		return ps, nil
	}
	return nil, fmt.Errorf("topic %s %w", topic, errNoTopic)
}

// logBounds is a partition's log start and end offsets.
type logBounds struct{ start, end int64 }

// bounds returns the log start and end offsets of the partitions of topic.
func (k *kafkaClient) bounds(ctx context.Context, topic string, partitions []int) (map[int]logBounds, error) {
	reqs := make([]kafka.OffsetRequest, 0, 2*len(partitions))
	for _, p := range partitions {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	res, err := k.c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("read the log offsets of topic %s: %w", topic, err)
	}
	out := make(map[int]logBounds, len(partitions))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("read the log offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = logBounds{start: po.FirstOffset, end: po.LastOffset}
	}
	for _, p := range partitions {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("read the log offsets of %s/%d: no answer", topic, p)
		}
	}
	return out, nil
}

// offsetsForTime returns, per partition, the offset of the first message
// whose timestamp is at or after at; the log end offset (from ends) where
// there is none.
func (k *kafkaClient) offsetsForTime(ctx context.Context, topic string, partitions []int, at time.Time, ends map[int]logBounds) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, 0, len(partitions))
	for _, p := range partitions {
		reqs = append(reqs, kafka.TimeOffsetOf(p, at))
	}
	// Alone in its request: kafka-go files a "not found" answer (offset
	// and timestamp -1) as the log end offset, which is what it means.
	res, err := k.c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("find the offsets of topic %s at %s: %w", topic, at.Format(time.RFC3339), err)
	}
	out := make(map[int]int64, len(partitions))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("find the offset of %s/%d at %s: %w", topic, po.Partition, at.Format(time.RFC3339), po.Error)
		}
		off := int64(-1)
		for o := range po.Offsets {
			if o >= 0 && (off < 0 || o < off) {
				off = o
			}
		}
		if off < 0 {
			off = ends[po.Partition].end
		}
		out[po.Partition] = off
	}
	for _, p := range partitions {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("find the offset of %s/%d at %s: no answer", topic, p, at.Format(time.RFC3339))
		}
	}
	return out, nil
}

// groupMembers returns the state of a consumer group and its members'
// client ids and hosts.
func (k *kafkaClient) groupMembers(ctx context.Context, group string) (state string, members []string, err error) {
	res, err := k.c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return "", nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	for _, g := range res.Groups {
		if g.GroupID != group {
			continue
		}
		if g.Error != nil {
			return "", nil, fmt.Errorf("describe consumer group %s: %w", group, g.Error)
		}
		for _, m := range g.Members {
			members = append(members, m.ClientID+"@"+strings.TrimPrefix(m.ClientHost, "/"))
		}
		return g.GroupState, members, nil
	}
	return "", nil, fmt.Errorf("describe consumer group %s: no answer", group)
}
