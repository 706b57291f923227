package outbox

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// Message is one event to publish.
type Message struct {
	// Topic is the Kafka topic: 1 to 249 ASCII letters, digits, '.', '_'
	// or '-'.
	Topic string
	// Key picks the Kafka partition; messages with the same topic and key
	// reach Kafka in commit order. Nil means no key (no order is kept
	// between such messages).
	Key   []byte
	Value []byte
	// Headers are sent as they are, followed by the event id and time
	// headers the outbox adds (and, when the relay publishes it, the
	// sequence headers). A header the outbox would add that is already
	// present must hold the same value, or Enqueue fails; the sequence
	// headers, which only the relay knows, must be absent while they are
	// on (Config.NoSequenceHeaders).
	Headers []kafka.Header
	// ID is the event id the downstream inbox deduplicates on. Empty: the
	// id header of Headers if there is one, else a new UUIDv7.
	ID string
	// Time is the event time; the downstream inbox files the event under
	// its UTC day. Zero: the time header of Headers if there is one, else
	// the Outbox's clock.
	Time time.Time
}

// HeaderStyle says which headers carry the event id and time, and the
// sequence.
type HeaderStyle int

const (
	// EventHeaders are event_id and event_time (RFC 3339), what the
	// consumer package reads first, and the sequence headers inbox_source,
	// inbox_epoch, inbox_shard and inbox_seq. The default.
	EventHeaders HeaderStyle = iota
	// CloudEventsHeaders are ce_id and ce_time, CloudEvents' Kafka binary
	// mode, and the sequence in CloudEvents' sequence extension
	// (ce_sequence, zero-padded) with ce_inboxsource, ce_inboxepoch and
	// ce_inboxshard.
	CloudEventsHeaders
)

func (s HeaderStyle) keys() (id, at string) {
	if s == CloudEventsHeaders {
		return header.CloudEventsID, header.CloudEventsTime
	}
	return header.EventID, header.EventTime
}

// sequenceKeys are the names of the sequence headers of the style.
func (s HeaderStyle) sequenceKeys() (source, epoch, shard, seq string) {
	if s == CloudEventsHeaders {
		return header.CloudEventsSeqSource, header.CloudEventsSeqEpoch, header.CloudEventsSeqShard, header.CloudEventsSequence
	}
	return header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq
}

// partitionsKey is the name of the style's partitions header, which an
// aligned outbox's messages carry.
func (s HeaderStyle) partitionsKey() string {
	if s == CloudEventsHeaders {
		return header.CloudEventsSeqPartitions
	}
	return header.SeqPartitions
}

// sequenceReserved reports whether a header named key is the relay's while
// sequence headers are on: the sequence headers of either style (a
// consumer may read either, as it reads event_id before ce_id), except
// CloudEvents' own sequence extension in the EventHeaders style, which is
// then the application's.
func (s HeaderStyle) sequenceReserved(key string) bool {
	switch key {
	case header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq, header.SeqPartitions,
		header.CloudEventsSeqSource, header.CloudEventsSeqEpoch, header.CloudEventsSeqShard, header.CloudEventsSeqPartitions:
		return true
	case header.CloudEventsSequence:
		return s == CloudEventsHeaders
	}
	return false
}

// sequenceStamp is what the relay stamps on the messages of one cycle: the
// store's source id and epoch, in the Outbox's style, and an aligned
// outbox's partition count.
type sequenceStamp struct {
	style      HeaderStyle
	source     []byte
	epoch      []byte
	epochN     int64
	partitions []byte // nil: not aligned
}

// newSequenceStamp returns the stamp of source and epoch, with the
// partitions header if partitions is above 0.
func newSequenceStamp(style HeaderStyle, source string, epoch int64, partitions int) (*sequenceStamp, error) {
	if err := storage.ValidSource(source); err != nil {
		return nil, fmt.Errorf("outbox: the store's source: %w", err)
	}
	if epoch < 1 {
		return nil, fmt.Errorf("outbox: the store's epoch is %d, want 1 or more", epoch)
	}
	st := &sequenceStamp{style: style, source: []byte(source), epoch: strconv.AppendInt(nil, epoch, 10), epochN: epoch}
	if partitions > 0 {
		st.partitions = strconv.AppendInt(nil, int64(partitions), 10)
	}
	return st, nil
}

// apply returns hs without headers of the relay's names (stored by an
// Outbox with sequence headers off) and, if pinned, with the sequence
// headers of the row (shard, seq) after them. A message is pinned if it
// has a key, or if its outbox is aligned; otherwise the writer's balancer
// picks its partition, so no order per partition is kept for it.
func (st *sequenceStamp) apply(hs []kafka.Header, pinned bool, shard int32, seq int64) []kafka.Header {
	out := hs[:0]
	for _, h := range hs {
		if !st.style.sequenceReserved(h.Key) {
			out = append(out, h)
		}
	}
	if !pinned {
		return out
	}
	kSource, kEpoch, kShard, kSeq := st.style.sequenceKeys()
	seqText := strconv.AppendInt(nil, seq, 10)
	if st.style == CloudEventsHeaders {
		seqText = fmt.Appendf(nil, "%0*d", header.CloudEventsSequenceDigits, seq)
	}
	out = append(out,
		kafka.Header{Key: kSource, Value: st.source},
		kafka.Header{Key: kEpoch, Value: st.epoch},
		kafka.Header{Key: kShard, Value: strconv.AppendInt(nil, int64(shard), 10)},
		kafka.Header{Key: kSeq, Value: seqText},
	)
	if st.partitions != nil {
		out = append(out, kafka.Header{Key: st.style.partitionsKey(), Value: st.partitions})
	}
	return out
}

// sequenceHeadersBytes bounds what the sequence headers add to a message,
// counted as messageBytes counts: Enqueue keeps that much room under the
// writer's limit, whatever the relay's settings (the partitions header
// included, though only an aligned outbox's relay stamps it).
var sequenceHeadersBytes = func() int {
	longest := 0
	for _, style := range []HeaderStyle{EventHeaders, CloudEventsHeaders} {
		a, b, c, d := style.sequenceKeys()
		longest = max(longest, len(a)+len(b)+len(c)+len(d)+len(style.partitionsKey()))
	}
	const epochDigits, shardDigits, partitionsDigits = 19, 10, 10 // an int64, an int32, an int32
	return 5*headerOverhead + longest + storage.MaxSourceBytes + epochDigits + shardDigits + header.CloudEventsSequenceDigits + partitionsDigits
}()

// Limits on messages. maxMessageBytes is kafka-go's Writer limit (its
// default BatchBytes), counted as messageBytes counts.
const (
	maxTopicBytes      = 249
	maxHeaderKeyBytes  = 255
	maxMessageBytes    = 1 << 20
	messageOverhead    = 40 // a record's framing, generously
	headerOverhead     = 12
	maxEventTimeYear   = 9999
	minEventTimeYear   = 1970
	eventTimeLayoutOut = time.RFC3339Nano
)

// messageBytes is an upper bound of the bytes kafka-go's Writer counts for a
// message against its BatchBytes.
func messageBytes(key, value []byte, headers []kafka.Header) int {
	n := messageOverhead + len(key) + len(value)
	for _, h := range headers {
		n += headerOverhead + len(h.Key) + len(h.Value)
	}
	return n
}

func invalid(field, value, reason string) error {
	return &inbox.ValidationError{Field: field, Value: value, Reason: reason}
}

func validTopic(topic string) error {
	if topic == "" || len(topic) > maxTopicBytes || topic == "." || topic == ".." {
		return invalid("topic", topic, fmt.Sprintf("must be 1-%d bytes and not \".\" or \"..\"", maxTopicBytes))
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !topicByte(c) {
			return invalid("topic", topic, "may hold only ASCII letters, digits, '.', '_' and '-'")
		}
	}
	return nil
}

func validEventID(id string) error {
	switch {
	case len(id) > storage.MaxEventIDBytes:
		return invalid("event id", id, fmt.Sprintf("%d bytes, longer than the %d the inbox stores", len(id), storage.MaxEventIDBytes))
	case !utf8.ValidString(id):
		return invalid("event id", id, "not valid UTF-8")
	case strings.IndexByte(id, 0) >= 0:
		return invalid("event id", id, "contains a NUL byte")
	}
	return nil
}

// prepared is a message made ready to store: its final headers, id and
// time.
type prepared struct {
	id      string
	headers []kafka.Header
}

// prepare validates m, settles its event id and time, and returns the
// headers to store. sequenced says that the relay stamps sequence headers;
// now is the Outbox's clock.
func prepare(m Message, style HeaderStyle, sequenced bool, now time.Time) (prepared, error) {
	if err := validTopic(m.Topic); err != nil {
		return prepared{}, err
	}
	for _, h := range m.Headers {
		if h.Key == "" || len(h.Key) > maxHeaderKeyBytes || !utf8.ValidString(h.Key) || strings.IndexByte(h.Key, 0) >= 0 {
			return prepared{}, invalid("header name", h.Key, fmt.Sprintf("must be 1-%d bytes of UTF-8 without NUL", maxHeaderKeyBytes))
		}
		if sequenced && style.sequenceReserved(h.Key) {
			return prepared{}, invalid("header name", h.Key, "is a sequence header, which the relay stamps; set Config.NoSequenceHeaders to send your own")
		}
	}
	idKey, timeKey := style.keys()
	// Every id and time header the consumer may read must agree with the
	// outbox's: the consumer reads event_id before ce_id, so a stray
	// header of the other style would be ambiguous.
	id, err := agree("event id", m.ID, m.Headers, header.EventID, header.CloudEventsID)
	if err != nil {
		return prepared{}, err
	}
	timeText := ""
	if !m.Time.IsZero() {
		timeText = m.Time.UTC().Format(eventTimeLayoutOut)
	}
	timeText, err = agreeTime(timeText, m.Headers)
	if err != nil {
		return prepared{}, err
	}
	var at time.Time
	if timeText == "" {
		at = now.UTC()
		timeText = at.Format(eventTimeLayoutOut)
	} else if at, err = time.Parse(time.RFC3339Nano, timeText); err != nil {
		return prepared{}, invalid("event time header", timeText, "not an RFC 3339 time")
	}
	if y := at.UTC().Year(); y < minEventTimeYear || y > maxEventTimeYear {
		return prepared{}, invalid("event time", timeText, "outside the years 1970..9999")
	}
	if id == "" {
		id = NewEventID(at)
	}
	if err := validEventID(id); err != nil {
		return prepared{}, err
	}
	headers := make([]kafka.Header, 0, len(m.Headers)+2)
	headers = append(headers, m.Headers...)
	if !hasHeader(m.Headers, idKey) {
		headers = append(headers, kafka.Header{Key: idKey, Value: []byte(id)})
	}
	if !hasHeader(m.Headers, timeKey) {
		headers = append(headers, kafka.Header{Key: timeKey, Value: []byte(timeText)})
	}
	if n := messageBytes(m.Key, m.Value, headers) + sequenceHeadersBytes; n > maxMessageBytes {
		return prepared{}, invalid("message size", "", fmt.Sprintf("%d bytes with key, headers and room for the sequence headers, over the %d a Kafka writer sends", n, maxMessageBytes))
	}
	return prepared{id: id, headers: headers}, nil
}

func hasHeader(hs []kafka.Header, key string) bool {
	for _, h := range hs {
		if h.Key == key {
			return true
		}
	}
	return false
}

// agree returns the one value that given and every header named in keys
// hold (given may be empty), or an error naming the conflict.
func agree(what, given string, hs []kafka.Header, keys ...string) (string, error) {
	val := given
	for _, h := range hs {
		for _, k := range keys {
			if h.Key != k {
				continue
			}
			if val != "" && string(h.Value) != val {
				return "", invalid(what, string(h.Value), fmt.Sprintf("header %q conflicts with %q set elsewhere; the outbox never overwrites a header", k, val))
			}
			val = string(h.Value)
		}
	}
	return val, nil
}

// agreeTime is agree for the time headers, comparing instants (a header may
// spell the same time differently).
func agreeTime(given string, hs []kafka.Header) (string, error) {
	val, valAt := given, time.Time{}
	if given != "" {
		valAt, _ = time.Parse(time.RFC3339Nano, given)
	}
	for _, h := range hs {
		if h.Key != header.EventTime && h.Key != header.CloudEventsTime {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, string(h.Value))
		if err != nil {
			return "", invalid("event time header", string(h.Value), fmt.Sprintf("header %q is not an RFC 3339 time", h.Key))
		}
		if val != "" && !at.Equal(valAt) {
			return "", invalid("event time", string(h.Value), fmt.Sprintf("header %q conflicts with %q set elsewhere; the outbox never overwrites a header", h.Key, val))
		}
		if val == "" {
			val, valAt = string(h.Value), at
		}
	}
	return val, nil
}

// NewEventID returns a new UUIDv7 (RFC 9562) whose timestamp is t: ids sort
// by time, and the time can be read back from the id.
func NewEventID(t time.Time) string {
	var u [16]byte
	_, _ = rand.Read(u[6:])
	ms := uint64(t.UnixMilli())
	binary.BigEndian.PutUint16(u[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(u[2:6], uint32(ms))
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // variant 10
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// keyHash picks the shard: messages of one topic and key share it. A
// message without a key is spread by its id.
func keyHash(topic string, key []byte, id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(topic))
	h.Write([]byte{0})
	if key == nil {
		h.Write([]byte{1})
		h.Write([]byte(id))
	} else {
		h.Write(key)
	}
	return h.Sum32()
}

// storedHeader is a header as storage.OutboxRow.Headers stores it (JSON encodes the value
// in base64).
type storedHeader struct {
	K string `json:"k"`
	V []byte `json:"v"`
}

func encodeHeaders(hs []kafka.Header) ([]byte, error) {
	out := make([]storedHeader, len(hs))
	for i, h := range hs {
		out[i] = storedHeader{K: h.Key, V: h.Value}
	}
	return json.Marshal(out)
}

func decodeHeaders(b []byte) ([]kafka.Header, error) {
	var in []storedHeader
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("outbox: stored headers are unreadable: %w", err)
	}
	hs := make([]kafka.Header, len(in))
	for i, h := range in {
		hs[i] = kafka.Header{Key: h.K, Value: h.V}
	}
	return hs, nil
}

// topicByte reports whether c may appear in a Kafka topic name.
func topicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}
