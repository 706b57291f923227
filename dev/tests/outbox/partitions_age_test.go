package outbox_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxgo/inbox/transport/franzgo"
)

// An aligned relay asks its publisher for the partition count before every
// publish. franzgo.Publisher answers from a count read from the cluster
// within the last second: one Metadata request a second, not one a cycle,
// and a change of the count shows within that second.
func TestFranzGoPublisherReadsThePartitionCountOnceASecond(t *testing.T) {
	const topic = "partitions-age"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var asked atomic.Int64
	c.ControlKey(kmsg.Metadata.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, rt := range req.(*kmsg.MetadataRequest).Topics {
			if rt.Topic != nil && *rt.Topic == topic {
				asked.Add(1)
			}
		}
		return nil, nil, false
	})
	pub, err := franzgo.NewPublisher(franzgo.Options{Brokers: c.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	ctx := t.Context()

	start := time.Now()
	for range 50 {
		n, err := pub.Partitions(ctx, topic)
		if err != nil || n != 4 {
			t.Fatalf("Partitions: %d, %v; want 4", n, err)
		}
	}
	if got := asked.Load(); got != 1 && time.Since(start) < time.Second {
		t.Fatalf("50 calls within a second asked the cluster %d times, want once", got)
	}

	addPartitions(ctx, t, c.ListenAddrs(), topic, 6)
	changed := time.Now()
	for {
		n, err := pub.Partitions(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if n == 6 {
			break
		}
		if n != 4 {
			t.Fatalf("Partitions: %d, want 4 or 6", n)
		}
		if time.Since(changed) > 1500*time.Millisecond {
			t.Fatalf("the new count did not show %v after the change", time.Since(changed))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
