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

// A batch is cut before a number its shard already had in the batch, for
// any stream and shard, and only for aligned streams.
func TestRepeatsAtCutsBeforeANumberSeenInTheBatch(t *testing.T) {
	a, b := streamID{source: "a", epoch: 1}, streamID{source: "a", epoch: 2}
	at := func(id streamID, shard int32, seq int64, partitions int) *item {
		return &item{seq: &seqPos{stream: id, shard: shard, seq: seq, partitions: partitions}}
	}
	for _, c := range []struct {
		name  string
		items []*item
		want  int
	}{
		{"no repeat", []*item{at(a, 0, 1, 1), {}, at(b, 0, 1, 1), at(a, 1, 1, 2), at(a, 0, 2, 1)}, 5},
		{"a number again", []*item{at(a, 0, 1, 1), at(a, 0, 2, 1), {}, at(a, 0, 2, 1)}, 3},
		{"a number going back", []*item{at(a, 0, 5, 1), at(a, 0, 3, 1)}, 1},
		{"a number again after another shard", []*item{at(a, 0, 1, 1), at(a, 0, 2, 1), at(b, 0, 1, 1), at(a, 0, 2, 1)}, 3},
		{"shards taking turns", []*item{at(a, 0, 1, 1), at(b, 0, 1, 1), at(a, 0, 2, 1), at(b, 0, 2, 1), at(a, 1, 1, 2), at(b, 0, 2, 1)}, 5},
		{"unaligned", []*item{at(a, 0, 1, 0), at(a, 0, 1, 0)}, 2},
		{"empty", nil, 0},
	} {
		if got := repeatsAt(c.items); got != c.want {
			t.Errorf("%s: repeatsAt = %d, want %d", c.name, got, c.want)
		}
	}
}

// The worker remembers the event of each recent number it saw committed,
// and reports a duplicate whose number another event took.
func TestCommittedReportsANumberTakenByAnotherEvent(t *testing.T) {
	id := streamID{source: "a", epoch: 1}
	s := &watermarks{streams: map[streamID]*streamState{}}
	pos := func(seq int64, ev string) *seqPos {
		return &seqPos{stream: id, seq: seq, partitions: 1, eventID: ev}
	}
	outcomes := func(os ...inbox.Outcome) func(int) inbox.Outcome { return func(j int) inbox.Outcome { return os[j] } }
	if twice := s.committed([]*seqPos{pos(1, "x"), pos(2, "y")}, outcomes(inbox.Processed, inbox.Processed)); len(twice) != 0 {
		t.Fatalf("first copies reported: %+v", twice)
	}
	twice := s.committed([]*seqPos{pos(2, "y"), pos(2, "z"), pos(1, "x")}, outcomes(inbox.Duplicate, inbox.Duplicate, inbox.Duplicate))
	if len(twice) != 1 || twice[0].at != 1 || twice[0].first != "y" || twice[0].pos.eventID != "z" {
		t.Fatalf("reported %+v, want z losing number 2 to y", twice)
	}
	// A number older than the worker remembers is not checked.
	s.committed([]*seqPos{pos(2+ownersKept, "w")}, outcomes(inbox.Processed))
	if twice := s.committed([]*seqPos{pos(2, "z")}, outcomes(inbox.Duplicate)); len(twice) != 0 {
		t.Errorf("a forgotten number reported: %+v", twice)
	}
}

// The per-message bookkeeping of a sequenced message allocates only the
// event id: its position is read into the batch's slab, its source id is
// the one its stream's previous message read, and the offset tracker reuses
// its slices.
func TestPerMessageBookkeepingAllocs(t *testing.T) {
	m := &kafka.Message{Partition: 0, Headers: []kafka.Header{
		{Key: header.EventID, Value: []byte("e-1")},
		{Key: header.EventTime, Value: []byte("2026-12-03T10:00:00.123Z")},
		{Key: header.SeqSource, Value: []byte("src")},
		{Key: header.SeqEpoch, Value: []byte("1")},
		{Key: header.SeqShard, Value: []byte("0")},
		{Key: header.Seq, Value: []byte("12")},
		{Key: header.SeqPartitions, Value: []byte("1")},
	}}
	trusted := map[string]bool{"src": true}
	ex := HeaderExtractor(nil, nil)
	tr := newOffsetTracker(0)
	var pos seqPos
	known := "src"
	off := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, _, err := extract(ex, m); err != nil {
			t.Fatal(err)
		}
		p, _, err := readSequenceInto(m, trusted, &pos, known)
		if err != nil || p != &pos || p.seq != 12 || p.partitions != 1 {
			t.Fatalf("read %+v, %v", p, err)
		}
		if err := tr.fetched(off); err != nil {
			t.Fatal(err)
		}
		if err := tr.markDone(off); err != nil {
			t.Fatal(err)
		}
		off++
	})
	if allocs > 1 {
		t.Errorf("%.1f allocations per message, want at most 1 (the event id)", allocs)
	}
}

// The first gap is found against the committed watermark and the numbers
// before it in the batch, per shard, also when shards take turns.
func TestFirstGap(t *testing.T) {
	a, b := streamID{source: "a", epoch: 1}, streamID{source: "b", epoch: 1}
	s := &watermarks{streams: map[streamID]*streamState{a: {applied: watermark.Applied{0: 4}}}}
	at := func(id streamID, shard int32, seq int64) *item {
		return &item{seq: &seqPos{stream: id, shard: shard, seq: seq, partitions: 1}}
	}
	for _, c := range []struct {
		name     string
		items    []*item
		want     int
		expected int64
	}{
		{"none", []*item{at(a, 0, 5), at(a, 0, 6), at(b, 0, 9), at(a, 0, 7), at(b, 0, 10)}, 5, 0},
		{"after the watermark", []*item{at(a, 0, 6)}, 0, 5},
		{"in a run", []*item{at(a, 0, 5), at(a, 0, 7)}, 1, 6},
		{"after another shard's run", []*item{at(a, 0, 5), at(b, 0, 3), at(b, 0, 4), at(a, 0, 7)}, 3, 6},
		{"in a shard seen before", []*item{at(b, 0, 3), at(a, 0, 5), at(b, 0, 5)}, 2, 4},
		{"a duplicate is no gap", []*item{at(a, 0, 3), at(a, 0, 5), at(a, 0, 4), at(a, 0, 6)}, 4, 0},
	} {
		n, gap := s.firstGap(c.items)
		if n != c.want || (gap == nil) != (c.expected == 0) || (gap != nil && gap.expected != c.expected) {
			t.Errorf("%s: firstGap = %d, %v; want %d, expecting %d", c.name, n, gap, c.want, c.expected)
		}
	}
}
