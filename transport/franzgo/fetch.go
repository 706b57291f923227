package franzgo

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/inboxgo/inbox/transport"
)

// readerBufferBytes is how much a reader holds before its partition's
// fetching pauses; it resumes once the reader drained half of it.
const readerBufferBytes = 1 << 20

var errReaderClosed = errors.New("franzgo: the partition reader is closed")

// fetcher is the direct consumer every reader of a group fetches through,
// and its poll loop. Every change of what the client fetches (adding a
// partition, moving it, removing it) runs on the poll loop between two
// polls, so that a poll's records are known to come from before or after
// it: a reader moved (SetOffset) while a poll was under way drops that
// poll's records of its partition.
type fetcher struct {
	cl  *kgo.Client
	log *slog.Logger

	mu      sync.Mutex
	readers map[tp]*reader
	ops     []func()
	// interrupt ends the poll under way, for ops to run.
	interrupt context.CancelFunc
}

func newFetcher(cl *kgo.Client, log *slog.Logger) *fetcher {
	return &fetcher{cl: cl, log: log, readers: map[tp]*reader{}}
}

func (f *fetcher) do(op func()) {
	f.mu.Lock()
	f.ops = append(f.ops, op)
	if f.interrupt != nil {
		f.interrupt()
	}
	f.mu.Unlock()
}

func (f *fetcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		f.mu.Lock()
		ops := f.ops
		f.ops = nil
		f.mu.Unlock()
		for _, op := range ops {
			op()
		}
		f.mu.Lock()
		if len(f.ops) > 0 {
			f.mu.Unlock()
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		f.interrupt = cancel
		f.mu.Unlock()
		fs := f.cl.PollFetches(pctx)
		f.mu.Lock()
		f.interrupt = nil
		f.mu.Unlock()
		cancel()
		if fs.IsClientClosed() {
			return
		}
		f.distribute(fs)
	}
}

func (f *fetcher) distribute(fs kgo.Fetches) {
	var recreated []string
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		f.mu.Lock()
		r := f.readers[tp{p.Topic, p.Partition}]
		f.mu.Unlock()
		if r == nil {
			return
		}
		if p.Err != nil && !errors.Is(p.Err, context.Canceled) {
			r.fail(p.Err)
			if errors.Is(p.Err, kerr.UnknownTopicID) && !slices.Contains(recreated, p.Topic) {
				recreated = append(recreated, p.Topic)
			}
		}
		if len(p.Records) > 0 {
			r.put(p.Records, p.HighWatermark)
		}
	})
	for _, t := range recreated {
		f.readopt(t)
	}
}

// readopt runs on the poll loop. It follows a topic deleted and created
// again under its name, as kafka-go (which knows topics by name only)
// does: franz-go keeps the topic ID it first saw and fails every fetch
// with UNKNOWN_TOPIC_ID until the topic is purged and added again, so
// without this the partitions would stall for good. The readers go on
// from where they were; judging the new log (a stored or committed offset
// past its end) is the consumer's business, as on kafka-go.
func (f *fetcher) readopt(topic string) {
	f.log.Warn("franz-go: the topic has a new ID (deleted and created again); fetching it under the new one", "topic", topic)
	f.cl.PurgeTopicsFromConsuming(topic)
	var rs []*reader
	f.mu.Lock()
	for k, r := range f.readers {
		if k.topic == topic {
			rs = append(rs, r)
		}
	}
	f.mu.Unlock()
	for _, r := range rs {
		r.mu.Lock()
		if r.live {
			r.pos = r.floor
		}
		r.added, r.live, r.moving = false, false, true
		if r.paused {
			r.paused = false
			r.f.cl.ResumeFetchPartitions(map[string][]int32{r.k.topic: {r.k.partition}})
		}
		r.mu.Unlock()
		r.applySeek()
	}
}

// reader returns the reader of k, starting at offset (the assignment's:
// a concrete offset, or FirstOffset / LastOffset).
func (f *fetcher) reader(k tp, offset int64) *reader {
	r := &reader{f: f, k: k, pos: offset, moving: true, floor: max(offset, 0), wake: make(chan struct{}, 1)}
	f.mu.Lock()
	f.readers[k] = r
	f.mu.Unlock()
	f.do(r.applySeek)
	return r
}

// reader is a PartitionReader: the records the poll loop put, in order.
type reader struct {
	f *fetcher
	k tp

	mu sync.Mutex
	// pos is where the client must fetch from; moving says it has not yet.
	pos    int64
	moving bool
	// added: the client fetches the partition; live: a record came since
	// it was added, so the client has the partition's cursor, which
	// SetOffsets moves (before that, SetOffsets would miss it and the
	// partition is added again instead).
	added, live bool
	// floor is the lowest offset Fetch may return next: the offset set,
	// or past the last record put. The client, sent past the log end,
	// resets (to the log end, the log start, or the last record's
	// timestamp) and fetches forward from there; the records below the
	// offset set are dropped, so the reader waits there as the contract
	// asks, at the cost of reading them.
	floor  int64
	buf    []kafka.Message
	bytes  int
	paused bool
	err    error
	last   *kafka.Message
	closed bool
	wake   chan struct{}
}

var _ transport.PartitionReader = (*reader)(nil)

func (r *reader) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// seekLocked asks the poll loop to move the client to r.pos.
func (r *reader) seekLocked() {
	r.moving = true
	r.f.do(r.applySeek)
}

// applySeek runs on the poll loop.
func (r *reader) applySeek() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || !r.moving {
		return
	}
	r.moving = false
	t, p := r.k.topic, r.k.partition
	switch {
	case r.added && r.live:
		r.f.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{t: {p: {Epoch: -1, Offset: r.pos}}})
	default:
		// Removed first even if this reader never added it: the client
		// keeps the cursor of a partition an earlier reader added, and
		// AddConsumePartitions would not move it.
		r.f.cl.RemoveConsumePartitions(map[string][]int32{t: {p}})
		at := kgo.NewOffset().At(r.pos)
		switch r.pos {
		case transport.FirstOffset:
			at = kgo.NewOffset().AtStart()
		case transport.LastOffset:
			at = kgo.NewOffset().AtEnd()
		}
		r.f.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{t: {p: at}})
		r.added, r.live = true, false
	}
}

// put runs on the poll loop.
func (r *reader) put(recs []*kgo.Record, hwm int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.moving {
		return // the records of before a SetOffset
	}
	r.live = true
	n := 0
	for _, rec := range recs {
		if rec.Offset < r.floor {
			continue
		}
		m := messageOf(rec, hwm)
		r.buf = append(r.buf, m)
		r.bytes += len(m.Key) + len(m.Value)
		r.floor = rec.Offset + 1
		n++
	}
	if n > 0 {
		r.signal()
	}
	if r.bytes >= readerBufferBytes && !r.paused {
		r.paused = true
		r.f.cl.PauseFetchPartitions(map[string][]int32{r.k.topic: {r.k.partition}})
		r.f.log.Debug("franz-go: the partition reader's buffer is full; fetching it pauses", "topic", r.k.topic, "partition", r.k.partition, "bytes", r.bytes)
	}
}

func (r *reader) fail(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	r.signal()
}

func (r *reader) SetOffset(offset int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errReaderClosed
	}
	r.pos, r.floor = offset, offset
	r.buf, r.bytes, r.err, r.last = nil, 0, nil, nil
	r.resumeLocked()
	r.seekLocked()
	return nil
}

func (r *reader) resumeLocked() {
	if r.paused {
		r.paused = false
		r.f.cl.ResumeFetchPartitions(map[string][]int32{r.k.topic: {r.k.partition}})
	}
}

func (r *reader) Fetch(ctx context.Context) (kafka.Message, error) {
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return kafka.Message{}, errReaderClosed
		}
		if len(r.buf) > 0 {
			m := r.buf[0]
			r.buf[0] = kafka.Message{}
			r.buf = r.buf[1:]
			r.bytes -= len(m.Key) + len(m.Value)
			r.last = &m
			if r.paused && r.bytes < readerBufferBytes/2 {
				r.resumeLocked()
			}
			r.mu.Unlock()
			return m, nil
		}
		if err := r.err; err != nil {
			r.err = nil
			r.mu.Unlock()
			return kafka.Message{}, err
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return kafka.Message{}, ctx.Err()
		case <-r.wake:
		}
	}
}

func (r *reader) CaughtUp() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last != nil && len(r.buf) == 0 && r.last.HighWaterMark <= r.last.Offset+1
}

func (r *reader) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.buf = nil
	r.resumeLocked()
	r.mu.Unlock()
	r.signal()
	f := r.f
	f.mu.Lock()
	if f.readers[r.k] == r {
		delete(f.readers, r.k)
	}
	f.mu.Unlock()
	f.do(func() {
		f.mu.Lock()
		again := f.readers[r.k] != nil
		f.mu.Unlock()
		if again {
			return // a new reader of the partition moved the client already
		}
		f.cl.RemoveConsumePartitions(map[string][]int32{r.k.topic: {r.k.partition}})
	})
	return nil
}
