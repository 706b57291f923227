package memtransport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/transport"
)

func newCluster(t *testing.T, topics map[string]int) *Cluster {
	t.Helper()
	c := NewCluster()
	for topic, n := range topics {
		if err := c.CreateTopic(topic, n); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func msg(key, value string) kafka.Message {
	return kafka.Message{Key: []byte(key), Value: []byte(value), Headers: []kafka.Header{{Key: "h", Value: []byte(value)}}}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestProducePartitionsByMurmur2(t *testing.T) {
	c := newCluster(t, map[string]int{"orders": 4})
	var want [4][]string
	for i := range 20 {
		k := fmt.Sprintf("key-%d", i)
		p := kafka.Murmur2Balancer{}.Balance(msg(k, ""), 0, 1, 2, 3)
		want[p] = append(want[p], k)
		if err := c.Produce("orders", msg(k, k)); err != nil {
			t.Fatal(err)
		}
	}
	var got [4][]string
	for _, m := range c.Messages("orders") {
		if m.Topic != "orders" || m.Offset != int64(len(got[m.Partition])) || m.Time.IsZero() {
			t.Errorf("message %s at %s/%d/%d, time %v", m.Key, m.Topic, m.Partition, m.Offset, m.Time)
		}
		got[m.Partition] = append(got[m.Partition], string(m.Key))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("partitions %q, want murmur2's %q", got, want)
	}
	if err := c.Produce("payments", msg("a", "1")); !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Errorf("Produce to a missing topic: %v", err)
	}
	if err := c.ProduceTo("orders", 4, msg("a", "1")); !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Errorf("ProduceTo a missing partition: %v", err)
	}
	if err := c.CreateTopic("orders", 1); !errors.Is(err, kafka.TopicAlreadyExists) {
		t.Errorf("CreateTopic of an existing topic: %v", err)
	}
	if err := c.CreateTopic("empty", 0); err == nil {
		t.Error("CreateTopic with no partitions succeeded")
	}
}

// A reader fetches in offset order from the offset set, waits for what is
// not produced yet, says when it caught up, and moves on to the log start
// past deleted records.
func TestFetchOrder(t *testing.T) {
	c := newCluster(t, map[string]int{"orders": 1})
	if err := c.ProduceTo("orders", 0, msg("a", "0"), msg("b", "1"), msg("c", "2")); err != nil {
		t.Fatal(err)
	}
	r := &reader{c: c, topic: "orders", partition: 0, pos: -1}
	ctx := ctxT(t)
	if err := r.SetOffset(1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int64{1, 2} {
		m, err := r.Fetch(ctx)
		if err != nil || m.Offset != want || string(m.Value) != fmt.Sprint(want) {
			t.Fatalf("fetched %d %q, %v; want offset %d", m.Offset, m.Value, err, want)
		}
		if r.CaughtUp() != (want == 2) {
			t.Errorf("offset %d: caught up %v", want, r.CaughtUp())
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := r.Fetch(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a fetch at the log end returned %v, want it to wait", err)
	}
	got := make(chan kafka.Message, 1)
	go func() {
		m, err := r.Fetch(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- m
	}()
	time.Sleep(10 * time.Millisecond)
	if err := c.ProduceTo("orders", 0, msg("d", "3")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, got, "the waiting fetch"); m.Offset != 3 {
		t.Errorf("the waiting fetch returned offset %d, want 3", m.Offset)
	}
	if err := c.DeleteRecords("orders", 0, 3); err != nil {
		t.Fatal(err)
	}
	if err := r.SetOffset(0); err != nil {
		t.Fatal(err)
	}
	m, err := r.Fetch(ctx)
	if err != nil || m.Offset != 3 {
		t.Errorf("a fetch below the log start returned offset %d, %v; want the log start 3", m.Offset, err)
	}
	if start, end, err := c.Client(Eager).LogOffsets(ctx, "orders", 0); start != 3 || end != 4 || err != nil {
		t.Errorf("log offsets %d..%d, %v; want 3..4", start, end, err)
	}
	m.Headers[0].Key = "changed"
	if h := c.Messages("orders")[0].Headers[0].Key; h != "h" {
		t.Errorf("a fetched message's headers are the log's: %q", h)
	}
	r.Close()
	if _, err := r.Fetch(ctx); err == nil {
		t.Error("a closed reader fetched")
	}
}

// run is a partition's function in a test: it records what it fetched,
// commits each message, and returns when its context ends.
type run struct {
	gen     transport.Generation
	fetched chan kafka.Message
	ended   chan error // the context's cause
}

func start(t *testing.T, gen transport.Generation, a transport.Assignment) *run {
	t.Helper()
	rn := &run{gen: gen, fetched: make(chan kafka.Message, 10), ended: make(chan error, 1)}
	gen.Start(a, func(ctx context.Context, r transport.PartitionReader) {
		if a.Offset >= 0 {
			if err := r.SetOffset(a.Offset); err != nil {
				t.Error(err)
			}
		} else if err := r.SetOffset(0); err != nil {
			t.Error(err)
		}
		for {
			m, err := r.Fetch(ctx)
			if err != nil {
				rn.ended <- context.Cause(ctx)
				return
			}
			if err := gen.Commit(m.Topic, m.Partition, m.Offset+1); err != nil {
				t.Errorf("commit of %d: %v", m.Offset, err)
			}
			rn.fetched <- m
		}
	})
	return rn
}

// recv returns the next value of ch, failing the test after 5 s.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

func partitions(as []transport.Assignment) []int {
	var ps []int
	for _, a := range as {
		ps = append(ps, a.Partition)
	}
	return ps
}

func groupOf(t *testing.T, c *Cluster, mode Rebalancing, id string) transport.Group {
	t.Helper()
	g, err := c.Client(mode).Group(transport.GroupConfig{GroupID: id, Topics: []string{"orders"}, StartOffset: transport.FirstOffset})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Eager: every rebalance ends every partition's function, Next waits for
// them, and the next generation lists every partition the member keeps,
// at the group's committed offsets; the old generation's commits are
// refused.
func TestEagerRebalance(t *testing.T) {
	c := newCluster(t, map[string]int{"orders": 2})
	ctx := ctxT(t)
	g := groupOf(t, c, Eager, "inventory")
	defer g.Close()
	gen1, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	as := gen1.Assigned("orders")
	if !slices.Equal(partitions(as), []int{0, 1}) || as[0].Offset != transport.FirstOffset || gen1.ID() != 1 || c.Generation("inventory") != 1 {
		t.Fatalf("generation %d assigned %+v", gen1.ID(), as)
	}
	r0, r1 := start(t, gen1, as[0]), start(t, gen1, as[1])
	if err := c.ProduceTo("orders", 0, msg("a", "1")); err != nil {
		t.Fatal(err)
	}
	recv(t, r0.fetched, "partition 0's message")
	if next, ok := c.Committed("inventory", "orders", 0); !ok || next != 1 {
		t.Errorf("committed %d (%v), want 1", next, ok)
	}
	c.Rebalance("inventory", map[string][]int{"orders": {1}})
	if cause0, cause1 := recv(t, r0.ended, "partition 0's end"), recv(t, r1.ended, "partition 1's end"); !errors.Is(cause0, errRebalance) || !errors.Is(cause1, errRebalance) {
		t.Errorf("the functions ended by %v and %v, want the rebalance", cause0, cause1)
	}
	gen2, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ps := partitions(gen2.Assigned("orders")); !slices.Equal(ps, []int{1}) || gen2.ID() != 2 {
		t.Errorf("generation %d assigned %v, want partition 1 only", gen2.ID(), ps)
	}
	if err := gen1.Commit("orders", 0, 1); !gen1.Over(err) {
		t.Errorf("a commit through the ended generation returned %v, want one Over recognises", err)
	}
	c.Rebalance("inventory", nil)
	gen3, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if as := gen3.Assigned("orders"); !slices.Equal(partitions(as), []int{0, 1}) || as[0].Offset != 1 {
		t.Errorf("generation 3 assigned %+v, want both partitions, 0 at its committed offset 1", as)
	}
}

// Cooperative: a rebalance ends only the revoked partitions' functions,
// and the next generation lists only the partitions new to the member;
// the kept partition runs on, committing through the generation that
// started it.
func TestCooperativeRebalance(t *testing.T) {
	c := newCluster(t, map[string]int{"orders": 2})
	ctx := ctxT(t)
	g := groupOf(t, c, Cooperative, "inventory")
	gen1, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	as := gen1.Assigned("orders")
	if !slices.Equal(partitions(as), []int{0, 1}) {
		t.Fatalf("assigned %+v", as)
	}
	r0, r1 := start(t, gen1, as[0]), start(t, gen1, as[1])
	c.Rebalance("inventory", map[string][]int{"orders": {0}})
	gen2, err := g.Next(ctx) // returns once partition 1's function did
	if err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-r1.ended:
		if !errors.Is(cause, errRevoked) {
			t.Errorf("partition 1 ended by %v, want its revocation", cause)
		}
	default:
		t.Error("the next generation came before the revoked partition's function returned")
	}
	if ps := gen2.Assigned("orders"); len(ps) != 0 {
		t.Errorf("generation 2 assigned %+v, want nothing new", ps)
	}
	if err := c.ProduceTo("orders", 0, msg("a", "1")); err != nil {
		t.Fatal(err)
	}
	recv(t, r0.fetched, "the kept partition's message") // the kept partition runs on, its commit through generation 1 accepted
	if next, _ := c.Committed("inventory", "orders", 0); next != 1 {
		t.Errorf("partition 0 committed to %d, want 1", next)
	}
	c.Rebalance("inventory", nil)
	gen3, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ps := partitions(gen3.Assigned("orders")); !slices.Equal(ps, []int{1}) {
		t.Errorf("generation 3 assigned %v, want partition 1 back only", ps)
	}
	select {
	case cause := <-r0.ended:
		t.Errorf("the kept partition ended: %v", cause)
	default:
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if cause := recv(t, r0.ended, "partition 0's end"); !errors.Is(cause, errGroupClosed) {
		t.Errorf("partition 0 ended by %v, want the group's close", cause)
	}
	if err := gen1.Commit("orders", 0, 1); !gen1.Over(err) {
		t.Errorf("a commit after Close returned %v, want one Over recognises", err)
	}
}

// A partition's function that returns on its own makes the member rejoin:
// eager, the generation ends; cooperative, the next generation lists the
// partition again.
func TestReturnRejoins(t *testing.T) {
	for _, mode := range []Rebalancing{Eager, Cooperative} {
		t.Run(map[Rebalancing]string{Eager: "eager", Cooperative: "cooperative"}[mode], func(t *testing.T) {
			c := newCluster(t, map[string]int{"orders": 2})
			ctx := ctxT(t)
			g := groupOf(t, c, mode, "inventory")
			defer g.Close()
			gen1, err := g.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			as := gen1.Assigned("orders")
			gen1.Start(as[0], func(context.Context, transport.PartitionReader) {})
			r1 := start(t, gen1, as[1])
			gen2, err := g.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := []int{0}
			if mode == Eager {
				want = []int{0, 1}
				if cause := recv(t, r1.ended, "partition 1's end"); !errors.Is(cause, errReturned) {
					t.Errorf("partition 1 ended by %v, want partition 0's return", cause)
				}
			}
			if ps := partitions(gen2.Assigned("orders")); !slices.Equal(ps, want) {
				t.Errorf("assigned %v after the return, want %v", ps, want)
			}
		})
	}
}

// Groups have committed offsets of their own; a group has one member; a
// session timeout outside the broker's bounds is refused for good.
func TestGroups(t *testing.T) {
	c := newCluster(t, map[string]int{"orders": 1})
	ctx := ctxT(t)
	c.SetCommitted("billing", "orders", 0, 7)
	g := groupOf(t, c, Eager, "inventory")
	gen, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if as := gen.Assigned("orders"); as[0].Offset != transport.FirstOffset {
		t.Errorf("inventory starts at %d, want FirstOffset: billing's offset is billing's", as[0].Offset)
	}
	other := groupOf(t, c, Eager, "inventory")
	if _, err := other.Next(ctx); !other.Rejected(err) {
		t.Errorf("a second member's join returned %v, want it rejected", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Next(ctx); err != nil {
		t.Errorf("a member's join after the first left: %v", err)
	}
	other.Close()
	billing, err := c.Client(Eager).Group(transport.GroupConfig{GroupID: "billing", Topics: []string{"orders"}, SessionTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := billing.Next(ctx); !billing.Rejected(err) || !errors.Is(err, kafka.InvalidSessionTimeout) {
		t.Errorf("a join with a 1 s session timeout returned %v, want it rejected", err)
	}
	if err := c.DeleteTopic("orders"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Committed("billing", "orders", 0); ok {
		t.Error("a deleted topic's committed offset is kept")
	}
}

// Fail makes the next calls of an operation fail, in order; the
// dead-letter writer partitions by kafka.Hash.
func TestFailAndDeadLetters(t *testing.T) {
	c := newCluster(t, map[string]int{"orders": 1, "orders.dlq": 3})
	ctx := ctxT(t)
	cl := c.Client(Eager)
	w := cl.DeadLetterWriter()
	c.Fail(OpDeadLetter, kafka.LeaderNotAvailable, kafka.MessageSizeTooLarge)
	dead := kafka.Message{Topic: "orders.dlq", Key: []byte("order-7"), Value: []byte("x")}
	for _, want := range []error{kafka.LeaderNotAvailable, kafka.MessageSizeTooLarge, nil} {
		if err := w.WriteMessages(ctx, dead); !errors.Is(err, want) {
			t.Errorf("write returned %v, want %v", err, want)
		}
	}
	got := c.Messages("orders.dlq")
	if want := (&kafka.Hash{}).Balance(dead, 0, 1, 2); len(got) != 1 || got[0].Partition != want {
		t.Errorf("dead letters %+v, want one in partition %d (kafka.Hash)", got, want)
	}
	if err := w.WriteMessages(ctx, kafka.Message{Topic: "missing"}); !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Errorf("a write to a missing topic returned %v", err)
	}

	g := groupOf(t, c, Eager, "inventory")
	defer g.Close()
	c.Fail(OpJoin, kafka.RebalanceInProgress)
	if _, err := g.Next(ctx); !errors.Is(err, kafka.RebalanceInProgress) || g.Rejected(err) {
		t.Errorf("join returned %v, want a retriable RebalanceInProgress", err)
	}
	gen, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Fail(OpCommit, kafka.RequestTimedOut)
	if err := gen.Commit("orders", 0, 1); !errors.Is(err, kafka.RequestTimedOut) || gen.Over(err) {
		t.Errorf("commit returned %v, want RequestTimedOut, not Over", err)
	}
	if err := gen.Commit("orders", 0, 1); err != nil {
		t.Errorf("the next commit returned %v", err)
	}
	c.Fail(OpFetch, kafka.NotLeaderForPartition)
	r := &reader{c: c, topic: "orders", partition: 0, pos: -1}
	if _, err := r.Fetch(ctx); !errors.Is(err, kafka.NotLeaderForPartition) {
		t.Errorf("fetch returned %v", err)
	}
	if missing, err := cl.MissingTopics(ctx, []string{"orders", "payments"}); err != nil || !slices.Equal(missing, []string{"payments"}) {
		t.Errorf("missing topics %v, %v", missing, err)
	}
}
