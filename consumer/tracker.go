package consumer

import (
	"fmt"
	"slices"
)

// offsetTracker follows the messages fetched from one partition and tells
// which offset may be committed: the offset after the highest processed
// message below which every fetched message is processed too. Messages may
// complete in any order; a message that is not done holds back the commit of
// everything after it.
//
// Offsets need not be consecutive (compaction and transaction markers leave
// gaps): only fetched offsets count. The tracker is not safe for concurrent
// use; each partition worker owns one.
type offsetTracker struct {
	next int64 // the committable offset; -1 until known
	// pending[head:] are the fetched offsets not yet below next, ascending;
	// done[i] says pending[i] is finished. Both are slices, not a map, and
	// consumed from head: a partition finishes its messages mostly in
	// order, and this bookkeeping runs for every message.
	pending []int64
	done    []bool
	head    int
}

func newOffsetTracker(start int64) *offsetTracker {
	if start < 0 {
		start = -1 // a sentinel such as kafka.FirstOffset: learnt from the first fetch
	}
	return &offsetTracker{next: start}
}

// fetched records that offset was handed out. Offsets must be fetched in
// ascending order.
func (t *offsetTracker) fetched(offset int64) error {
	if offset < 0 {
		return fmt.Errorf("consumer: negative offset %d", offset)
	}
	if n := len(t.pending); n > t.head && offset <= t.pending[n-1] {
		return fmt.Errorf("consumer: offset %d fetched after %d", offset, t.pending[n-1])
	}
	if t.next >= 0 && offset < t.next {
		return fmt.Errorf("consumer: offset %d fetched below the committable offset %d", offset, t.next)
	}
	if t.next < 0 {
		t.next = offset
	}
	if t.head > 0 && t.head == len(t.pending) {
		// Everything is finished: start the slices over, keeping their
		// arrays.
		t.pending, t.done, t.head = t.pending[:0], t.done[:0], 0
	} else if t.head > 0 && t.head >= cap(t.pending)/2 && len(t.pending) == cap(t.pending) {
		// Full, half of it finished: move the rest down instead of growing.
		n := copy(t.pending, t.pending[t.head:])
		copy(t.done, t.done[t.head:])
		t.pending, t.done, t.head = t.pending[:n], t.done[:n], 0
	}
	t.pending = append(t.pending, offset)
	t.done = append(t.done, false)
	return nil
}

// markDone records that the message at offset is finished (its effect
// committed, or it was dead-lettered).
func (t *offsetTracker) markDone(offset int64) error {
	i, ok := slices.BinarySearch(t.pending[t.head:], offset)
	if !ok {
		return fmt.Errorf("consumer: offset %d completed but not pending", offset)
	}
	t.done[t.head+i] = true
	for t.head < len(t.pending) && t.done[t.head] {
		t.next = t.pending[t.head] + 1
		t.head++
	}
	return nil
}

// committable returns the next offset to read once everything done so far is
// committed, and false while nothing is known (no committed start offset and
// nothing fetched yet).
func (t *offsetTracker) committable() (int64, bool) {
	return t.next, t.next >= 0
}

// inFlight is how many fetched messages are not finished.
func (t *offsetTracker) inFlight() int { return len(t.pending) - t.head }
