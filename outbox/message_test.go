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
			p, err := prepare(tc.m, tc.style, now)
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
	p, err := prepare(Message{Topic: "t", Time: at}, EventHeaders, time.Now())
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
	if q, _ := prepare(Message{Topic: "t", Time: at}, EventHeaders, time.Now()); q.id == p.id {
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
			_, err := prepare(m, EventHeaders, time.Now())
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
