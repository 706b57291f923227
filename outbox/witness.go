package outbox

// A producer database that goes back in time: the relay of an aligned
// outbox checks its numbers against the partitions (see the package doc,
// "A producer database that goes back").

import (
	"cmp"
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
	"github.com/inboxgo/inbox/storage"
)

// Witness is the optional PinningPublisher capability by which the relay of
// an aligned outbox reads back what was published to the topic's
// partitions: the witness, outside the producer's database, of which
// sequence numbers were already handed to which events. KafkaPublisher is
// one. A relay that stamps sequence headers on an aligned outbox needs it.
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
// partition's offset end: the messages of the outbox's source numbered past
// mark (by event id), and the highest number seen per epoch.
type shardWitness struct {
	source string
	epoch  int64 // the store's epoch when it was checked
	mark   int64 // the shard's published mark, as this relay last saw it
	end    int64 // the partition's end offset after the last read or publish
	stored int64 // the offset stored with the mark (storage.Mark.Offset)
	events map[string]published
	top    map[int64]int64 // epoch → highest seq past mark
}

// settled reports whether no message seen in the partition lies past
// mark: then a mark moved to it can store the partition's end as where a
// later check starts reading.
func (w *shardWitness) settled(mark int64) bool {
	for _, top := range w.top {
		if top > mark {
			return false
		}
	}
	return true
}

// forget drops what lies at or below mark.
func (w *shardWitness) forget(mark int64) {
	w.mark = max(w.mark, mark)
	maps.DeleteFunc(w.events, func(_ string, p published) bool { return p.seq <= w.mark })
	maps.DeleteFunc(w.top, func(_ int64, top int64) bool { return top <= w.mark })
}

// see records m if it is a message of source numbered past the mark.
func (w *shardWitness) see(m kafka.Message) {
	id, epoch, seq, ok := sequenceOfPublished(m, w.source)
	if !ok || seq <= w.mark {
		return
	}
	w.events[id] = published{epoch: epoch, seq: seq}
	w.top[epoch] = max(w.top[epoch], seq)
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
	skip  []bool          // rows[i] is already in its partition: not sent again
	ends  map[int32]int64 // each shard's partition end before the publish
	stamp *sequenceStamp  // the stamp, with a new epoch if one was needed
}

// witness checks a cycle's rows (of an aligned outbox stamping sequence
// headers) against their partitions before they are published. A row whose
// event is already in its partition is skipped (acknowledged without being
// sent again). A row whose number was already used in the current epoch, or
// whose partition shows a later epoch than the store's, means the producer's
// database went back (a restore, a failover that lost commits, a clone
// publishing under the same source): the epoch is raised past every epoch
// seen, so that the rows are published in a stream no consumer has seen,
// and nothing already published is sent again under it.
func (r *Relay) witness(ctx context.Context, rows []storage.OutboxRow, stamp *sequenceStamp) (*witnessed, error) {
	topic := r.o.cfg.AlignedTopic
	var shards []int32
	for _, row := range rows {
		if len(shards) == 0 || shards[len(shards)-1] != row.Shard {
			shards = append(shards, row.Shard)
		}
	}
	parts := make([]int, len(shards))
	for i, s := range shards {
		parts[i] = int(s)
	}
	ends, err := r.wit.EndOffsets(ctx, topic, parts)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay read the end offsets of %q: %w", topic, err)
	}
	// The first row of each shard follows the shard's mark (Claim's contract).
	claimedMark := map[int32]int64{}
	for _, row := range rows {
		if _, ok := claimedMark[row.Shard]; !ok {
			claimedMark[row.Shard] = row.Seq - 1
		}
	}
	var full []int32
	for _, s := range shards {
		w := r.wits[s]
		end, ok := ends[int(s)]
		if !ok {
			return nil, fmt.Errorf("outbox: relay read no end offset of partition %d of %q", s, topic)
		}
		// Checked again from the stored offset when the relay never
		// checked the shard, when the store's source or epoch or the mark
		// went back (the database was restored or failed over), and when
		// the partition shrank (the topic was recreated).
		if w == nil || w.source != string(stamp.source) || stamp.epochN < w.epoch || claimedMark[s] < w.mark || end < w.end {
			full = append(full, s)
		}
	}
	if len(full) > 0 {
		marks, err := r.marks.Marks(ctx, r.o.db.WithContext(ctx), full)
		if err != nil {
			return nil, fmt.Errorf("outbox: relay read the marks of shards %v: %w", full, err)
		}
		for _, m := range marks {
			w := &shardWitness{source: string(stamp.source), epoch: stamp.epochN, mark: m.Seq, end: m.Offset, stored: m.Offset,
				events: map[string]published{}, top: map[int64]int64{}}
			r.wits[m.Shard] = w
		}
	}
	for _, s := range shards {
		w := r.wits[s]
		end := ends[int(s)]
		if end > w.end {
			first, err := r.wit.ReadPartition(ctx, topic, int(s), w.end, end, func(m kafka.Message) error { w.see(m); return nil })
			if err != nil {
				delete(r.wits, s)
				return nil, fmt.Errorf("outbox: relay read partition %d of %q from offset %d: %w", s, topic, w.end, err)
			}
			if first > w.end && w.end > 0 {
				r.log.Warn("retention deleted messages of the partition that the relay wanted to check; a producer database restored from before them is not checked against them",
					"partition", s, "from", w.end, "log_start", first)
			}
		}
		w.end = end
		w.forget(claimedMark[s])
	}

	out := &witnessed{skip: make([]bool, len(rows)), ends: map[int32]int64{}, stamp: stamp}
	for _, s := range shards {
		out.ends[s] = ends[int(s)]
	}
	type rewind struct {
		shard      int32
		first      int64 // the first number to publish
		mark, top  int64
		skipped    int
		seenEpochs []int64
	}
	var rewinds []rewind
	skipped := map[int32]int{}
	decided := map[int32]bool{}
	for i, row := range rows {
		w := r.wits[row.Shard]
		if _, ok := w.events[row.EventID]; ok && !decided[row.Shard] {
			out.skip[i] = true
			skipped[row.Shard]++
			continue
		}
		if decided[row.Shard] {
			continue
		}
		decided[row.Shard] = true
		later := false
		for e := range w.top {
			if e > stamp.epochN {
				later = true
			}
		}
		if later || w.top[stamp.epochN] >= row.Seq {
			rewinds = append(rewinds, rewind{shard: row.Shard, first: row.Seq, mark: claimedMark[row.Shard], top: w.top[stamp.epochN],
				skipped: skipped[row.Shard], seenEpochs: slices.Sorted(maps.Keys(w.top))})
		}
	}
	if len(rewinds) == 0 {
		return out, nil
	}
	target := stamp.epochN + 1
	for _, s := range shards {
		for e := range r.wits[s].top {
			target = max(target, e+1)
		}
	}
	epoch := stamp.epochN
	for epoch < target {
		if epoch, err = r.o.seq.BumpEpoch(ctx, r.o.db.WithContext(ctx)); err != nil {
			return nil, fmt.Errorf("outbox: relay raise the epoch after the database went back: %w", err)
		}
	}
	for _, rw := range rewinds {
		r.log.Warn("the outbox's database went back: numbers it is about to publish were already published for other events; publishing them under a new epoch",
			"topic", topic, "shard", rw.shard, "mark", rw.mark, "first_unpublished", rw.first, "published_up_to", rw.top,
			"epochs_seen", rw.seenEpochs, "old_epoch", stamp.epochN, "new_epoch", epoch, "already_published_skipped", rw.skipped)
	}
	ns, err := newSequenceStamp(r.o.cfg.Headers, string(stamp.source), epoch, r.o.shards)
	if err != nil {
		return nil, err
	}
	for _, s := range shards {
		r.wits[s].epoch = epoch
	}
	out.stamp = ns
	return out, nil
}

// published takes in what a cycle published: sent[s] messages to shard s's
// partition, and marks acknowledged. A shard whose publish or
// acknowledgement failed is checked again from its stored offset.
func (r *Relay) witnessPublished(w *witnessed, sent map[int32]int, marks []storage.Mark, failed bool) {
	if failed {
		for s := range w.ends {
			delete(r.wits, s)
		}
		return
	}
	for s, end := range w.ends {
		if st := r.wits[s]; st != nil {
			st.end = end + int64(sent[s])
		}
	}
	for _, m := range marks {
		if st := r.wits[m.Shard]; st != nil {
			st.forget(m.Seq)
			st.stored = m.Offset
		}
	}
}

// markOffsets sets the Offset of each of marks: the partition's end before
// the publish if nothing seen in the partition lies past the mark, the
// stored one otherwise (a check after a restart must read those messages
// again).
func (r *Relay) markOffsets(w *witnessed, marks []storage.Mark) {
	for i, m := range marks {
		st := r.wits[m.Shard]
		if st == nil {
			continue
		}
		if st.settled(m.Seq) {
			marks[i].Offset = w.ends[m.Shard]
		} else {
			marks[i].Offset = st.stored
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
			// Nothing at next: offsets without a message (transaction
			// markers, compaction) up to the high watermark.
			if res.HighWatermark <= next {
				return first, fmt.Errorf("no message at offset %d below the end %d (high watermark %d)", next, end, res.HighWatermark)
			}
			next = cmp.Or(min(res.HighWatermark, end), next+1)
		}
	}
	return first, nil
}

var _ Witness = (*KafkaPublisher)(nil)
