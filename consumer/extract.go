package consumer

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/internal/short"
	"github.com/segmentio/kafka-go"
)

var (
	// ErrNoEventID is wrapped by an [Extractor]'s error when a message
	// carries no usable event id. Such a message is never processed: it goes
	// to Config.Failure.Policy.
	ErrNoEventID = errors.New("consumer: message has no event id")
	// ErrNoEventTime is wrapped by an [Extractor]'s error when a message
	// carries no usable event time.
	ErrNoEventTime = errors.New("consumer: message has no event time")
)

// Extractor returns the producer's event id and event time of m: both must
// be the same in every delivery of the event (a retry by the producer, a
// redelivery by Kafka, a replay), since they form the inbox key. When it
// cannot find them it returns an error wrapping [ErrNoEventID] or
// [ErrNoEventTime]; it must never invent them (a random id, the current
// time). It must not keep m or modify it, and must not panic (a panic is
// treated as a missing id).
type Extractor func(m *kafka.Message) (id string, at time.Time, err error)

// HeaderExtractor returns an Extractor that reads the event id from the
// first of idKeys present in the headers and the event time (RFC 3339, as
// CloudEvents requires) from the first of timeKeys present. With no keys it
// reads event_id / event_time, then the CloudEvents binary mode headers
// ce_id / ce_time. A key that appears more than once with different values is
// an error: the id would be ambiguous.
func HeaderExtractor(idKeys, timeKeys []string) Extractor {
	if len(idKeys) == 0 {
		idKeys = []string{header.EventID, header.CloudEventsID}
	}
	if len(timeKeys) == 0 {
		timeKeys = []string{header.EventTime, header.CloudEventsTime}
	}
	idKeys, timeKeys = append([]string(nil), idKeys...), append([]string(nil), timeKeys...)
	return func(m *kafka.Message) (string, time.Time, error) {
		idRaw, idKey, err := firstHeader(m.Headers, idKeys)
		if err != nil {
			return "", time.Time{}, fmt.Errorf("%w: %w", ErrNoEventID, err)
		}
		if idKey == "" || len(idRaw) == 0 {
			return "", time.Time{}, fmt.Errorf("%w: none of the headers %q is set", ErrNoEventID, idKeys)
		}
		tRaw, tKey, err := firstHeader(m.Headers, timeKeys)
		if err != nil {
			return "", time.Time{}, fmt.Errorf("%w: %w", ErrNoEventTime, err)
		}
		if tKey == "" || len(tRaw) == 0 {
			return "", time.Time{}, fmt.Errorf("%w: none of the headers %q is set", ErrNoEventTime, timeKeys)
		}
		at, err := time.Parse(time.RFC3339Nano, string(tRaw))
		if err != nil {
			return "", time.Time{}, fmt.Errorf("%w: header %q is not an RFC 3339 time: %q", ErrNoEventTime, tKey, shorten(tRaw))
		}
		return string(idRaw), at, nil
	}
}

// firstHeader returns the value of the first key present, and that key.
func firstHeader(hs []kafka.Header, keys []string) ([]byte, string, error) {
	for _, k := range keys {
		var val []byte
		found := false
		for _, h := range hs {
			if h.Key != k {
				continue
			}
			if found && !bytes.Equal(val, h.Value) {
				return nil, k, fmt.Errorf("header %q is repeated with different values", k)
			}
			val, found = h.Value, true
		}
		if found {
			return val, k, nil
		}
	}
	return nil, "", nil
}

func shorten(b []byte) string { return short.String(b) }

// ProvenanceExtractor uses the message's position as its id
// ("topic/partition/offset") and the broker's timestamp as its time.
//
// It covers redelivery by the consumer (a crash before the offset commit, a
// rebalance, a replay of the same topic) and nothing else: a producer that
// sends the same event twice writes two messages at two offsets, and both
// are applied. Choose it explicitly, only where the producer cannot set an
// event id. The broker timestamp must be stable for an offset: with
// message.timestamp.type=LogAppendTime it is; with CreateTime it is the
// producer's, also fixed once written.
func ProvenanceExtractor() Extractor {
	return func(m *kafka.Message) (string, time.Time, error) {
		if m.Time.IsZero() {
			return "", time.Time{}, fmt.Errorf("%w: the message has no broker timestamp", ErrNoEventTime)
		}
		id := m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
		return id, m.Time, nil
	}
}

// extract runs ex on m and turns a panic or an empty answer into an error.
func extract(ex Extractor, m *kafka.Message) (id string, at time.Time, err error) {
	defer func() {
		if r := recover(); r != nil {
			id, at, err = "", time.Time{}, fmt.Errorf("%w: extractor panicked: %v", ErrNoEventID, r)
		}
	}()
	id, at, err = ex(m)
	switch {
	case err != nil:
		if !errors.Is(err, ErrNoEventID) && !errors.Is(err, ErrNoEventTime) {
			err = fmt.Errorf("%w: %w", ErrNoEventID, err)
		}
		return "", time.Time{}, err
	case id == "":
		return "", time.Time{}, fmt.Errorf("%w: the extractor returned an empty id", ErrNoEventID)
	case at.IsZero():
		return "", time.Time{}, fmt.Errorf("%w: the extractor returned a zero time", ErrNoEventTime)
	}
	return id, at, nil
}
