package transport_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxgo/inbox/transport"
)

// target is a real broker with a fresh topic and group name.
type target struct {
	brokers      []string
	topic, group string
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: testLogLevel}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createTopic creates topic with partitions (and configs) and waits until
// each partition answers.
func createTopic(t *testing.T, brokers []string, topic string, partitions int, configs ...kafka.ConfigEntry) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	ctx := context.Background()
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: configs}
	waitUntil(t, 30*time.Second, "topic "+topic+" to be created", func() bool {
		cr, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
		return err == nil && cr.Errors[topic] == nil
	})
	waitUntil(t, 30*time.Second, "topic "+topic+" to have leaders", func() bool {
		var reqs []kafka.OffsetRequest
		for p := range partitions {
			reqs = append(reqs, kafka.LastOffsetOf(p))
		}
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
}

// produce writes msgs to the partition each names.
func produce(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: partitionBalancer{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

type partitionBalancer struct{}

func (partitionBalancer) Balance(m kafka.Message, _ ...int) int { return m.Partition }

// commitAs commits offsets for group as a client outside any generation
// (the coordinator accepts that for a group without members).
func commitAs(t *testing.T, brokers []string, group, topic string, offsets map[int]int64) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	var ps []kafka.OffsetCommit
	for p, o := range offsets {
		ps = append(ps, kafka.OffsetCommit{Partition: p, Offset: o})
	}
	resp, err := cl.OffsetCommit(context.Background(), &kafka.OffsetCommitRequest{
		GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{topic: ps},
	})
	if err != nil {
		t.Fatalf("offset commit: %v", err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("offset commit of %s/%d: %v", topic, p.Partition, p.Error)
		}
	}
}

// committedOf reads the group's committed offset of one partition (-1 if
// none).
func committedOf(t *testing.T, brokers []string, group, topic string, partition int) int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {partition}}})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Partition == partition {
			return p.CommittedOffset
		}
	}
	return -1
}

// groupConfig is a GroupConfig with short timeouts for a test.
func groupConfig(t *testing.T, k target) transport.GroupConfig {
	return transport.GroupConfig{
		GroupID:           k.group,
		Topics:            []string{k.topic},
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		JoinBackoff:       100 * time.Millisecond,
		StartOffset:       transport.FirstOffset,
		MaxWait:           100 * time.Millisecond,
		Logger:            testLogger(t),
	}
}

// nextGen calls Next until it returns a generation (its errors are
// retried, as the consumer's group loop does, unless Rejected).
func nextGen(t *testing.T, g transport.Group, d time.Duration) transport.Generation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		gen, err := g.Next(ctx)
		if err == nil {
			return gen
		}
		if ctx.Err() != nil || g.Rejected(err) {
			t.Fatalf("Next: %v", err)
		}
		t.Logf("Next: %v (retrying)", err)
		time.Sleep(100 * time.Millisecond)
	}
}

func partitionsOf(as []transport.Assignment) map[int]int64 {
	out := make(map[int]int64, len(as))
	for _, a := range as {
		out[a.Partition] = a.Offset
	}
	return out
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// removeMember removes a member from the group as the coordinator does
// when its session expires: LeaveGroup v3 (KIP-345) names the members to
// remove.
func removeMember(t *testing.T, brokers []string, group, memberID string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Version = 3
	req.Group = group
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = memberID
	req.Members = append(req.Members, m)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("LeaveGroup: %v", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		t.Fatalf("LeaveGroup: %v", err)
	}
	for _, m := range resp.Members {
		if err := kerr.ErrorForCode(m.ErrorCode); err != nil {
			t.Fatalf("LeaveGroup of %s: %v", m.MemberID, err)
		}
	}
}

// testLogLevel is the tests' log level; Debug shows franz-go's group and fetch steps.
var testLogLevel = slog.LevelWarn
