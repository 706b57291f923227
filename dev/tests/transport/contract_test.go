// Package transport_test is the real-broker suite of the transport
// contract (package transport), which every Client runs: franz-go's here,
// and kafka-go's once package consumer exports a constructor of it.
package transport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/transport"
)

// contract describes the Client under test.
type contract struct {
	// newClient returns a fresh Client for brokers; the suite closes it.
	newClient func(t *testing.T, brokers []string) transport.Client
	// cooperative: a rebalance revokes only the partitions that move
	// (franz-go); otherwise every partition (kafka-go).
	cooperative bool
}

// runContract runs the suite against a real broker, each test with its
// own topic and group.
func runContract(t *testing.T, c contract) {
	runContractOn(t, c, testservers.KafkaBrokers(t))
}

func runContractOn(t *testing.T, c contract, brokers []string) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c contract, k target)
	}{
		{"AssignedOffsets", testAssignedOffsets},
		{"FetchSetOffsetCaughtUp", testFetch},
		{"FetchBacklogInOrder", testFetchBacklog},
		{"CommitSeenByNextMember", testCommitSeenByNextMember},
		{"SecondMemberJoins", testSecondMemberJoins},
		{"OverWhenFenced", testOverWhenFenced},
		{"FunctionReturningRejoins", testFunctionReturningRejoins},
		{"RejectedSessionTimeout", testRejectedSessionTimeout},
		{"MissingTopicsCreatesNothing", testMissingTopics},
		{"DeadLetters", testDeadLetters},
	} {
		t.Run(tc.name, func(t *testing.T) {
			suffix := conformance.RandomSuffix()
			tc.run(t, c, target{brokers: brokers, topic: "transport-" + suffix, group: "transport-" + suffix})
		})
	}
}

func (c contract) client(t *testing.T, k target) transport.Client {
	t.Helper()
	cl := c.newClient(t, k.brokers)
	t.Cleanup(cl.Close)
	return cl
}

func (c contract) group(t *testing.T, cl transport.Client, cfg transport.GroupConfig) transport.Group {
	t.Helper()
	g, err := cl.Group(cfg)
	if err != nil {
		t.Fatalf("Group: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// testAssignedOffsets: a generation assigns each partition with the
// group's committed offset, or StartOffset where there is none.
func testAssignedOffsets(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 2)
	commitAs(t, k.brokers, k.group, k.topic, map[int]int64{0: 3})
	for _, start := range []int64{transport.FirstOffset, transport.LastOffset} {
		cfg := groupConfig(t, k)
		cfg.StartOffset = start
		g := c.group(t, c.client(t, k), cfg)
		gen := nextGen(t, g, 60*time.Second)
		got := partitionsOf(gen.Assigned(k.topic))
		want := map[int]int64{0: 3, 1: start}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("StartOffset %d: Assigned = %v, want %v", start, got, want)
		}
		if gen.MemberID() == "" {
			t.Error("the generation has no member id")
		}
		if len(gen.Assigned("other-topic")) != 0 {
			t.Error("a topic the group does not consume has assignments")
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// testFetch: Fetch returns the partition's messages in order with their
// fields, SetOffset moves it (back, and past the log end, where it waits),
// CaughtUp tells the last message, LogOffsets the log's bounds.
func testFetch(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 1)
	at := time.UnixMilli(time.Now().Add(-time.Hour).UnixMilli())
	msg := func(i int) kafka.Message {
		return kafka.Message{
			Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i),
			Headers: []kafka.Header{{Key: "h", Value: fmt.Appendf(nil, "%d", i)}}, Time: at.Add(time.Duration(i) * time.Millisecond),
		}
	}
	var first []kafka.Message
	for i := range 5 {
		first = append(first, msg(i))
	}
	produce(t, k.brokers, k.topic, first...)

	cl := c.client(t, k)
	g := c.group(t, cl, groupConfig(t, k))
	gen := nextGen(t, g, 60*time.Second)
	as := gen.Assigned(k.topic)
	if len(as) != 1 {
		t.Fatalf("Assigned = %v", as)
	}
	produced := make(chan struct{})
	waiting := make(chan struct{})
	done := make(chan error, 1)
	gen.Start(as[0], func(ctx context.Context, r transport.PartitionReader) {
		done <- func() error {
			fetch := func(d time.Duration) (kafka.Message, error) {
				fctx, cancel := context.WithTimeout(ctx, d)
				defer cancel()
				return r.Fetch(fctx)
			}
			if err := r.SetOffset(0); err != nil {
				return err
			}
			for i := range 5 {
				m, err := fetch(30 * time.Second)
				if err != nil {
					return fmt.Errorf("fetch %d: %w", i, err)
				}
				want := msg(i)
				if m.Offset != int64(i) || m.Topic != k.topic || m.Partition != 0 || !bytes.Equal(m.Key, want.Key) || !bytes.Equal(m.Value, want.Value) ||
					len(m.Headers) != 1 || m.Headers[0].Key != "h" || !bytes.Equal(m.Headers[0].Value, want.Headers[0].Value) || !m.Time.Equal(want.Time) {
					return fmt.Errorf("fetch %d returned %+v, want offset %d and %+v", i, m, i, want)
				}
				if caught := r.CaughtUp(); caught != (i == 4) {
					return fmt.Errorf("after offset %d of 0..4, CaughtUp = %v", i, caught)
				}
			}
			if err := r.SetOffset(2); err != nil {
				return err
			}
			if m, err := fetch(30 * time.Second); err != nil || m.Offset != 2 {
				return fmt.Errorf("after SetOffset(2): offset %d, %v", m.Offset, err)
			}
			// Past the log end (5): Fetch waits there, and returns the
			// message at 7 once it is produced, not those below it.
			if err := r.SetOffset(7); err != nil {
				return err
			}
			if m, err := fetch(time.Second); !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("past the log end, Fetch returned offset %d, %v; want it to wait", m.Offset, err)
			}
			close(waiting)
			<-produced
			if m, err := fetch(30 * time.Second); err != nil || m.Offset != 7 {
				return fmt.Errorf("after SetOffset(7) and 3 more messages: offset %d, %v", m.Offset, err)
			}
			if err := r.Close(); err != nil {
				return err
			}
			if err := r.SetOffset(0); err == nil {
				return errors.New("SetOffset on a closed reader did not fail")
			}
			return nil
		}()
		<-ctx.Done()
	})
	select {
	case <-waiting:
		produce(t, k.brokers, k.topic, msg(5), msg(6), msg(7))
		close(produced)
	case err := <-done:
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, end, err := cl.LogOffsets(ctx, k.topic, 0)
	if err != nil || start != 0 || end != 8 {
		t.Errorf("LogOffsets = %d, %d, %v; want 0, 8", start, end, err)
	}
}

// testFetchBacklog: a backlog larger than a reader buffers comes out
// whole and in order, read slowly (the client holds fetching back
// meanwhile) and after a move back.
func testFetchBacklog(t *testing.T, c contract, k target) {
	const n, size = 400, 10 << 10
	createTopic(t, k.brokers, k.topic, 1)
	var msgs []kafka.Message
	for range n {
		msgs = append(msgs, kafka.Message{Value: randomBytes(size)})
	}
	produce(t, k.brokers, k.topic, msgs...)
	g := c.group(t, c.client(t, k), groupConfig(t, k))
	gen := nextGen(t, g, 60*time.Second)
	done := make(chan error, 1)
	gen.Start(gen.Assigned(k.topic)[0], func(ctx context.Context, r transport.PartitionReader) {
		done <- func() error {
			if err := r.SetOffset(0); err != nil {
				return err
			}
			read := func(from, to int64) error {
				for want := from; want < to; want++ {
					fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					m, err := r.Fetch(fctx)
					cancel()
					if err != nil || m.Offset != want || !bytes.Equal(m.Value, msgs[want].Value) {
						return fmt.Errorf("fetch: offset %d (%v), want %d and its value", m.Offset, err, want)
					}
					if want == 10 {
						time.Sleep(time.Second)
					}
				}
				return nil
			}
			if err := read(0, 300); err != nil {
				return err
			}
			if err := r.SetOffset(100); err != nil {
				return err
			}
			return read(100, n)
		}()
		<-ctx.Done()
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// testCommitSeenByNextMember: a committed offset is the next member's
// Assigned offset; Close ends the function's context and waits for it.
func testCommitSeenByNextMember(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 1)
	g := c.group(t, c.client(t, k), groupConfig(t, k))
	gen := nextGen(t, g, 60*time.Second)
	committed := make(chan error, 1)
	var returned time.Time
	var cause error
	gen.Start(gen.Assigned(k.topic)[0], func(ctx context.Context, r transport.PartitionReader) {
		committed <- gen.Commit(k.topic, 0, 4)
		<-ctx.Done()
		cause = context.Cause(ctx)
		time.Sleep(200 * time.Millisecond)
		returned = time.Now()
	})
	if err := <-committed; err != nil {
		t.Fatalf("Commit: %v (Over: %v)", err, gen.Over(err))
	}
	if got := committedOf(t, k.brokers, k.group, k.topic, 0); got != 4 {
		t.Errorf("the group's committed offset is %d, want 4", got)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if returned.IsZero() {
		t.Fatal("Close returned before the function did")
	}
	if cause == nil {
		t.Error("the function's context ended without a cause")
	}
	g2 := c.group(t, c.client(t, k), groupConfig(t, k))
	gen2 := nextGen(t, g2, 60*time.Second)
	if got := partitionsOf(gen2.Assigned(k.topic)); got[0] != 4 {
		t.Errorf("the next member's Assigned = %v, want partition 0 at 4", got)
	}
}

// fnRecord is what one partition's function saw.
type fnRecord struct {
	ended, returned time.Time
	cause           error
	commitErr       error
}

// testSecondMemberJoins: a second member joins; the partitions moved to it
// had their functions ended, and returned after committing on the way
// out, before the second member got them (it sees their commits); under
// cooperative rebalancing the first member's kept partitions run on.
func testSecondMemberJoins(t *testing.T, c contract, k target) {
	const partitions = 4
	createTopic(t, k.brokers, k.topic, partitions)
	ga := c.group(t, c.client(t, k), groupConfig(t, k))
	genA := nextGen(t, ga, 60*time.Second)
	if got := len(genA.Assigned(k.topic)); got != partitions {
		t.Fatalf("the first member got %d partitions, want %d", got, partitions)
	}
	var mu sync.Mutex
	recs := map[int]*fnRecord{}
	for _, a := range genA.Assigned(k.topic) {
		rec := &fnRecord{}
		recs[a.Partition] = rec
		genA.Start(a, func(ctx context.Context, r transport.PartitionReader) {
			<-ctx.Done()
			mu.Lock()
			rec.ended, rec.cause = time.Now(), context.Cause(ctx)
			mu.Unlock()
			// The way out takes a while, and commits last.
			time.Sleep(time.Second)
			err := genA.Commit(k.topic, a.Partition, 7)
			mu.Lock()
			rec.commitErr, rec.returned = err, time.Now()
			mu.Unlock()
		})
	}
	// Let the first member's functions start.
	time.Sleep(500 * time.Millisecond)

	gb := c.group(t, c.client(t, k), groupConfig(t, k))
	genB := nextGen(t, gb, 90*time.Second)
	gotB := time.Now()
	moved := partitionsOf(genB.Assigned(k.topic))
	if len(moved) == 0 || len(moved) == partitions {
		t.Fatalf("the second member got %v of %d partitions", moved, partitions)
	}
	if genB.ID() <= genA.ID() {
		t.Errorf("the second member's generation %d is not above the first's %d", genB.ID(), genA.ID())
	}
	// Kept partitions must not end later either.
	time.Sleep(2 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	for p, rec := range recs {
		off, isMoved := moved[p]
		switch {
		case isMoved:
			if rec.ended.IsZero() || rec.returned.IsZero() {
				t.Errorf("partition %d moved to the second member while the first one's function still ran (ended %v, returned %v)", p, !rec.ended.IsZero(), !rec.returned.IsZero())
				continue
			}
			if rec.returned.After(gotB) {
				t.Errorf("partition %d: the first member's function returned %s after the second member got it", p, rec.returned.Sub(gotB))
			}
			if rec.commitErr != nil {
				t.Errorf("partition %d: the commit on the way out failed: %v", p, rec.commitErr)
			}
			if off != 7 {
				t.Errorf("partition %d: the second member's Assigned offset is %d, want 7, the first member's last commit", p, off)
			}
			if rec.cause == nil {
				t.Errorf("partition %d: its context ended without a cause", p)
			}
		case c.cooperative:
			if !rec.ended.IsZero() {
				t.Errorf("partition %d stayed with the first member, yet its function's context ended (%v)", p, rec.cause)
			}
		}
	}
	t.Logf("moved %v; generations %d then %d", moved, genA.ID(), genB.ID())
}

// testOverWhenFenced: a member the coordinator removed (as it does one
// whose session expired) finds out from its next commit, which fails with
// an error Over reports; its function's context ends, and once it
// returned the member joins again, under a larger generation.
func testOverWhenFenced(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 1)
	g := c.group(t, c.client(t, k), groupConfig(t, k))
	gen := nextGen(t, g, 60*time.Second)
	removed := make(chan struct{})
	type result struct {
		err   error
		over  bool
		cause error
	}
	results := make(chan result, 1)
	gen.Start(gen.Assigned(k.topic)[0], func(ctx context.Context, r transport.PartitionReader) {
		<-removed
		err := gen.Commit(k.topic, 0, 5)
		<-ctx.Done()
		results <- result{err, err != nil && gen.Over(err), context.Cause(ctx)}
	})
	removeMember(t, k.brokers, k.group, gen.MemberID())
	close(removed)
	var res result
	select {
	case res = <-results:
	case <-time.After(60 * time.Second):
		t.Fatal("the removed member's function was not ended")
	}
	if res.err == nil || !res.over {
		t.Errorf("the removed member's commit returned %v, Over %v; want an error Over reports", res.err, res.over)
	}
	if res.cause == nil {
		t.Error("the function's context ended without a cause")
	}
	if got := committedOf(t, k.brokers, k.group, k.topic, 0); got == 5 {
		t.Error("the removed member's commit was taken")
	}
	gen2 := nextGen(t, g, 60*time.Second)
	if got := partitionsOf(gen2.Assigned(k.topic)); len(got) != 1 {
		t.Errorf("after joining again the member got %v", got)
	}
	if gen2.ID() <= gen.ID() {
		t.Errorf("the generation after the removal is %d, not above %d", gen2.ID(), gen.ID())
	}
}

// testFunctionReturningRejoins: a function that returns while its
// partition is still assigned makes the member rejoin, and the partition
// is handed out again.
func testFunctionReturningRejoins(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 1)
	g := c.group(t, c.client(t, k), groupConfig(t, k))
	gen := nextGen(t, g, 60*time.Second)
	gen.Start(gen.Assigned(k.topic)[0], func(ctx context.Context, r transport.PartitionReader) {})
	gen2 := nextGen(t, g, 60*time.Second)
	if got := partitionsOf(gen2.Assigned(k.topic)); len(got) != 1 {
		t.Fatalf("after the function returned, the next generation assigns %v", got)
	}
	if gen2.ID() < gen.ID() {
		t.Errorf("the generation went back from %d to %d", gen.ID(), gen2.ID())
	}
	done := make(chan error, 1)
	gen2.Start(gen2.Assigned(k.topic)[0], func(ctx context.Context, r transport.PartitionReader) {
		done <- gen2.Commit(k.topic, 0, 1)
		<-ctx.Done()
	})
	if err := <-done; err != nil {
		t.Errorf("the partition started again cannot commit: %v", err)
	}
}

// testRejectedSessionTimeout: the coordinator refusing the session
// timeout (below group.min.session.timeout.ms) is an error of Next that
// Rejected reports.
func testRejectedSessionTimeout(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 1)
	cfg := groupConfig(t, k)
	// The broker here allows 1 s and up.
	cfg.SessionTimeout, cfg.HeartbeatInterval = 500*time.Millisecond, 100*time.Millisecond
	g := c.group(t, c.client(t, k), cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		gen, err := g.Next(ctx)
		if err == nil {
			t.Fatalf("joined with a 500 ms session timeout: %v", gen.Assigned(k.topic))
		}
		if g.Rejected(err) {
			if !errors.Is(err, kafka.InvalidSessionTimeout) && !strings.Contains(err.Error(), "INVALID_SESSION_TIMEOUT") {
				t.Errorf("Rejected error %v does not name the session timeout", err)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("Next never returned a Rejected error; last: %v", err)
		}
	}
}

// testMissingTopics: MissingTopics names the unknown topics and creates
// none (the broker here has auto.create.topics.enable).
func testMissingTopics(t *testing.T, c contract, k target) {
	createTopic(t, k.brokers, k.topic, 1)
	cl := c.client(t, k)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	absent := k.topic + "-absent"
	for i := range 2 {
		missing, err := cl.MissingTopics(ctx, []string{k.topic, absent})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(missing, []string{absent}) {
			t.Fatalf("call %d: MissingTopics = %v, want [%s]", i, missing, absent)
		}
		// A topic created by the first call would show by now.
		time.Sleep(2 * time.Second)
	}
}

// testDeadLetters: the dead-letter writer keeps kafka.Hash's partition
// of each key, the headers, and takes a message of MaxDeadLetterBytes;
// a message the broker refuses comes back as a kafka.Error.
func testDeadLetters(t *testing.T, c contract, k target) {
	const partitions = 3
	createTopic(t, k.brokers, k.topic, partitions, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: fmt.Sprint(transport.MaxDeadLetterBytes + 1<<20)})
	small := k.topic + "-small"
	createTopic(t, k.brokers, small, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "2000"})
	cl := c.client(t, k)
	w := cl.DeadLetterWriter()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var msgs []kafka.Message
	for i := range 30 {
		msgs = append(msgs, kafka.Message{Topic: k.topic, Key: fmt.Appendf(nil, "key-%d", i), Value: []byte("v"),
			Headers: []kafka.Header{{Key: "dlq", Value: fmt.Appendf(nil, "%d", i)}}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("WriteMessages: %v", err)
	}
	// Random bytes: a compressing producer would shrink repeated ones below
	// the limits.
	big := kafka.Message{Topic: k.topic, Key: []byte("big"), Value: randomBytes(transport.MaxFetchBytes)}
	if err := w.WriteMessages(ctx, big); err != nil {
		t.Errorf("WriteMessages of a %d-byte message: %v", len(big.Value), err)
	}
	err := w.WriteMessages(ctx, kafka.Message{Topic: small, Key: []byte("k"), Value: randomBytes(5000)})
	var ke kafka.Error
	if !errors.As(err, &ke) || !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Errorf("a message over the topic's max.message.bytes: %v (%T), want kafka.MessageSizeTooLarge", err, err)
	}

	hash := &kafka.Hash{}
	ids := []int{0, 1, 2}
	want := map[int]int{}
	for _, m := range append(msgs, big) {
		want[hash.Balance(m, ids...)]++
	}
	for p := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Topic: k.topic, Partition: p, MaxWait: 100 * time.Millisecond, MaxBytes: transport.MaxDeadLetterBytes})
		for range want[p] {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatalf("partition %d: read: %v (kafka.Hash puts %d of the dead letters there)", p, err, want[p])
			}
			if w := hash.Balance(m, ids...); w != p {
				t.Errorf("key %s landed on partition %d; kafka.Hash picks %d", m.Key, p, w)
			}
			if string(m.Key) != "big" && (len(m.Headers) != 1 || m.Headers[0].Key != "dlq") {
				t.Errorf("key %s lost its headers: %v", m.Key, m.Headers)
			}
		}
		_ = r.Close()
	}
}
