package outbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/header"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

func headerOf(hs []kafka.Header, key string) (string, int) {
	val, n := "", 0
	for _, h := range hs {
		if h.Key == key {
			val, n = string(h.Value), n+1
		}
	}
	return val, n
}

func TestPrepareSetsHeaders(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	at := time.Date(2026, 11, 30, 23, 59, 59, 5, time.FixedZone("x", 3600))
	cases := []struct {
		name          string
		m             Message
		style         HeaderStyle
		wantID        string
		wantTime      string
		idKey, timeAt string
	}{
		{"given id and time", Message{Topic: "t", ID: "e1", Time: at}, EventHeaders, "e1", "2026-11-30T22:59:59.000000005Z", header.EventID, header.EventTime},
		{"cloudevents", Message{Topic: "t", ID: "e1", Time: at}, CloudEventsHeaders, "e1", "2026-11-30T22:59:59.000000005Z", header.CloudEventsID, header.CloudEventsTime},
		{"id from the caller's header", Message{Topic: "t", Headers: []kafka.Header{{Key: header.EventID, Value: []byte("h1")}}}, EventHeaders, "h1", now.Format(time.RFC3339Nano), header.EventID, header.EventTime},
		{"same id in header and field", Message{Topic: "t", ID: "h1", Headers: []kafka.Header{{Key: header.EventID, Value: []byte("h1")}}}, EventHeaders, "h1", now.Format(time.RFC3339Nano), header.EventID, header.EventTime},
		{"time from the caller's ce_time", Message{Topic: "t", ID: "e", Headers: []kafka.Header{{Key: header.CloudEventsTime, Value: []byte("2026-01-02T03:04:05+01:00")}}}, EventHeaders, "e", "2026-01-02T03:04:05+01:00", header.EventID, header.EventTime},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := prepare(tc.m, tc.style, false, now)
			if err != nil {
				t.Fatal(err)
			}
			if p.id != tc.wantID {
				t.Errorf("id %q, want %q", p.id, tc.wantID)
			}
			if v, n := headerOf(p.headers, tc.idKey); v != tc.wantID || n != 1 {
				t.Errorf("header %s = %q (%d times), want %q once", tc.idKey, v, n, tc.wantID)
			}
			if v, n := headerOf(p.headers, tc.timeAt); n != 1 {
				t.Errorf("header %s present %d times", tc.timeAt, n)
			} else if got, _ := time.Parse(time.RFC3339Nano, v); !got.Equal(mustTime(t, tc.wantTime)) {
				t.Errorf("header %s = %q, want %q", tc.timeAt, v, tc.wantTime)
			}
		})
	}
}

func mustTime(t *testing.T, s string) time.Time {
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func TestPrepareGeneratesUUIDv7FromEventTime(t *testing.T) {
	at := time.Date(2026, 12, 1, 3, 4, 5, 678_000_000, time.UTC)
	p, err := prepare(Message{Topic: "t", Time: at}, EventHeaders, false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(p.id) != 36 || p.id[14] != '7' || !strings.ContainsAny(p.id[19:20], "89ab") {
		t.Fatalf("id %q is not a UUIDv7", p.id)
	}
	hexTime := strings.ReplaceAll(p.id[:13], "-", "")
	var ms int64
	for _, c := range hexTime {
		ms = ms*16 + int64(strings.IndexRune("0123456789abcdef", c))
	}
	if ms != at.UnixMilli() {
		t.Fatalf("id %q carries %d ms, want %d", p.id, ms, at.UnixMilli())
	}
	if q, _ := prepare(Message{Topic: "t", Time: at}, EventHeaders, false, time.Now()); q.id == p.id {
		t.Fatal("two generated ids are equal")
	}
}

func TestPrepareRefuses(t *testing.T) {
	cases := map[string]Message{
		"empty topic":             {},
		"topic with a space":      {Topic: "a b"},
		"topic too long":          {Topic: strings.Repeat("t", maxTopicBytes+1)},
		"dot topic":               {Topic: ".."},
		"empty header name":       {Topic: "t", Headers: []kafka.Header{{Key: ""}}},
		"header name not UTF-8":   {Topic: "t", Headers: []kafka.Header{{Key: "\xff"}}},
		"conflicting event_id":    {Topic: "t", ID: "a", Headers: []kafka.Header{{Key: header.EventID, Value: []byte("b")}}},
		"conflicting ce_id":       {Topic: "t", Headers: []kafka.Header{{Key: header.EventID, Value: []byte("a")}, {Key: header.CloudEventsID, Value: []byte("b")}}},
		"conflicting event_time":  {Topic: "t", Time: time.Unix(1e9, 0), Headers: []kafka.Header{{Key: header.EventTime, Value: []byte("2020-01-01T00:00:00Z")}}},
		"unreadable event_time":   {Topic: "t", Headers: []kafka.Header{{Key: header.EventTime, Value: []byte("now")}}},
		"event time before 1970":  {Topic: "t", Time: time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC)},
		"id too long":             {Topic: "t", ID: strings.Repeat("i", storage.MaxEventIDBytes+1)},
		"id with NUL":             {Topic: "t", ID: "a\x00"},
		"message over the writer": {Topic: "t", Value: make([]byte, maxMessageBytes-20)},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := prepare(m, EventHeaders, false, time.Now())
			var ve *inbox.ValidationError
			if !errors.Is(err, inbox.ErrInvalidMessage) || !errors.As(err, &ve) {
				t.Fatalf("prepare: %v, want a *inbox.ValidationError", err)
			}
		})
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	in := []kafka.Header{{Key: "a", Value: []byte{0, 255}}, {Key: "a", Value: nil}, {Key: "ü", Value: []byte("x")}}
	b, err := encodeHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeHeaders(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || string(out[0].Value) != "\x00\xff" || out[2].Key != "ü" || len(out[1].Value) != 0 {
		t.Fatalf("round trip gave %+v", out)
	}
	if _, err := decodeHeaders([]byte("{")); err == nil {
		t.Fatal("garbage decoded")
	}
}

func TestMarksOf(t *testing.T) {
	rows := []storage.OutboxRow{{Shard: 1, Seq: 5}, {Shard: 1, Seq: 6}, {Shard: 1, Seq: 7}, {Shard: 2, Seq: 1}, {Shard: 2, Seq: 2}, {Shard: 3, Seq: 9}}
	if got := marksOf(rows, nil); len(got) != 3 || got[0] != (storage.Mark{Shard: 1, Seq: 7}) || got[1] != (storage.Mark{Shard: 2, Seq: 2}) || got[2] != (storage.Mark{Shard: 3, Seq: 9}) {
		t.Fatalf("all published: %v", got)
	}
	if got := marksOf(rows, errors.New("down")); len(got) != 0 {
		t.Fatalf("nothing published: %v", got)
	}
	fail := errors.New("no")
	each := kafka.WriteErrors{nil, fail, nil, fail, nil, nil}
	// Shard 1 stops before seq 6 (seq 7 succeeded but must be sent again
	// after 6); shard 2's first failed: nothing; shard 3 is whole.
	if got := marksOf(rows, each); len(got) != 2 || got[0] != (storage.Mark{Shard: 1, Seq: 5}) || got[1] != (storage.Mark{Shard: 3, Seq: 9}) {
		t.Fatalf("partly published: %v", got)
	}
}

func TestSequenceStamp(t *testing.T) {
	stored := func() []kafka.Header {
		return []kafka.Header{{Key: header.EventID, Value: []byte("e")}, {Key: header.Seq, Value: []byte("stale")}, {Key: "trace", Value: []byte("t")}}
	}
	st, err := newSequenceStamp(EventHeaders, "src-1", 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	hs := st.apply(stored(), true, 7, 42)
	want := [][2]string{{header.EventID, "e"}, {"trace", "t"}, {header.SeqSource, "src-1"}, {header.SeqEpoch, "3"}, {header.SeqShard, "7"}, {header.Seq, "42"}}
	if len(hs) != len(want) {
		t.Fatalf("headers %v, want %v", hs, want)
	}
	for i, w := range want {
		if hs[i].Key != w[0] || string(hs[i].Value) != w[1] {
			t.Fatalf("header %d is %s=%q, want %s=%q", i, hs[i].Key, hs[i].Value, w[0], w[1])
		}
	}
	if hs := st.apply(stored(), false, 7, 42); len(hs) != 2 || hs[0].Key != header.EventID || hs[1].Key != "trace" {
		t.Fatalf("a message without a key got %v, want its own headers only", hs)
	}

	ce, err := newSequenceStamp(CloudEventsHeaders, "src-1", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	hs = ce.apply([]kafka.Header{{Key: header.CloudEventsSequence, Value: []byte("x")}}, true, 0, 42)
	for k, v := range map[string]string{header.CloudEventsSeqSource: "src-1", header.CloudEventsSeqEpoch: "1", header.CloudEventsSeqShard: "0", header.CloudEventsSequence: "0000000000000000042"} {
		if got, n := headerOf(hs, k); got != v || n != 1 {
			t.Errorf("header %s = %q (%d times), want %q once", k, got, n, v)
		}
	}
	if _, n := headerOf(hs, header.Seq); n != 0 {
		t.Errorf("the CloudEvents style stamped %s", header.Seq)
	}
	// String order is number order.
	a, _ := headerOf(ce.apply(nil, true, 0, 9), header.CloudEventsSequence)
	b, _ := headerOf(ce.apply(nil, true, 0, 10), header.CloudEventsSequence)
	c, _ := headerOf(ce.apply(nil, true, 0, 1<<63-1), header.CloudEventsSequence)
	if a >= b || b >= c || len(c) != header.CloudEventsSequenceDigits || len(a) != header.CloudEventsSequenceDigits {
		t.Errorf("sequences %q, %q, %q do not sort as 9, 10, max", a, b, c)
	}

	for _, bad := range []struct {
		source string
		epoch  int64
	}{{"", 1}, {"a b", 1}, {"ok", 0}, {strings.Repeat("s", storage.MaxSourceBytes+1), 1}} {
		if _, err := newSequenceStamp(EventHeaders, bad.source, bad.epoch, 0); err == nil {
			t.Errorf("source %q epoch %d accepted", bad.source, bad.epoch)
		}
	}
}

func TestPrepareSequenceHeaders(t *testing.T) {
	now := time.Now()
	for _, key := range []string{header.Seq, header.SeqSource, header.SeqEpoch, header.SeqShard, header.CloudEventsSeqShard} {
		m := Message{Topic: "t", Headers: []kafka.Header{{Key: key, Value: []byte("1")}}}
		var ve *inbox.ValidationError
		if _, err := prepare(m, EventHeaders, true, now); !errors.As(err, &ve) {
			t.Errorf("header %s with sequence headers on: %v, want a *inbox.ValidationError", key, err)
		}
		if _, err := prepare(m, EventHeaders, false, now); err != nil {
			t.Errorf("header %s with sequence headers off: %v", key, err)
		}
	}
	// CloudEvents' own sequence attribute is the relay's in its style only.
	m := Message{Topic: "t", Headers: []kafka.Header{{Key: header.CloudEventsSequence, Value: []byte("app")}}}
	if _, err := prepare(m, EventHeaders, true, now); err != nil {
		t.Errorf("ce_sequence in the EventHeaders style: %v", err)
	}
	if _, err := prepare(m, CloudEventsHeaders, true, now); err == nil {
		t.Error("ce_sequence in the CloudEvents style accepted while the relay stamps it")
	}
	// The largest message Enqueue takes still fits the writer once the
	// longest sequence headers are stamped.
	st, _ := newSequenceStamp(CloudEventsHeaders, strings.Repeat("s", storage.MaxSourceBytes), 1<<63-1, 1<<31-1)
	for size := maxMessageBytes - 400; size < maxMessageBytes; size++ {
		p, err := prepare(Message{Topic: "t", Key: []byte("k"), Value: make([]byte, size)}, CloudEventsHeaders, true, now)
		if err != nil {
			continue
		}
		hs := st.apply(p.headers, true, 1<<31-1, 1<<63-1)
		if n := messageBytes([]byte("k"), make([]byte, size), hs); n > maxMessageBytes {
			t.Fatalf("a %d-byte value was accepted and grows to %d bytes with its sequence headers", size, n)
		}
	}
}
