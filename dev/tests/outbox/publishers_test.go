package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// relayPublisher is an aligned relay's publisher as the tests use it:
// every one this library ships is all of these.
type relayPublisher interface {
	outbox.PinningPublisher
	outbox.Witness
	outbox.Limited
}

// publishers are the relay's publishers this library ships, each opened
// over brokers and closed when the test ends.
var publishers = []struct {
	name string
	open func(t *testing.T, brokers []string) relayPublisher
}{
	{"kafka-go", func(t *testing.T, brokers []string) relayPublisher {
		// A short metadata TTL, so that the writer sees a new partition
		// count soon; the writer does not close a Transport it was given.
		transport := &kafka.Transport{MetadataTTL: 300 * time.Millisecond}
		w := outbox.NewKafkaWriter(brokers...)
		w.Transport = transport
		t.Cleanup(func() {
			_ = w.Close()
			transport.CloseIdleConnections()
		})
		kp, err := outbox.NewKafkaPublisher(w)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}},
	{"franz-go", func(t *testing.T, brokers []string) relayPublisher {
		p, err := franzgo.NewPublisher(franzgo.Options{Brokers: brokers})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}},
}

// adminRequest sends req through a franz-go client of its own (which
// routes admin requests to the controller) and fails t on an error code.
func adminRequest(ctx context.Context, t *testing.T, brokers []string, req kmsg.Request) kmsg.Response {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := cl.Request(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var code int16
	switch r := resp.(type) {
	case *kmsg.CreatePartitionsResponse:
		code = r.Topics[0].ErrorCode
	case *kmsg.IncrementalAlterConfigsResponse:
		code = r.Resources[0].ErrorCode
	}
	if err := kerr.ErrorForCode(code); err != nil {
		t.Fatalf("%T: %v", req, err)
	}
	return resp
}

// addPartitions makes topic's partition count count.
func addPartitions(ctx context.Context, t *testing.T, brokers []string, topic string, count int) {
	t.Helper()
	req := kmsg.NewPtrCreatePartitionsRequest()
	req.TimeoutMillis = 30000
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = topic, int32(count)
	req.Topics = append(req.Topics, rt)
	adminRequest(ctx, t, brokers, req)
}

// setTopicConfig sets one config of topic.
func setTopicConfig(ctx context.Context, t *testing.T, brokers []string, topic, name, value string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = name, kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	adminRequest(ctx, t, brokers, req)
}
