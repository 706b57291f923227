package consumer

import (
	"errors"
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/watermark"
	"github.com/inboxgo/inbox/storage"
)

// A stream whose stored value would outgrow what the store keeps leaves its
// new shards to the inbox row: a write the store refuses would be retried
// without end.
func TestMarksLeaveShardsThatDoNotFitToTheRow(t *testing.T) {
	id := streamID{source: "src", epoch: 1}
	// Each entry is 1 byte of distance and 6 of number.
	full := watermark.Applied{}
	for sh := range int32((storage.MaxWatermarkBytes - 8) / 7) {
		full[sh] = 1 << 40
	}
	if n := len(watermark.Encode(full)); n > storage.MaxWatermarkBytes-8 || n < storage.MaxWatermarkBytes-16 {
		t.Fatalf("a value of %d bytes, want just under the limit", n)
	}
	s := &watermarks{streams: map[streamID]*streamState{id: {stored: watermark.Encode(full), applied: full}}}
	known := &seqPos{stream: id, shard: 0, seq: 1<<40 + 1}
	fresh := &seqPos{stream: id, shard: 60000, seq: 1}
	other := &seqPos{stream: streamID{source: "src", epoch: 2}, shard: 60000, seq: 1}
	marks := s.marks([]*seqPos{known, fresh, nil, other}, false)
	if marks[0].Chain == 0 || marks[3].Chain == 0 {
		t.Errorf("marks %+v: the known shard and another stream's shard must be chained", marks)
	}
	if marks[1].Chain != 0 || !fresh.rows {
		t.Errorf("mark %+v (rows %v) for a shard that does not fit, want the inbox row", marks[1], fresh.rows)
	}
	// Its outcome is reported (hooks.Event.Sequenced, the span's dedup
	// path) as the row's.
	if (&item{seq: fresh}).watermarked() || !(&item{seq: known}).watermarked() {
		t.Error("the message left to the row is reported as deduplicated by the watermark, or the chained one is not")
	}
	writes := s.writer([]*seqPos{known, fresh, nil, other})([]int{0, 1, 3}, make([]inbox.Outcome, 4))
	for _, w := range writes {
		a, err := watermark.Decode(w.New)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := a[60000]; ok && w.Epoch == 1 {
			t.Errorf("the write of epoch 1 holds the shard left to the row")
		}
		if len(w.New) > storage.MaxWatermarkBytes {
			t.Errorf("a write of %d bytes", len(w.New))
		}
	}
}

func TestSequenceOfRefusesWhatNoOutboxSends(t *testing.T) {
	trusted := map[string]bool{"src": true}
	msg := func(shard, seq string, extra ...kafka.Header) *kafka.Message {
		return &kafka.Message{Headers: append([]kafka.Header{
			{Key: header.SeqSource, Value: []byte("src")},
			{Key: header.SeqEpoch, Value: []byte("1")},
			{Key: header.SeqShard, Value: []byte(shard)},
			{Key: header.Seq, Value: []byte(seq)},
		}, extra...)}
	}
	for name, m := range map[string]*kafka.Message{
		"shard past the outboxes' limit": msg(strconv.Itoa(maxShards), "1"),
		"negative shard":                 msg("-1", "1"),
		"zero sequence":                  msg("0", "0"),
		"leading zero":                   msg("1", "07"),
		"aligned, another partition":     msg("1", "1", kafka.Header{Key: header.SeqPartitions, Value: []byte("4")}),
	} {
		if p, _, err := readSequence(m, trusted); !errors.Is(err, inbox.ErrInvalidMessage) {
			t.Errorf("%s: %+v, %v; want an invalid message", name, p, err)
		}
	}
	if p, src, err := readSequence(msg("3", "9"), map[string]bool{"other": true}); p != nil || src != "src" || err != nil {
		t.Errorf("an untrusted source's message: %+v, %q, %v; want the inbox row and the source", p, src, err)
	}
	bad := msg("3", "9")
	bad.Headers[0].Value = []byte("no source id")
	if p, src, err := readSequence(bad, map[string]bool{"other": true}); p != nil || src != "" || err != nil {
		t.Errorf("a malformed untrusted source id: %+v, %q, %v; want the inbox row and no source", p, src, err)
	}
	if p, _, err := readSequence(msg("3", "9"), trusted); err != nil || p.shard != 3 || p.seq != 9 || p.partitions != 0 {
		t.Errorf("a good unaligned message: %+v, %v", p, err)
	}
	m := msg("3", "9", kafka.Header{Key: header.SeqPartitions, Value: []byte("4")})
	m.Partition = 3
	if p, _, err := readSequence(m, trusted); err != nil || p.shard != 3 || p.seq != 9 || p.partitions != 4 {
		t.Errorf("a good aligned message: %+v, %v", p, err)
	}
}
