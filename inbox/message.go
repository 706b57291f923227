package inbox

import (
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"

	"fmt"
	"strings"
	"time"
	"unicode/utf8"
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
func (m Message) Day() time.Time { return storage.DayOf(m.Time) }

// Validate reports whether m can be stored in the inbox. The error wraps
// [ErrInvalidMessage] and is a *[ValidationError].
func (m Message) Validate() error {
	if err := validateKeyPart("consumer", m.Consumer, storage.MaxConsumerBytes); err != nil {
		return err
	}
	if err := validateKeyPart("event id", m.ID, storage.MaxEventIDBytes); err != nil {
		return err
	}
	if m.Time.IsZero() {
		return &ValidationError{Field: "event time", Reason: "missing: the inbox day must come from the event, not from the processing time"}
	}
	if y := m.Time.UTC().Year(); y < 1970 || y > 9999 {
		return &ValidationError{Field: "event time", Value: m.Time.UTC().Format(time.RFC3339), Reason: "outside the years 1970..9999"}
	}
	if len(m.Topic) > storage.MaxTopicBytes || !utf8.ValidString(m.Topic) || strings.IndexByte(m.Topic, 0) >= 0 {
		return &ValidationError{Field: "topic", Value: m.Topic, Reason: fmt.Sprintf("must be valid UTF-8 without NUL, at most %d bytes", storage.MaxTopicBytes)}
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

// row returns the inbox row for m. m must be valid.
func (m Message) row() storage.InboxRow {
	return storage.InboxRow{
		Consumer:  m.Consumer,
		EventID:   m.ID,
		Day:       m.Day(),
		EventTime: m.Time.UTC(),
		Topic:     m.Topic,
		Partition: m.Partition,
		Offset:    m.Offset,
	}
}

// kind is the hooks.Kind reporting outcome o.
func (o Outcome) kind() hooks.Kind {
	switch o {
	case Processed:
		return hooks.Processed
	case Duplicate:
		return hooks.Duplicate
	}
	return hooks.Failed
}
