package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
)

// testBrokers returns the test Kafka brokers, comma-separated.
func testBrokers(t *testing.T) []string {
	t.Helper()
	return testservers.KafkaBrokers(t)
}

// newTopic creates a topic of its own for the test, with partitions
// partitions, and waits until each answers.
func newTopic(t *testing.T, brokers []string, prefix string, partitions int) string {
	t.Helper()
	topic := prefix + "-" + conformance.RandomSuffix()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	ctx := t.Context()
	waitFor(t, 30*time.Second, "topic "+topic+" to be created", func() bool {
		cr, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
		return err == nil && cr.Errors[topic] == nil
	})
	reqs := make([]kafka.OffsetRequest, partitions)
	for p := range partitions {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	waitFor(t, 30*time.Second, "topic "+topic+" to have leaders", func() bool {
		lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
		if err != nil || len(lo.Topics[topic]) != partitions {
			return false
		}
		for _, p := range lo.Topics[topic] {
			if p.Error != nil {
				return false
			}
		}
		return true
	})
	t.Cleanup(func() {
		_, _ = cl.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
	return topic
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produce writes msgs, each to its Partition of topic, with acks=all.
func produce(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: 1,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })}
	defer w.Close()
	for _, m := range msgs {
		// Partition is read-only for the Writer: the balancer reads it.
		if err := w.WriteMessages(t.Context(), m); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
	}
}

// readAll reads every message of topic up to its current end.
func readAll(t *testing.T, brokers []string, topic string) []kafka.Message {
	t.Helper()
	k := newKafkaClient(brokers)
	parts, err := k.partitions(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	b, err := k.bounds(t.Context(), topic, parts)
	if err != nil {
		t.Fatal(err)
	}
	var out []kafka.Message
	for _, p := range parts {
		if b[p].end == b[p].start {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 200 * time.Millisecond})
		if err := r.SetOffset(b[p].start); err != nil {
			t.Fatal(err)
		}
		for {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			m, err := r.ReadMessage(ctx)
			cancel()
			if err != nil {
				t.Fatalf("read %s/%d: %v", topic, p, err)
			}
			out = append(out, m)
			if m.Offset+1 >= b[p].end {
				break
			}
		}
		r.Close()
	}
	return out
}

func headerMap(hs []kafka.Header) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

func brokersArg(brokers []string) string { return strings.Join(brokers, ",") }
