package consumer_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/header"
)

// fuzzKeys are the header keys the fuzzer combines: the defaults of
// HeaderExtractor, near misses, and one custom key of each kind.
var fuzzKeys = []string{
	header.EventID, header.EventTime, header.CloudEventsID, header.CloudEventsTime,
	"Event_ID", "event_id ", "x-id", "x-time",
}

// FuzzHeaderExtractor: HeaderExtractor never panics and never modifies the
// message; it returns exactly the value of the first id key present (never an
// id it made up, never an empty one), the parsed value of the first time key
// present, and rejects a key repeated with different values; every error
// wraps ErrNoEventID or ErrNoEventTime.
func FuzzHeaderExtractor(f *testing.F) {
	now := time.Date(2026, 11, 30, 1, 2, 3, 4, time.UTC).Format(time.RFC3339Nano)
	f.Add([]byte{0, 1}, "order-1", now, "order-2", false)
	f.Add([]byte{0, 10, 1}, "order-1", now, "order-2", false)           // id repeated, different values
	f.Add([]byte{0, 8, 1}, "order-1", now, "order-2", false)            // id repeated, same value
	f.Add([]byte{2, 3}, "ce-1", "2026-11-30T01:02:03+01:00", "", false) // CloudEvents
	f.Add([]byte{0, 2, 1, 3}, "a", now, "b", false)                     // both kinds: event_id wins
	f.Add([]byte{6, 7}, "custom", now, "", true)
	f.Add([]byte{0, 1}, "", now, "", false)
	f.Add([]byte{0, 1}, "id", "not a time", "", false)
	f.Add([]byte{}, "", "", "", false)
	f.Fuzz(func(t *testing.T, layout []byte, v1, v2, v3 string, custom bool) {
		values := [][]byte{[]byte(v1), []byte(v2), []byte(v3), nil}
		var hs []kafka.Header
		for _, b := range layout {
			hs = append(hs, kafka.Header{Key: fuzzKeys[int(b)%len(fuzzKeys)], Value: values[int(b)/len(fuzzKeys)%len(values)]})
		}
		idKeys, timeKeys := []string{header.EventID, header.CloudEventsID}, []string{header.EventTime, header.CloudEventsTime}
		ex := consumer.HeaderExtractor(nil, nil)
		if custom {
			idKeys, timeKeys = []string{"x-id", header.EventID}, []string{"x-time"}
			ex = consumer.HeaderExtractor(slices.Clone(idKeys), slices.Clone(timeKeys))
		}
		m := &kafka.Message{Topic: "t", Partition: 1, Offset: 7, Headers: hs}
		before := cloneHeaders(hs)

		id, at, err := ex(m)

		if !equalHeaders(m.Headers, before) {
			t.Fatalf("the extractor modified the headers: %q -> %q", before, m.Headers)
		}
		wantID, idAmbiguous := first(hs, idKeys)
		wantTime, timeAmbiguous := first(hs, timeKeys)
		switch {
		case idAmbiguous || len(wantID) == 0:
			if !errors.Is(err, consumer.ErrNoEventID) {
				t.Fatalf("headers %q: got (%q, %v, %v), want ErrNoEventID (ambiguous=%v)", hs, id, at, err, idAmbiguous)
			}
		case timeAmbiguous || len(wantTime) == 0:
			if !errors.Is(err, consumer.ErrNoEventTime) {
				t.Fatalf("headers %q: got (%q, %v, %v), want ErrNoEventTime (ambiguous=%v)", hs, id, at, err, timeAmbiguous)
			}
		default:
			parsed, perr := time.Parse(time.RFC3339Nano, string(wantTime))
			if perr != nil {
				if !errors.Is(err, consumer.ErrNoEventTime) {
					t.Fatalf("headers %q: unparsable time %q accepted: (%q, %v, %v)", hs, wantTime, id, at, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("headers %q: %v, want id %q", hs, err, wantID)
			}
			if id != string(wantID) || !at.Equal(parsed) {
				t.Fatalf("headers %q: got (%q, %v), want (%q, %v)", hs, id, at, wantID, parsed)
			}
		}
		if err != nil {
			if id != "" || !at.IsZero() {
				t.Fatalf("an error with a result: (%q, %v, %v)", id, at, err)
			}
			if !errors.Is(err, consumer.ErrNoEventID) && !errors.Is(err, consumer.ErrNoEventTime) {
				t.Fatalf("error %v wraps neither ErrNoEventID nor ErrNoEventTime", err)
			}
			_ = err.Error()
		}
	})
}

// first is the model: the value of the first of keys present in hs, and
// whether that key appears with different values.
func first(hs []kafka.Header, keys []string) (value []byte, ambiguous bool) {
	for _, k := range keys {
		found := false
		for _, h := range hs {
			if h.Key != k {
				continue
			}
			if found && !bytes.Equal(value, h.Value) {
				return nil, true
			}
			value, found = h.Value, true
		}
		if found {
			return value, false
		}
	}
	return nil, false
}

func cloneHeaders(hs []kafka.Header) []kafka.Header {
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	return out
}

func equalHeaders(a, b []kafka.Header) bool {
	return slices.EqualFunc(a, b, func(x, y kafka.Header) bool { return x.Key == y.Key && bytes.Equal(x.Value, y.Value) })
}
