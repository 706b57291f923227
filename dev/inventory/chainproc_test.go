package inventory

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
)

// sink is a relayPublisher that records what it was given, and fails the
// messages whose value is in fail.
type sink struct {
	got  []kafka.Message
	fail map[string]bool
}

func (s *sink) Publish(context.Context, []kafka.Message) error  { return errors.New("not pinned") }
func (s *sink) Partitions(context.Context, string) (int, error) { return 3, nil }
func (s *sink) Limits() (int, int)                              { return 100, 1 << 20 }

// The wrappers under test never read the partitions back.
func (s *sink) EndOffsets(context.Context, string, []int) (map[int]int64, error) {
	return nil, errors.New("not read")
}

func (s *sink) ReadPartition(context.Context, string, int, int64, int64, func(kafka.Message) error) (int64, error) {
	return 0, errors.New("not read")
}

func (s *sink) PublishPinned(_ context.Context, msgs []kafka.Message, _ []int, _ int) error {
	s.got = append(s.got, msgs...)
	var errs kafka.WriteErrors
	for i, m := range msgs {
		if s.fail[string(m.Value)] {
			if errs == nil {
				errs = make(kafka.WriteErrors, len(msgs))
			}
			errs[i] = errors.New("refused")
		}
	}
	if errs != nil {
		return errs
	}
	return nil
}

func stamped(shard, seq int) kafka.Message {
	v := strconv.Itoa(shard) + "/" + strconv.Itoa(seq)
	return kafka.Message{Value: []byte(v), Headers: []kafka.Header{
		{Key: header.EventID, Value: []byte("ev-" + v)},
		{Key: header.SeqShard, Value: []byte(strconv.Itoa(shard))},
		{Key: header.Seq, Value: []byte(strconv.Itoa(seq))},
	}}
}

func values(msgs []kafka.Message) string {
	var s []string
	for _, m := range msgs {
		s = append(s, string(m.Value))
	}
	return strings.Join(s, " ")
}

// The relay must see the dropped message as published, and every other
// message's own result at its own index.
func TestDroppingPublisher(t *testing.T) {
	ctx := context.Background()
	in := &sink{fail: map[string]bool{"2/4": true}}
	var out bytes.Buffer
	p := &droppingPublisher{relayPublisher: in, at: SeqPos{Shard: 1, Seq: 5}, out: &out}
	msgs := []kafka.Message{stamped(1, 4), stamped(1, 5), stamped(2, 4), stamped(1, 6)}
	err := p.PublishPinned(ctx, msgs, []int{1, 1, 2, 1}, 3)
	var perMessage kafka.WriteErrors
	if !errors.As(err, &perMessage) || len(perMessage) != len(msgs) {
		t.Fatalf("error %v, want a WriteErrors of %d entries", err, len(msgs))
	}
	for i, want := range []bool{false, false, true, false} {
		if (perMessage[i] != nil) != want {
			t.Errorf("message %d (%s): error %v, failed want %v", i, msgs[i].Value, perMessage[i], want)
		}
	}
	if got := values(in.got); got != "1/4 2/4 1/6" {
		t.Errorf("sent %q, want every message but 1/5", got)
	}
	if !strings.HasPrefix(out.String(), InjectedDrop) || !strings.Contains(out.String(), "ev-1/5") {
		t.Errorf("output %q, want the %s line naming the event", out.String(), InjectedDrop)
	}
	// A copy of the message in a later cycle is dropped too, and the
	// line is not written again.
	out.Reset()
	in.got = nil
	if err := p.PublishPinned(ctx, []kafka.Message{stamped(1, 5)}, []int{1}, 3); err != nil || len(in.got) != 0 || out.Len() != 0 {
		t.Errorf("copy: error %v, sent %q, output %q; want nil, nothing, nothing", err, values(in.got), out.String())
	}
	if err := p.PublishPinned(ctx, []kafka.Message{stamped(1, 7)}, []int{1}, 3); err != nil || values(in.got) != "1/7" {
		t.Errorf("another message: error %v, sent %q", err, values(in.got))
	}
}

// The event log keeps a stop's fields whatever its texts hold, and tells
// the outcomes' dedup paths apart.
func TestStopLineRoundTrip(t *testing.T) {
	e := hooks.Event{Kind: hooks.PartitionStopped, Topic: "orders", Partition: 2, Offset: 17, Err: &consumer.PartitionStoppedError{
		Topic: "orders", Partition: 2, Offset: 17, EventID: "ev\t1", Reason: consumer.ReasonSequenceGap,
		Err: errors.New("sequence gap in source \"s\" epoch 1 shard 2:\ngot 19, expected 18"),
	}}
	var b bytes.Buffer
	logOutcome(&b)(e)
	logOutcome(&b)(hooks.Event{Kind: hooks.Processed, Sequenced: true})
	logOutcome(&b)(hooks.Event{Kind: hooks.Duplicate})
	path := t.TempDir() + "/events.log"
	// The last line is one a killed process cut short.
	if err := os.WriteFile(path, []byte(b.String()+"STOP\tcut"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := CountOutcomes(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Stop{Reason: consumer.ReasonSequenceGap, Topic: "orders", Partition: 2, Offset: 17, EventID: "ev 1", Err: "sequence gap in source \"s\" epoch 1 shard 2: got 19, expected 18"}
	if len(o.Stops) != 1 || o.Stops[0] != want {
		t.Errorf("stops %+v, want [%+v]", o.Stops, want)
	}
	if o.Processed != 1 || o.WatermarkProcessed != 1 || o.Duplicates != 1 || o.WatermarkDuplicates != 0 {
		t.Errorf("outcomes %+v, want 1 processed by watermark, 1 duplicate by inbox row", o)
	}
}
