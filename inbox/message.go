package inbox

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on the identifiers stored in the inbox key. They are byte lengths of
// the UTF-8 encoding; every adapter must store ids of these lengths exactly,
// without truncation or normalisation.
const (
	MaxEventIDBytes  = 255
	MaxConsumerBytes = 128
	// MaxTopicBytes bounds the provenance topic (Kafka's own limit is 249).
	MaxTopicBytes = 255
)

// Message is what the inbox needs to know about one delivery of an event.
type Message struct {
	// Consumer names the handler the event is applied by. One event consumed
	// by two consumers takes effect once in each.
	Consumer string
	// ID is the event id set by the producer. It must be stable across
	// redeliveries; an id minted by the consumer defeats the inbox.
	ID string
	// Time is the event time set by the producer. Its UTC calendar day picks
	// the inbox partition, so it must be the same in every redelivery. It must
	// not be the processing time.
	Time time.Time

	// Provenance, stored with the inbox row for diagnosis only. Topic is
	// empty when the message did not come from a broker.
	Topic     string
	Partition int32
	Offset    int64
}

// Day returns the UTC calendar day of the event time, the day part of the
// inbox key.
func (m Message) Day() time.Time { return DayOf(m.Time) }

// DayOf returns midnight UTC of the calendar day t falls on in UTC.
func DayOf(t time.Time) time.Time {
	u := t.UTC()
	return time.Date(u.Year(), u.Month(), u.Day(), 0, 0, 0, 0, time.UTC)
}

// Validate reports whether m can be stored in the inbox. The error wraps
// [ErrInvalidMessage] and is a *[ValidationError].
func (m Message) Validate() error {
	if err := validateKeyPart("consumer", m.Consumer, MaxConsumerBytes); err != nil {
		return err
	}
	if err := validateKeyPart("event id", m.ID, MaxEventIDBytes); err != nil {
		return err
	}
	if m.Time.IsZero() {
		return &ValidationError{Field: "event time", Reason: "missing: the inbox day must come from the event, not from the processing time"}
	}
	if y := m.Time.UTC().Year(); y < 1970 || y > 9999 {
		return &ValidationError{Field: "event time", Value: m.Time.UTC().Format(time.RFC3339), Reason: "outside the years 1970..9999"}
	}
	if len(m.Topic) > MaxTopicBytes || !utf8.ValidString(m.Topic) || strings.IndexByte(m.Topic, 0) >= 0 {
		return &ValidationError{Field: "topic", Value: m.Topic, Reason: fmt.Sprintf("must be valid UTF-8 without NUL, at most %d bytes", MaxTopicBytes)}
	}
	if m.Partition < 0 || m.Offset < 0 {
		return &ValidationError{Field: "provenance", Reason: fmt.Sprintf("negative partition %d or offset %d", m.Partition, m.Offset)}
	}
	return nil
}

func validateKeyPart(field, v string, maxBytes int) error {
	switch {
	case v == "":
		return &ValidationError{Field: field, Reason: "empty"}
	case len(v) > maxBytes:
		return &ValidationError{Field: field, Value: v, Reason: fmt.Sprintf("%d bytes, longer than the %d allowed (ids are never truncated: a truncated id could collide with another)", len(v), maxBytes)}
	case !utf8.ValidString(v):
		return &ValidationError{Field: field, Value: v, Reason: "not valid UTF-8"}
	case strings.IndexByte(v, 0) >= 0:
		return &ValidationError{Field: field, Value: v, Reason: "contains a NUL byte"}
	}
	return nil
}

// Row is the inbox row a [Store] writes for one message.
type Row struct {
	Consumer  string
	EventID   string
	Day       time.Time // midnight UTC; part of the key
	EventTime time.Time // UTC
	Topic     string
	Partition int32
	Offset    int64
}

// Key identifies a row: the unique key every Store enforces.
type Key struct {
	Consumer string
	EventID  string
	Day      time.Time
}

// Key returns the row's unique key.
func (r Row) Key() Key { return Key{Consumer: r.Consumer, EventID: r.EventID, Day: r.Day} }

// Row returns the inbox row for m. m must be valid.
func (m Message) Row() Row {
	return Row{
		Consumer:  m.Consumer,
		EventID:   m.ID,
		Day:       m.Day(),
		EventTime: m.Time.UTC(),
		Topic:     m.Topic,
		Partition: m.Partition,
		Offset:    m.Offset,
	}
}
