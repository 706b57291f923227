package outbox

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
)

// Kafka's UtilsTest.testMurmur2: the Java client's own vectors.
func TestMurmur2KafkaVectors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		if got := int32(murmur2([]byte(tc.in))); got != tc.want {
			t.Errorf("murmur2(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
	// toPositive, then modulo: Kafka's default partitioner on 10 partitions.
	if got := partitionHash([]byte("foobar"), "") % 10; got != 6 {
		t.Errorf("foobar on 10 partitions: %d, want 6", got)
	}
}

// An aligned message's shard is the partition kafka-go's Murmur2Balancer
// (the Java client's partitioner) picks for its key, on any partition count;
// a message without a key is placed by its id the same way.
func TestPartitionHashIsMurmur2Balancer(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	all := make([]int, 1000)
	for i := range all {
		all[i] = i
	}
	for i := range 5000 {
		key := make([]byte, rng.IntN(40))
		for j := range key {
			key[j] = byte(rng.UintN(256))
		}
		n := 1 + rng.IntN(len(all))
		if i%10 == 0 {
			n = 8
		}
		want := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: key}, all[:n]...)
		if got := int(partitionHash(key, "ignored") % uint32(n)); got != want {
			t.Fatalf("key %x on %d partitions: shard %d, Murmur2Balancer %d", key, n, got, want)
		}
		id := NewEventID(time.Now())
		want = kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: []byte(id)}, all[:n]...)
		if got := int(partitionHash(nil, id) % uint32(n)); got != want {
			t.Fatalf("no key, id %s on %d partitions: shard %d, Murmur2Balancer of the id %d", id, n, got, want)
		}
	}
}

func pinned(call *pinCall, key string, partition int) kafka.Message {
	return kafka.Message{Topic: "t", Key: []byte(key), WriterData: &pin{partition: partition, call: call}}
}

// The Balancer places a pinned message on its partition only while kafka-go
// offers the count it was pinned for; after one refusal every later message
// of the call is refused, and the call reports the count it saw.
func TestBalancerPins(t *testing.T) {
	parts := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		return p
	}
	var b kafka.Balancer = Balancer{}
	call := &pinCall{count: 8}
	for p := range 8 {
		if got := b.Balance(pinned(call, "k", p), parts(8)...); got != p {
			t.Fatalf("pinned to %d of 8: got %d", p, got)
		}
	}
	if err := call.mismatch(); err != nil {
		t.Fatalf("no mismatch yet: %v", err)
	}
	if got := b.Balance(pinned(call, "k", 3), parts(9)...); got != noPartition {
		t.Fatalf("pinned for 8 partitions, offered 9: got %d, want %d", got, noPartition)
	}
	if got := b.Balance(pinned(call, "k", 3), parts(8)...); got != noPartition {
		t.Fatalf("after a refusal in the call: got %d, want %d", got, noPartition)
	}
	var pe *PartitionCountError
	if err := call.mismatch(); !errors.Is(err, ErrPartitionCount) || !errors.As(err, &pe) || pe.Topic != "t" || pe.Partitions != 9 || pe.Shards != 8 {
		t.Fatalf("mismatch %v, want topic t with 9 partitions against 8 shards", err)
	}
	// A message nobody pinned goes by key.
	m := kafka.Message{Key: []byte("foobar")}
	if got, want := b.Balance(m, parts(10)...), (kafka.Murmur2Balancer{}).Balance(m, parts(10)...); got != want {
		t.Fatalf("unpinned: %d, want Murmur2Balancer's %d", got, want)
	}
	if got := (Balancer{Keys: kafka.BalancerFunc(func(kafka.Message, ...int) int { return 4 })}).Balance(m, parts(10)...); got != 4 {
		t.Fatalf("unpinned with Keys: %d, want Keys' 4", got)
	}
}

func TestKafkaPublisherBalancers(t *testing.T) {
	writer := func(b kafka.Balancer) *kafka.Writer {
		w := NewKafkaWriter("127.0.0.1:1")
		w.Balancer = b
		return w
	}
	for _, b := range []kafka.Balancer{Balancer{}, &Balancer{}, Balancer{Keys: kafka.CRC32Balancer{}}} {
		p, err := NewKafkaPublisher(writer(b))
		if err != nil {
			t.Fatalf("balancer %#v refused: %v", b, err)
		}
		if err := p.canPin(); err != nil {
			t.Fatalf("balancer %#v cannot pin: %v", b, err)
		}
	}
	for _, b := range []kafka.Balancer{Balancer{Keys: &kafka.RoundRobin{}}, (*Balancer)(nil), &kafka.LeastBytes{}} {
		if _, err := NewKafkaPublisher(writer(b)); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Fatalf("balancer %#v: %v, want ErrInvalidConfig", b, err)
		}
	}
	p, err := NewKafkaPublisher(writer(kafka.Murmur2Balancer{}))
	if err != nil {
		t.Fatal(err)
	}
	err = p.PublishPinned(t.Context(), []kafka.Message{{Topic: "t"}}, []int{0}, 1)
	if !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Fatalf("PublishPinned through a Murmur2Balancer: %v, want ErrInvalidConfig", err)
	}
	if !pins(NewKafkaWriter("127.0.0.1:1").Balancer) {
		t.Fatal("NewKafkaWriter's balancer does not pin")
	}
}

// An aligned outbox's stamp adds the partitions header, in either style;
// the header is the relay's whenever sequence headers are on.
func TestSequenceStampPartitions(t *testing.T) {
	for _, tc := range []struct {
		style HeaderStyle
		key   string
	}{{EventHeaders, header.SeqPartitions}, {CloudEventsHeaders, header.CloudEventsSeqPartitions}} {
		st, err := newSequenceStamp(tc.style, "src", 1, 8)
		if err != nil {
			t.Fatal(err)
		}
		hs := st.apply([]kafka.Header{{Key: tc.key, Value: []byte("stale")}}, true, 3, 1)
		if v, n := headerOf(hs, tc.key); v != "8" || n != 1 {
			t.Errorf("style %d: %s = %q (%d times), want 8 once", tc.style, tc.key, v, n)
		}
		plain, _ := newSequenceStamp(tc.style, "src", 1, 0)
		if _, n := headerOf(plain.apply(nil, true, 3, 1), tc.key); n != 0 {
			t.Errorf("style %d: a stamp that is not aligned adds %s", tc.style, tc.key)
		}
		for _, style := range []HeaderStyle{EventHeaders, CloudEventsHeaders} {
			m := Message{Topic: "t", Headers: []kafka.Header{{Key: tc.key, Value: []byte("1")}}}
			if _, err := prepare(m, style, true, time.Now()); !errors.Is(err, inbox.ErrInvalidMessage) {
				t.Errorf("header %s in style %d with sequence headers on: %v, want a validation error", tc.key, style, err)
			}
		}
	}
}
