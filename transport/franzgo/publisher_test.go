package franzgo

import (
	"context"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A keyed message goes where outbox.NewKafkaWriter's writer puts it
// (kafka.Murmur2Balancer, outbox.Balancer's default), an empty key
// included, for every partition count: switching publishers moves no key.
func TestPublisherPartitionsKeysAsTheKafkaGoWriter(t *testing.T) {
	for n := 1; n <= 64; n++ {
		tp := pinningPartitioner{}.ForTopic("t")
		parts := make([]int, n)
		for i := range parts {
			parts[i] = i
		}
		for k := range 500 {
			key := fmt.Appendf(nil, "key-%d", k*7919)
			if k == 0 {
				key = []byte{}
			}
			r := &kgo.Record{Topic: "t", Key: key}
			if !tp.RequiresConsistency(r) {
				t.Fatalf("a keyed record does not require consistency: franz-go would offer only writable partitions")
			}
			got, want := tp.Partition(r, n), (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: key}, parts...)
			if got != want {
				t.Fatalf("key %q of %d partitions: partition %d, the kafka-go writer's %d", key, n, got, want)
			}
		}
	}
}

// A pinned record goes to its partition while the producer sees the
// call's count; once one was refused for another count, every later one
// of the call is refused too, and the call reports the counts.
func TestPublisherPinnedPlacement(t *testing.T) {
	tp := pinningPartitioner{}.ForTopic("t")
	call := &pinCall{count: 4}
	rec := func(partition int32) *kgo.Record {
		return &kgo.Record{Topic: "t", Key: []byte("k"),
			Context: context.WithValue(context.Background(), pinKey{}, &pin{partition: partition, call: call})}
	}
	if got := tp.Partition(rec(3), 4); got != 3 {
		t.Fatalf("pinned to 3 of 4: placed on %d", got)
	}
	if got := tp.Partition(rec(2), 5); got != noPartition {
		t.Fatalf("pinned for 4 partitions, the producer sees 5: placed on %d", got)
	}
	if got := tp.Partition(rec(1), 4); got != noPartition {
		t.Fatalf("after a refusal: placed on %d, want every later record refused", got)
	}
	if err := call.mismatch(); err == nil || err.Error() == "" {
		t.Fatal("no partition-count error after a refusal")
	}
}
