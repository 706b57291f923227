package outbox

// A producer database that goes back in time: the relay of an aligned
// outbox checks its numbers against the partitions (see the package doc,
// "A producer database that goes back").

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/internal/short"
	"github.com/inboxgo/inbox/storage"
)

// Witness is the optional PinningPublisher capability by which the relay of
// an aligned outbox reads back what was published to the topic's
// partitions: the witness, outside the producer's database, of which
// sequence numbers were already handed to which events. KafkaPublisher is
// one, and so is franzgo.Publisher. A relay that stamps sequence headers on an aligned outbox needs it.
type Witness interface {
	// EndOffsets returns, for each of partitions of topic, the offset the
	// next message appended to it gets: every message acknowledged before
	// the call lies below it.
	EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error)
	// ReadPartition calls fn with each message of partition of topic at the
	// offsets from through end-1, in order, and returns the first offset it
	// could read: from, or the partition's log start if retention deleted
	// the messages before it. An error of fn ends the read and is returned.
	ReadPartition(ctx context.Context, topic string, partition int, from, end int64, fn func(kafka.Message) error) (first int64, err error)
}

// published is what the witness shows of one message of the outbox's
// source in a shard's partition.
type published struct {
	epoch, seq int64
}

// shardWitness is what a relay knows of one shard's partition, as of the
// partition's offset end: per epoch of the outbox's source, the highest
// number a consumer deduplicating by watermark has seen (run), and the
// messages numbered past mark that such a consumer applies (events, by
// event id): those whose number is above every earlier one of their
// stream. A message whose number an earlier message took is a copy if it
// is the same event, and dropped as one if it is not.
type shardWitness struct {
	source string
	epoch  int64 // the store's epoch when it was checked
	mark   int64 // the shard's published mark, as this relay last saw it
	end    int64 // the partition's end offset after the last read
	stored int64 // the offset stored with the mark (storage.Mark.Offset)
	events map[string]published
	run    map[int64]int64 // epoch → highest number seen
}

func newShardWitness(source string, epoch int64, m storage.Mark) *shardWitness {
	// What lies before the stored offset is numbered at or below the mark
	// (a mark stores the partition's end only when nothing read lies past
	// it), and rows at or below the mark are never published again.
	markEpoch := m.Epoch
	if markEpoch == 0 {
		markEpoch = epoch
	}
	return &shardWitness{source: source, epoch: epoch, mark: m.Seq, end: m.Offset, stored: m.Offset,
		events: map[string]published{}, run: map[int64]int64{markEpoch: m.Seq}}
}

// pastMark reports whether a number past mark was seen, in any epoch.
func (w *shardWitness) pastMark(mark int64) bool {
	for _, top := range w.run {
		if top > mark {
			return true
		}
	}
	return false
}

// forget drops the events at or below mark.
func (w *shardWitness) forget(mark int64) {
	w.mark = max(w.mark, mark)
	maps.DeleteFunc(w.events, func(_ string, p published) bool { return p.seq <= w.mark })
}

// see takes in the next message of the partition.
func (w *shardWitness) see(m kafka.Message) {
	if id, epoch, seq, ok := sequenceOfPublished(m, w.source); ok {
		w.take(id, epoch, seq)
	}
}

// take takes in the next message of the source in the partition: event id
// numbered seq in epoch.
func (w *shardWitness) take(id string, epoch, seq int64) {
	if seq <= w.run[epoch] {
		return // a copy, or dropped as one
	}
	w.run[epoch] = seq
	if seq > w.mark {
		w.events[id] = published{epoch: epoch, seq: seq}
	}
}

// sequenceOfPublished reads the event id and the sequence headers of a
// published message of source, in either header style; ok is false for a
// message of another source or without them.
func sequenceOfPublished(m kafka.Message, source string) (id string, epoch, seq int64, ok bool) {
	var src, ep, sq string
	var haveSrc bool
	for _, h := range m.Headers {
		switch h.Key {
		case header.SeqSource, header.CloudEventsSeqSource:
			src, haveSrc = string(h.Value), true
		case header.SeqEpoch, header.CloudEventsSeqEpoch:
			ep = string(h.Value)
		case header.Seq, header.CloudEventsSequence:
			sq = string(h.Value)
		case header.EventID, header.CloudEventsID:
			if id == "" {
				id = string(h.Value)
			}
		}
	}
	if !haveSrc || src != source || id == "" {
		return "", 0, 0, false
	}
	epoch, err1 := strconv.ParseInt(ep, 10, 64)
	seq, err2 := strconv.ParseInt(sq, 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, 0, false
	}
	return id, epoch, seq, true
}

// witnessed is a cycle's verdict on its claimed rows.
type witnessed struct {
	skip   []bool           // rows[i] is already in its partition: not sent again
	stamps []*sequenceStamp // rows[i]'s stamp: the epoch it is published under
	ends   map[int32]int64  // each shard's partition end before the publish
}

// witness checks a cycle's rows (of an aligned outbox stamping sequence
// headers) against their partitions before they are published, so that
// each event is applied once by a consumer deduplicating by watermark:
//
//   - A row whose event the partition already holds as the first message of
//     its number is skipped: marked published without being sent again.
//   - Any other row is stamped with an epoch in which its number continues
//     a stream contiguously (normally the store's epoch, the stream of the
//     rows before it). When there is none, the database went back (a
//     restore, a failover that lost commits, a copy with a relay of its
//     own publishing the same numbers): the number was already used for
//     another event, or lies past a hole. The relay then raises the store's
//     epoch past every epoch the partition shows and publishes the row
//     under it, a stream no consumer has seen, which the following rows
//     continue.
func (r *Relay) witness(ctx context.Context, rows []storage.OutboxRow, stamp *sequenceStamp) (*witnessed, error) {
	topic := r.o.cfg.AlignedTopic
	var shards []int32
	for _, row := range rows {
		if len(shards) == 0 || shards[len(shards)-1] != row.Shard {
			shards = append(shards, row.Shard)
		}
	}
	// The first row of each shard follows the shard's mark (Claim's contract).
	claimedMark := map[int32]int64{}
	for _, row := range rows {
		if _, ok := claimedMark[row.Shard]; !ok {
			claimedMark[row.Shard] = row.Seq - 1
		}
	}
	// A shard is read from the stored offset when the relay never checked
	// it, when the store's source or epoch or the mark went back (the
	// database was restored or failed over), and when the mark moved on
	// without this relay (another relay held the shard's lease meanwhile,
	// and may have published past its mark before it died). Otherwise the
	// relay's own view stands until the check after the publish, which
	// reads what anyone else appended meanwhile.
	var full []int32
	for _, s := range shards {
		w := r.wits[s]
		if w == nil || w.source != string(stamp.source) || stamp.epochN < w.epoch || claimedMark[s] != w.mark {
			full = append(full, s)
		}
	}
	ends := map[int]int64{}
	if len(full) > 0 {
		parts := make([]int, len(full))
		for i, s := range full {
			parts[i] = int(s)
		}
		var err error
		if ends, err = r.wit.EndOffsets(ctx, topic, parts); err != nil {
			return nil, fmt.Errorf("outbox: relay read the end offsets of %q: %w", topic, err)
		}
		for _, s := range full {
			if _, ok := ends[int(s)]; !ok {
				return nil, fmt.Errorf("outbox: relay read no end offset of partition %d of %q", s, topic)
			}
		}
		marks, err := r.marks.Marks(ctx, r.o.db.WithContext(ctx), full)
		if err != nil {
			return nil, fmt.Errorf("outbox: relay read the marks of shards %v: %w", full, err)
		}
		for _, m := range marks {
			r.wits[m.Shard] = newShardWitness(string(stamp.source), stamp.epochN, m)
		}
	}
	for _, s := range shards {
		if _, ok := ends[int(s)]; !ok {
			ends[int(s)] = r.wits[s].end
		}
	}
	for _, s := range shards {
		if err := r.readPartition(ctx, s, ends[int(s)]); err != nil {
			return nil, err
		}
		r.wits[s].forget(claimedMark[s])
		r.wits[s].epoch = stamp.epochN
	}

	out := &witnessed{skip: make([]bool, len(rows)), stamps: make([]*sequenceStamp, len(rows)), ends: map[int32]int64{}}
	for _, s := range shards {
		out.ends[s] = ends[int(s)]
	}
	stamps := map[int64]*sequenceStamp{stamp.epochN: stamp}
	stampOf := func(epoch int64) (*sequenceStamp, error) {
		if st := stamps[epoch]; st != nil {
			return st, nil
		}
		st, err := newSequenceStamp(r.o.cfg.Headers, string(stamp.source), epoch, r.o.shards)
		stamps[epoch] = st
		return st, err
	}
	current := stamp.epochN
	type rewind struct {
		shard                 int32
		seq, mark, top, epoch int64
	}
	var rewinds []rewind
	var err error
	var run map[int64]int64 // the shard's streams, with this cycle's rows
	for i, row := range rows {
		w := r.wits[row.Shard]
		if i == 0 || rows[i-1].Shard != row.Shard {
			run = maps.Clone(w.run)
		}
		if _, ok := w.events[row.EventID]; ok {
			out.skip[i] = true
			continue
		}
		epoch := int64(0)
		if run[current] == row.Seq-1 {
			epoch = current
		} else {
			for e, top := range run {
				if top == row.Seq-1 && e > epoch {
					epoch = e
				}
			}
		}
		if epoch == 0 {
			fresh := current + 1
			for _, s := range shards {
				for e := range r.wits[s].run {
					fresh = max(fresh, e+1)
				}
			}
			for current < fresh {
				if current, err = r.o.seq.BumpEpoch(ctx, r.o.db.WithContext(ctx)); err != nil {
					return nil, fmt.Errorf("outbox: relay raise the epoch after the database went back: %w", err)
				}
			}
			epoch = current
			rewinds = append(rewinds, rewind{shard: row.Shard, seq: row.Seq, mark: claimedMark[row.Shard], top: run[stamp.epochN], epoch: epoch})
		}
		if out.stamps[i], err = stampOf(epoch); err != nil {
			return nil, err
		}
		run[epoch] = row.Seq
	}
	for _, rw := range rewinds {
		r.log.Warn("the outbox's database went back: a number it is about to publish was already published for another event, or lies past a hole; publishing from it under a new epoch",
			"topic", topic, "shard", rw.shard, "mark", rw.mark, "seq", rw.seq, "published_up_to", rw.top,
			"old_epoch", stamp.epochN, "new_epoch", rw.epoch)
	}
	for _, s := range shards {
		r.wits[s].epoch = current
	}
	return out, nil
}

// readPartition reads shard s's partition from where the relay's
// witness of it ends up to end.
func (r *Relay) readPartition(ctx context.Context, s int32, end int64) error {
	w := r.wits[s]
	if end <= w.end {
		return nil
	}
	topic := r.o.cfg.AlignedTopic
	first, err := r.wit.ReadPartition(ctx, topic, int(s), w.end, end, func(m kafka.Message) error { w.see(m); return nil })
	if err != nil {
		delete(r.wits, s)
		return fmt.Errorf("outbox: relay read partition %d of %q from offset %d: %w", s, topic, w.end, err)
	}
	if first > w.end && w.end > 0 {
		r.log.Warn("retention deleted messages of the partition that the relay wanted to check; a producer database restored from before them is checked against what is left only",
			"partition", s, "from", w.end, "log_start", first)
	}
	w.end = end
	return nil
}

// verify checks, after a publish, that each published row is the first
// message of its number in its partition, as a consumer deduplicating by
// watermark sees it: another writer (a copy of the database with a relay
// of its own) may have published the same numbers between the check and
// the publish. It returns the rows that lost that race (their events are
// not applied by such a consumer: they must not be marked published, and
// are published again under a new epoch), or an error when it cannot tell
// (then nothing of the cycle may be marked). stamps[i] is rows[i]'s.
//
// placed, if not nil, holds the offsets the broker gave the cycle's
// messages (msgs[msgOf[i]] is rows[i]'s). A shard whose messages took the
// offsets from where the relay's witness of the partition ends, one after
// the other, needs no request for its end offset: everything before them
// was read, and they are the first messages past it, in order, so each is
// the first of its number exactly when the end offset would show nothing
// else appended before them. What another writer appends after them is
// read by the next verify, whose messages then do not start at the
// witness's end. Any other shard (a message without an offset, a retry
// that appended a batch twice, another writer's message in between, a
// recreated topic) is checked by its end offset, as without placed.
func (r *Relay) verify(ctx context.Context, w *witnessed, rows []storage.OutboxRow, msgOf []int, stamps []*sequenceStamp, sent map[int32]int, placed *placement) (map[int]bool, error) {
	shards := slices.Sorted(maps.Keys(sent))
	ends := map[int]int64{}
	var parts []int
	for _, s := range shards {
		if st := r.wits[s]; st != nil && placed.follows(s, st.end, rows, msgOf, sent[s]) {
			ends[int(s)] = st.end + int64(sent[s])
			continue
		}
		parts = append(parts, int(s))
	}
	if len(parts) > 0 {
		got, err := r.wit.EndOffsets(ctx, r.o.cfg.AlignedTopic, parts)
		if err != nil {
			return nil, fmt.Errorf("outbox: relay read the end offsets after the publish: %w", err)
		}
		for _, pt := range parts {
			ends[pt] = got[pt]
		}
	}
	raced := map[int32]bool{}
	for _, s := range shards {
		st := r.wits[s]
		if st == nil || st.end != w.ends[s] {
			return nil, fmt.Errorf("outbox: relay lost track of partition %d", s)
		}
		if ends[int(s)] < st.end {
			// The partition shrank: the topic was recreated under the
			// relay. Nothing is marked; the next cycle checks it afresh.
			delete(r.wits, s)
			return nil, fmt.Errorf("outbox: partition %d of %q ends at offset %d, before %d: the topic was recreated", s, r.o.cfg.AlignedTopic, ends[int(s)], st.end)
		}
		if ends[int(s)] == st.end+int64(sent[s]) {
			// Nothing else was appended: its messages follow every number
			// seen, in order.
			for i, row := range rows {
				if row.Shard == s && msgOf[i] >= 0 {
					st.take(row.EventID, stamps[i].epochN, row.Seq)
				}
			}
			st.end = ends[int(s)]
			continue
		}
		raced[s] = true
		if err := r.readPartition(ctx, s, ends[int(s)]); err != nil {
			return nil, err
		}
	}
	lost := map[int]bool{}
	overtaken, missing := 0, 0
	for i, row := range rows {
		if msgOf[i] < 0 || !raced[row.Shard] {
			continue
		}
		st := r.wits[row.Shard]
		if p, ok := st.events[row.EventID]; ok && p.epoch == stamps[i].epochN && p.seq == row.Seq {
			continue
		}
		lost[i] = true
		if slices.Contains(slices.Collect(maps.Values(st.events)), published{stamps[i].epochN, row.Seq}) {
			overtaken++
		} else {
			missing++
			// Consumers stop at the hole it left (a gap); sent again under
			// a new epoch, it is applied once they go on past the gap.
			r.log.Error("a message the broker acknowledged is not in its partition; publishing it again under a new epoch",
				"topic", r.o.cfg.AlignedTopic, "partition", row.Shard, "seq", row.Seq, "event_id", short.String(row.EventID))
		}
	}
	if overtaken > 0 {
		r.log.Warn("another writer published numbers of this outbox's source in the same partitions at the same time (a copy of its database with a relay of its own?); the messages it overtook are published again under a new epoch",
			"topic", r.o.cfg.AlignedTopic, "messages", overtaken)
	}
	return lost, nil
}

// placement is the offset at which the broker appended each message of
// a PublishPinned call, as the publisher reported it: -1 where it did not.
type placement struct{ offsets []int64 }

// placementOf reads what PublishPinned reported in msgs (whose Offsets
// the relay set to -1) for messages sent to parts.
func placementOf(msgs []kafka.Message, parts []int) *placement {
	p := &placement{offsets: make([]int64, len(msgs))}
	for i, m := range msgs {
		p.offsets[i] = -1
		if i < len(parts) && m.Partition == parts[i] && m.Offset >= 0 {
			p.offsets[i] = m.Offset
		}
	}
	return p
}

// follows reports whether the sent messages of shard s, n of them, took
// the offsets start, start+1, ... in the order of rows (see verify); false
// for a nil p.
func (p *placement) follows(s int32, start int64, rows []storage.OutboxRow, msgOf []int, n int) bool {
	if p == nil || n == 0 {
		return false
	}
	k := int64(0)
	for i, row := range rows {
		if row.Shard != s || msgOf[i] < 0 {
			continue
		}
		if msgOf[i] >= len(p.offsets) || p.offsets[msgOf[i]] != start+k {
			return false
		}
		k++
	}
	return k == int64(n)
}

// witnessPublished takes in a cycle's acknowledged marks. A shard whose
// publish or acknowledgement failed is checked again from its stored
// offset.
func (r *Relay) witnessPublished(w *witnessed, marks []storage.Mark, failed bool) {
	if failed {
		for s := range w.ends {
			delete(r.wits, s)
		}
		return
	}
	for _, m := range marks {
		if st := r.wits[m.Shard]; st != nil {
			st.forget(m.Seq)
			st.stored = m.Offset
		}
	}
}

// markOffsets sets the Offset and Epoch of each of marks: the partition's
// end before the publish if nothing read from the partition lies past the
// mark, the stored one otherwise (a check after a restart must read those
// messages again); and the epoch of the row at the mark (epochs[i] is
// rows[i]'s).
func (r *Relay) markOffsets(w *witnessed, marks []storage.Mark, rows []storage.OutboxRow, epochs []int64) {
	for i, m := range marks {
		st := r.wits[m.Shard]
		if st == nil {
			continue
		}
		if st.pastMark(m.Seq) {
			marks[i].Offset = st.stored
		} else {
			marks[i].Offset = w.ends[m.Shard]
		}
		for j, row := range rows {
			if row.Shard == m.Shard && row.Seq == m.Seq {
				marks[i].Epoch = epochs[j]
			}
		}
	}
}

// EndOffsets returns the partitions' end offsets, read from their leaders.
func (p *KafkaPublisher) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	return p.offsets(ctx, topic, partitions, kafka.LastOffset)
}

func (p *KafkaPublisher) offsets(ctx context.Context, topic string, partitions []int, which int64) (map[int]int64, error) {
	client := &kafka.Client{Addr: p.w.Addr, Transport: p.w.Transport}
	reqs := make([]kafka.OffsetRequest, len(partitions))
	for i, pt := range partitions {
		reqs[i] = kafka.OffsetRequest{Partition: pt, Timestamp: which}
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(partitions))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("partition %d: %w", po.Partition, po.Error)
		}
		if which == kafka.LastOffset {
			out[po.Partition] = po.LastOffset
		} else {
			out[po.Partition] = po.FirstOffset
		}
	}
	for _, pt := range partitions {
		if _, ok := out[pt]; !ok {
			return nil, fmt.Errorf("partition %d: no offset in the broker's answer", pt)
		}
	}
	return out, nil
}

// ReadPartition fetches the partition's messages from from to end.
func (p *KafkaPublisher) ReadPartition(ctx context.Context, topic string, partition int, from, end int64, fn func(kafka.Message) error) (int64, error) {
	client := &kafka.Client{Addr: p.w.Addr, Transport: p.w.Transport}
	first := from
	starts, err := p.offsets(ctx, topic, []int{partition}, kafka.FirstOffset)
	if err != nil {
		return 0, err
	}
	if start := starts[partition]; start > first {
		first = start
	}
	next := first
	for next < end {
		res, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: next,
			MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 500 * time.Millisecond})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			return first, fmt.Errorf("fetch at offset %d: %w", next, err)
		}
		before := next
		for {
			rec, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return first, fmt.Errorf("read at offset %d: %w", next, err)
			}
			if rec.Offset < next {
				continue
			}
			if rec.Offset >= end {
				next = end
				break
			}
			m := kafka.Message{Topic: topic, Partition: partition, Offset: rec.Offset, Headers: rec.Headers}
			if err := fn(m); err != nil {
				return first, err
			}
			next = rec.Offset + 1
		}
		if next == before {
			// Nothing at next: an offset without a message (a transaction
			// marker, a record compaction removed).
			if res.HighWatermark <= next {
				return first, fmt.Errorf("no message at offset %d below the end %d (high watermark %d)", next, end, res.HighWatermark)
			}
			next++
		}
	}
	return first, nil
}

var _ Witness = (*KafkaPublisher)(nil)
