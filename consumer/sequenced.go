package consumer

// Sequenced dedup: messages of trusted outbox sources deduplicated by a
// watermark per stream instead of an inbox row per event (see the package
// doc, "Sequenced dedup").

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/batchopt"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/internal/watermark"
	"github.com/inboxgo/inbox/storage"
)

// seqPos is where a message of a trusted source stands in its stream.
type seqPos struct {
	stream streamID
	shard  int32
	seq    int64
	// rows says the message takes its inbox row: its shard is not in the
	// stream's watermark, and adding it would make the stored value longer
	// than storage.MaxWatermarkBytes (see watermarks.marks).
	rows bool
	// partitions is the partition count the source's shards are aligned
	// with (header.SeqPartitions), 0 if they are not. Only an aligned
	// stream is deduplicated by its watermark (see batchRunner.sequenceOf), and
	// only there is a gap a loss.
	partitions int
	// cloudEvents says the headers are in the CloudEvents style.
	cloudEvents bool
	// eventID is the message's event id: the identity its number names.
	eventID string
}

type streamID struct {
	source string
	epoch  int64
}

// shardKey is one shard of a stream: the unit a watermark number and a
// chain of held-back messages belong to.
type shardKey struct {
	id    streamID
	shard int32
}

// sequenceOf reads m's sequence headers (see readSequence). It returns nil
// for a message that takes its inbox row: one without sequence headers,
// one of a source not in Config.Sequenced.Sources (said once per source at
// Info, so that a mistyped id is found), or one of a trusted source whose
// shards are not aligned with the topic's partitions (said once per
// source at Warn). An unaligned source's shard spans partitions, so
// nothing on a partition can witness that its numbers were handed out
// again (a restore of the producer's database): a watermark would skip the
// new events that got them.
//
// The position is read into into; known, a source id read before, is
// taken as the position's source when m's is the same (no copy of it).
func (b *batchRunner) sequenceOf(m *kafka.Message, into *seqPos, known string) (*seqPos, error) {
	p, untrusted, err := readSequenceInto(m, b.trusted, into, known)
	switch {
	case err != nil:
		return nil, err
	case untrusted != "":
		if b.host.firstNoteOf(untrusted) {
			b.log.Info("sequence headers of a source not in Sequenced.Sources: its messages are deduplicated by inbox rows (list it, or check the listed ids for a typo, for sequenced dedup)",
				"source", untrusted)
		}
		return nil, nil
	case p != nil && p.partitions == 0:
		if b.host.firstNoteOf(p.stream.source) {
			missing := header.SeqPartitions
			if p.cloudEvents {
				missing = header.CloudEventsSeqPartitions
			}
			b.log.Warn("trusted source is not aligned (no "+missing+" header): its messages are deduplicated by inbox rows; align its outbox (outbox.Config.AlignedTopic) for sequenced dedup",
				"source", p.stream.source)
		}
		return nil, nil
	}
	return p, nil
}

// maxNotedSources bounds the sources a Consumer says once that it
// deduplicates by rows: the ids come from the messages.
const maxNotedSources = 1024

// firstNoteOf reports whether src is noted for the first time.
func (c *Consumer) firstNoteOf(src string) bool {
	c.notedMu.Lock()
	defer c.notedMu.Unlock()
	if c.noted[src] || len(c.noted) >= maxNotedSources {
		return false
	}
	if c.noted == nil {
		c.noted = map[string]bool{}
	}
	c.noted[src] = true
	return true
}

// readSequence reads m's sequence headers. p is nil for a message that
// carries none, or whose source is not in trusted; untrusted is then that
// source, if it is a well-formed id. A trusted source's message whose
// headers are incomplete or malformed is an error: it cannot be told from
// the events around it, and guessing could drop it. p.partitions is 0 for
// a trusted source that is not aligned.
func readSequence(m *kafka.Message, trusted map[string]bool) (p *seqPos, untrusted string, err error) {
	return readSequenceInto(m, trusted, new(seqPos), "")
}

// readSequenceInto is readSequence reading into into, which p then is;
// known, if it is m's source id, becomes p's source (sparing a copy).
func readSequenceInto(m *kafka.Message, trusted map[string]bool, into *seqPos, known string) (p *seqPos, untrusted string, err error) {
	src, srcKey, err := firstHeader(m.Headers, []string{header.SeqSource, header.CloudEventsSeqSource})
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", errBadSequence, err)
	}
	if srcKey == "" {
		return nil, "", nil
	}
	if !trusted[string(src)] {
		if storage.ValidSource(string(src)) != nil {
			return nil, "", nil
		}
		return nil, string(src), nil
	}
	ce := srcKey == header.CloudEventsSeqSource
	pick := func(plain, cloud string) string {
		if ce {
			return cloud
		}
		return plain
	}
	num := func(key string, min int64) (int64, error) {
		raw, k, err := firstHeader(m.Headers, []string{key})
		if err != nil {
			return 0, fmt.Errorf("%w: %w", errBadSequence, err)
		}
		if k == "" {
			return 0, fmt.Errorf("%w: source %q: header %q is missing", errBadSequence, src, key)
		}
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || v < min || (raw[0] == '0' && key != header.CloudEventsSequence && len(raw) > 1) {
			return 0, fmt.Errorf("%w: source %q: header %q is %q, not a decimal from %d", errBadSequence, src, key, shorten(raw), min)
		}
		return v, nil
	}
	source := known
	if string(src) != known {
		source = string(src)
	}
	p = into
	*p = seqPos{stream: streamID{source: source}, cloudEvents: ce}
	if p.stream.epoch, err = num(pick(header.SeqEpoch, header.CloudEventsSeqEpoch), 1); err != nil {
		return nil, "", err
	}
	var shard int64
	shard, err = num(pick(header.SeqShard, header.CloudEventsSeqShard), 0)
	if err != nil {
		return nil, "", err
	}
	if shard >= maxShards {
		return nil, "", fmt.Errorf("%w: source %q: shard %d out of range (an outbox has at most %d shards)", errBadSequence, src, shard, maxShards)
	}
	p.shard = int32(shard)
	if p.seq, err = num(pick(header.Seq, header.CloudEventsSequence), 1); err != nil {
		return nil, "", err
	}
	if raw, k, _ := firstHeader(m.Headers, []string{pick(header.SeqPartitions, header.CloudEventsSeqPartitions)}); k != "" {
		n, err := strconv.Atoi(string(raw))
		if err != nil || n < 1 {
			return nil, "", fmt.Errorf("%w: source %q: header %q is %q, not a partition count", errBadSequence, src, k, shorten(raw))
		}
		if int(p.shard) != m.Partition {
			return nil, "", fmt.Errorf("%w: source %q aligns shards with %d partitions, but shard %d arrived on partition %d (published by another producer, or the topic's partitions changed)",
				errBadSequence, src, n, p.shard, m.Partition)
		}
		p.partitions = n
	}
	return p, "", nil
}

// watermarked reports whether it is deduplicated by its stream's
// watermark: it has a place in a trusted stream whose watermark holds (or
// takes) its shard.
func (it *item) watermarked() bool { return it.seq != nil && !it.seq.rows }

// maxShards bounds the shard numbers of a trusted source: the adapters'
// outbox stores make at most this many.
const maxShards = 1 << 16

// errBadSequence is wrapped by the error of a trusted source's message
// whose sequence headers are unusable; it goes to the failure policy as an
// invalid message.
var errBadSequence = fmt.Errorf("%w: bad sequence headers", inbox.ErrInvalidMessage)

// watermarks is a worker's view of its partition's streams, as committed.
type watermarks struct {
	store     storage.WatermarkStore
	scope     string
	topic     string
	partition int32
	loaded    bool
	streams   map[streamID]*streamState
	// owners holds, per shard, the events that took the numbers this
	// worker saw committed: the identities a later copy of a number is
	// checked against (see committed).
	owners map[shardKey]*numberOwners
}

// ownersKept bounds the numbers of a shard whose events a worker
// remembers: a copy of a number that comes back later than that, or of one
// committed before the worker started, is not checked.
const ownersKept = 1024

// numberOwners is a ring of the events that took a shard's recent numbers.
type numberOwners struct {
	seq [ownersKept]int64
	id  [ownersKept]string
}

func (o *numberOwners) put(seq int64, id string) {
	i := seq % ownersKept
	o.seq[i], o.id[i] = seq, id
}

func (o *numberOwners) get(seq int64) (string, bool) {
	i := seq % ownersKept
	return o.id[i], o.seq[i] == seq
}

// takenTwice is a message whose number its stream's shard had already
// given to another event.
type takenTwice struct {
	at    int // the message's index in the call
	pos   *seqPos
	first string // the event id of the number's first copy
}

type streamState struct {
	stored  []byte // the committed value; nil: the stream has no row
	applied watermark.Applied
}

// load reads the committed watermarks of the partition's streams.
func (s *watermarks) load(ctx context.Context, db *gorm.DB) error {
	rows, err := s.store.Watermarks(ctx, db.WithContext(ctx), s.scope, s.topic, s.partition)
	if err != nil {
		return txn.DatabaseFailure("read watermarks", err)
	}
	streams := make(map[streamID]*streamState, len(rows))
	for _, r := range rows {
		if r.Scope != s.scope || r.Topic != s.topic || r.Partition != s.partition {
			return fmt.Errorf("consumer: the watermark store returned a row of another stream (%+v)", r.WatermarkKey)
		}
		a, err := watermark.Decode(r.Applied)
		if err != nil {
			return fmt.Errorf("consumer: watermark of source %q epoch %d: %w", r.Source, r.Epoch, err)
		}
		streams[streamID{r.Source, r.Epoch}] = &streamState{stored: slices.Clone(r.Applied), applied: a}
	}
	s.streams, s.loaded = streams, true
	return nil
}

// applied is the highest sequence number committed in p's shard, 0 if none.
func (s *watermarks) applied(p *seqPos) (int64, bool) {
	st := s.streams[p.stream]
	if st == nil {
		return 0, false
	}
	v, ok := st.applied[p.shard]
	return v, ok
}

// ensureLoaded reads the watermarks if they are not loaded, retrying while
// the database fails. ok is false when ctx ended first, or the stored
// values cannot be read (then the partition is stopped).
func (b *batchRunner) ensureLoaded(ctx, dbCtx context.Context) (ok bool) {
	if b.seq == nil || b.seq.loaded {
		return true
	}
	for attempt := 1; ; attempt++ {
		lctx, bounded, cancel := txn.WithBound(dbCtx, "the watermarks' read", b.bound)
		err := b.seq.load(lctx, b.db)
		err = bounded(err)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !b.infrastructure(err) && !errors.As(err, new(*txn.TimeoutError)) {
			b.stopPartition(&PartitionStoppedError{Topic: b.topic, Partition: b.partition, Offset: -1, Reason: ReasonInvalid, Err: err},
				"PARTITION STOPPED: the partition's stored watermarks cannot be read; nothing is consumed until they are repaired")
			return false
		}
		wait := b.retryWait(attempt)
		level := slog.LevelWarn
		if attempt >= 5 {
			level = slog.LevelError // still retried: a missing table (Migrate not run) or a failing database
		}
		b.log.Log(ctx, level, "reading the watermarks failed; retrying", append([]any{"attempt", attempt, "error", err, "retry_in", wait},
			b.host.missingTables(dbCtx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return false
		}
	}
}

// gapError is a message of an aligned stream whose number is past the
// next one expected: messages were lost or reordered upstream.
type gapError struct {
	pos      *seqPos
	expected int64
}

func (e *gapError) Error() string {
	missing := fmt.Sprintf("%d", e.expected)
	if e.pos.seq-1 > e.expected {
		missing = fmt.Sprintf("%d..%d", e.expected, e.pos.seq-1)
	}
	return fmt.Sprintf("sequence gap in source %q epoch %d shard %d: got %d, expected %d (missing or reordered upstream: %s)",
		e.pos.stream.source, e.pos.stream.epoch, e.pos.shard, e.pos.seq, e.expected, missing)
}

// firstGap returns the index of the first of items whose aligned stream
// has a gap before it, with the gap, or len(items) and nil. A stream with
// no committed number in the shard yet starts at the first number it sees:
// a new group, or a topic whose head retention deleted.
func (s *watermarks) firstGap(items []*item) (int, *gapError) {
	var next map[shardKey]int64 // the number expected next, per shard before the current run; absent: any
	var last *seqPos            // the run of one shard's messages goes on while it matches
	var lastNext int64          // the number expected next in the run
	for i, it := range items {
		p := it.seq
		if p == nil || p.partitions == 0 {
			continue
		}
		var exp int64
		ok := true
		if last != nil && p.shard == last.shard && p.stream == last.stream {
			exp = lastNext
		} else {
			if last != nil {
				if next == nil {
					next = map[shardKey]int64{}
				}
				next[shardKey{last.stream, last.shard}] = lastNext
			}
			if exp, ok = next[shardKey{p.stream, p.shard}]; !ok {
				var v int64
				if v, ok = s.applied(p); ok {
					exp = v + 1
				}
			}
		}
		if ok && p.seq > exp {
			return i, &gapError{pos: p, expected: exp}
		}
		last, lastNext = p, max(exp, p.seq+1)
	}
	return len(items), nil
}

// marks returns the dedup decision for each message of a call (seqOf[j] is
// msgs[j]'s position, nil for the inbox row): covered by the watermark,
// or new, in the chain of its stream's shard. consultRows adds the inbox
// row's claim to the new ones.
func (s *watermarks) marks(seqOf []*seqPos, consultRows bool) []batchopt.SeqMark {
	chains := map[shardKey]int{}
	sizes := map[streamID]int{} // the stream's value's length, with this call's new shards
	var marks []batchopt.SeqMark
	for j, p := range seqOf {
		if p == nil {
			continue
		}
		if marks == nil {
			marks = make([]batchopt.SeqMark, len(seqOf))
		}
		k := shardKey{p.stream, p.shard}
		if _, tracked := chains[k]; !tracked && !p.rows {
			size, ok := sizes[p.stream]
			if !ok {
				if st := s.streams[p.stream]; st != nil {
					size = len(st.stored)
				}
			}
			if _, held := s.applied(p); !held {
				// A new shard's entry: at most 3 bytes of distance and 9 of
				// number. A stream that would outgrow what the store keeps
				// leaves its further shards to the inbox row: retrying a
				// write the store refuses would never end.
				if size+12 > storage.MaxWatermarkBytes {
					p.rows = true
				} else {
					size += 12
				}
			}
			sizes[p.stream] = size
		}
		if p.rows {
			continue // the zero mark: the inbox row
		}
		c, ok := chains[k]
		if !ok {
			c = len(chains) + 1
			chains[k] = c
		}
		v, _ := s.applied(p)
		marks[j] = batchopt.SeqMark{Chain: c, Applied: p.seq <= v, Claim: consultRows}
	}
	return marks
}

// writer returns the Watermarks function of a call: for each transaction,
// the writes that move the watermark of every stream it applies messages
// of, from what the call's earlier transactions committed to what this one
// will have applied (the store's compare-and-set).
func (s *watermarks) writer(seqOf []*seqPos) func(group []int, committed []inbox.Outcome) []storage.WatermarkWrite {
	return func(group []int, committed []inbox.Outcome) []storage.WatermarkWrite {
		type draft struct {
			old     []byte
			applied watermark.Applied
		}
		drafts := map[streamID]*draft{}
		get := func(id streamID) *draft {
			d := drafts[id]
			if d == nil {
				d = &draft{applied: watermark.Applied{}}
				if st := s.streams[id]; st != nil {
					d.old = st.stored
					maps.Copy(d.applied, st.applied)
				}
				drafts[id] = d
			}
			return d
		}
		for j, o := range committed {
			if p := seqOf[j]; p != nil && !p.rows && (o == inbox.Processed || o == inbox.Duplicate) {
				if d := get(p.stream); p.seq > d.applied[p.shard] {
					d.applied[p.shard] = p.seq
					d.old = watermark.Encode(d.applied)
				}
			}
		}
		news := map[streamID]watermark.Applied{}
		for _, j := range group {
			p := seqOf[j]
			if p == nil || p.rows {
				continue
			}
			d := get(p.stream)
			n := news[p.stream]
			if n == nil {
				n = maps.Clone(d.applied)
				news[p.stream] = n
			}
			n[p.shard] = max(n[p.shard], p.seq)
		}
		var writes []storage.WatermarkWrite
		for id, n := range news {
			d := drafts[id]
			enc := watermark.Encode(n)
			if bytes.Equal(enc, d.old) {
				continue
			}
			writes = append(writes, storage.WatermarkWrite{
				WatermarkKey: storage.WatermarkKey{Scope: s.scope, Source: id.source, Epoch: id.epoch, Topic: s.topic, Partition: s.partition},
				Old:          d.old, New: enc,
			})
		}
		slices.SortFunc(writes, func(a, b storage.WatermarkWrite) int { return a.Compare(b.WatermarkKey) })
		return writes
	}
}

// committed takes in what a call committed: results[j] of the message at
// seqOf[j]. It returns the duplicates whose number the worker saw
// committed for another event: the first copy of a number wins, so they
// are not applied, but nothing of their own was.
func (s *watermarks) committed(seqOf []*seqPos, outcomes func(j int) inbox.Outcome) (twice []takenTwice) {
	touched := map[streamID]bool{}
	// A partition's messages mostly belong to one shard: the maps are
	// looked up when the shard changes, not for every message.
	var (
		last   *seqPos // the previous message's position; nil: none
		owners *numberOwners
	)
	for j, p := range seqOf {
		if p == nil || p.rows {
			continue
		}
		o := outcomes(j)
		if o != inbox.Processed && o != inbox.Duplicate {
			continue
		}
		if last == nil || p.shard != last.shard || p.stream != last.stream {
			last, owners = p, nil
		}
		if p.partitions > 0 && p.eventID != "" {
			if owners == nil {
				k := shardKey{p.stream, p.shard}
				owners = s.owners[k]
				if owners == nil {
					if s.owners == nil {
						s.owners = map[shardKey]*numberOwners{}
					}
					owners = new(numberOwners)
					s.owners[k] = owners
				}
			}
			switch first, ok := owners.get(p.seq); {
			case o == inbox.Processed && !ok:
				owners.put(p.seq, p.eventID)
			case o == inbox.Duplicate && ok && first != p.eventID:
				twice = append(twice, takenTwice{at: j, pos: p, first: first})
			}
		}
		st := s.streams[p.stream]
		if st == nil {
			st = &streamState{applied: watermark.Applied{}}
			s.streams[p.stream] = st
		}
		if p.seq > st.applied[p.shard] {
			st.applied[p.shard] = p.seq
			touched[p.stream] = true
		}
	}
	for id := range touched {
		st := s.streams[id]
		st.stored = watermark.Encode(st.applied)
	}
	return twice
}

// repeatsAt returns the index of the first of items, after the first,
// whose aligned stream's shard had a number as high or higher earlier in
// items, or len(items). Run in one call, both copies would be new to the
// watermark and both applied when they are two events; run after the first
// committed, the watermark covers the second.
func repeatsAt(items []*item) int {
	var highest map[shardKey]int64 // of the shards before the current run
	var last *seqPos               // the run of one shard's messages goes on while it matches
	for i, it := range items {
		p := it.seq
		if p == nil || p.partitions == 0 {
			continue
		}
		if last != nil && p.shard == last.shard && p.stream == last.stream {
			if p.seq <= last.seq {
				return i
			}
			last = p
			continue
		}
		if last != nil {
			if highest == nil {
				highest = map[shardKey]int64{}
			}
			highest[shardKey{last.stream, last.shard}] = last.seq
		}
		if h, ok := highest[shardKey{p.stream, p.shard}]; ok && p.seq <= h {
			return i
		}
		last = p
	}
	return len(items)
}

// reportTakenTwice logs each message whose number its stream had given to
// another event.
func (b *batchRunner) reportTakenTwice(twice []takenTwice, offsetOf func(j int) int64) {
	for _, t := range twice {
		b.log.Error("a number of a sequenced stream names two events: the first copy was applied and this event is skipped; the producer's aligned relay finds the lost race in the partition and publishes it again under a new epoch (outbox package doc, \"A producer database that goes back\")",
			"source", t.pos.stream.source, "epoch", t.pos.stream.epoch, "shard", t.pos.shard, "seq", t.pos.seq,
			"event_id", t.pos.eventID, "first_event_id", t.first, "offset", offsetOf(t.at))
	}
}

// advancePast moves the watermark of it's stream past it in a transaction
// of its own, retrying while the database fails: a message dead-lettered
// is resolved, and must not show as a gap before the next one. ok is false
// when ctx ended first.
func (b *batchRunner) advancePast(ctx, dbCtx context.Context, it *item) (ok bool) {
	p := it.seq
	if b.seq == nil || p == nil || p.rows {
		return true
	}
	seqOf := []*seqPos{p}
	for attempt := 1; ; attempt++ {
		if !b.ensureLoaded(ctx, dbCtx) {
			return false
		}
		if v, _ := b.seq.applied(p); p.seq <= v {
			return true
		}
		writes := b.seq.writer(seqOf)([]int{0}, []inbox.Outcome{0})
		err := b.transact(dbCtx, func(tx *gorm.DB) error {
			sctx, bounded, cancel := txn.WithBound(dbCtx, "the watermarks' write", b.bound)
			defer cancel()
			return bounded(b.seq.store.SaveWatermarks(sctx, tx, writes))
		})
		if err == nil {
			// A dead-lettered message took its number: a later copy of the
			// number from another event is checked against it.
			b.seq.committed(seqOf, func(int) inbox.Outcome { return inbox.Processed })
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		moved := errors.Is(err, storage.ErrWatermarkMoved)
		if !moved && !b.infrastructure(err) {
			// Nothing is lost by leaving it: the stream's next message then
			// looks like a gap, and that stops the partition loudly.
			b.log.Error("the watermark cannot be moved past a dead-lettered message; a later message of its stream may be taken for a gap",
				"offset", it.msg.Offset, "error", err)
			return true
		}
		b.seq.loaded = false
		wait := b.retryWait(attempt)
		level := slog.LevelWarn
		switch {
		case attempt >= 5:
			level = slog.LevelError // still retried: the database is failing, or members keep writing
		case moved:
			level = slog.LevelInfo
		}
		b.log.Log(ctx, level, "moving the watermark past a dead-lettered message failed; retrying",
			append([]any{"offset", it.msg.Offset, "attempt", attempt, "error", err, "retry_in", wait}, b.host.missingTables(dbCtx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return false
		}
	}
}

// cutAtGap reads the watermarks if needed and returns the messages of
// items before the first gap of an aligned stream, with the gap (the
// partition then stops at the message after it), or all of items and nil.
// stop is true when the partition stopped without a message to process
// (the watermarks cannot be read) or ctx ended. With Offsets.Store, a gap
// found while the stored offset went back behind what this worker
// committed is the database's doing: it returns no items, with b.com.lost set.
func (b *batchRunner) cutAtGap(ctx, dbCtx context.Context, items []*item) (_ []*item, _ *gapError, stop bool) {
	if b.seq == nil {
		return items, nil, false
	}
	if !b.ensureLoaded(ctx, dbCtx) {
		return nil, nil, ctx.Err() == nil
	}
	n, gap := b.seq.firstGap(items)
	if gap == nil {
		return items, nil, false
	}
	if b.com.store && b.com.floor >= 0 {
		// The watermark may have gone back with the stored offset (a
		// failover that lost commits): then the partition resumes from the
		// database's position (committer.lost, see worker.reposition) and the messages in
		// between are no gap.
		pctx, _, cancel := txn.WithBound(dbCtx, "the stored offset's read", b.bound)
		lost := b.com.readPosition(pctx)
		cancel()
		if lost {
			return nil, nil, false
		}
	}
	if !b.stopAtGap(items[n], gap) {
		return items, nil, false
	}
	return items[:n], gap, false
}

// stopAtGap stops the partition at it, the first message after a gap in
// its aligned stream, or, with Sequenced.AcceptGaps, logs the gap and goes
// on. It reports whether the partition stopped.
func (b *batchRunner) stopAtGap(it *item, gap *gapError) bool {
	if b.acceptGaps {
		b.log.Error("a sequenced stream has a gap; accepting it (Sequenced.AcceptGaps): a missing message that arrives later is taken for a duplicate and skipped",
			"offset", it.msg.Offset, "event_id", it.msg.EventID, "gap", gap.Error())
		return false
	}
	b.stopPartition(&PartitionStoppedError{Topic: b.topic, Partition: b.partition, Offset: it.msg.Offset, EventID: it.msg.EventID, Reason: ReasonSequenceGap, Err: gap},
		"PARTITION STOPPED: a message of a sequenced stream is missing before this one (lost or reordered upstream); nothing at or after it is committed until the missing message is republished, or the consumer restarted with Sequenced.AcceptGaps",
		"event_id", it.msg.EventID)
	return true
}
