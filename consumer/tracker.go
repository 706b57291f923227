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
	next    int64   // the committable offset; -1 until known
	pending []int64 // fetched offsets not yet below next, ascending
	done    map[int64]bool
}

func newOffsetTracker(start int64) *offsetTracker {
	if start < 0 {
		start = -1 // a sentinel such as kafka.FirstOffset: learnt from the first fetch
	}
	return &offsetTracker{next: start, done: make(map[int64]bool)}
}

// fetched records that offset was handed out. Offsets must be fetched in
// ascending order.
func (t *offsetTracker) fetched(offset int64) error {
	if offset < 0 {
		return fmt.Errorf("consumer: negative offset %d", offset)
	}
	if n := len(t.pending); n > 0 && offset <= t.pending[n-1] {
		return fmt.Errorf("consumer: offset %d fetched after %d", offset, t.pending[n-1])
	}
	if t.next >= 0 && offset < t.next {
		return fmt.Errorf("consumer: offset %d fetched below the committable offset %d", offset, t.next)
	}
	if t.next < 0 {
		t.next = offset
	}
	t.pending = append(t.pending, offset)
	return nil
}

// markDone records that the message at offset is finished (its effect
// committed, or it was dead-lettered).
func (t *offsetTracker) markDone(offset int64) error {
	if _, ok := slices.BinarySearch(t.pending, offset); !ok {
		return fmt.Errorf("consumer: offset %d completed but not pending", offset)
	}
	t.done[offset] = true
	n := 0
	for n < len(t.pending) && t.done[t.pending[n]] {
		delete(t.done, t.pending[n])
		t.next = t.pending[n] + 1
		n++
	}
	t.pending = slices.Delete(t.pending, 0, n)
	return nil
}

// committable returns the next offset to read once everything done so far is
// committed, and false while nothing is known (no committed start offset and
// nothing fetched yet).
func (t *offsetTracker) committable() (int64, bool) {
	return t.next, t.next >= 0
}

// inFlight is how many fetched messages are not finished.
func (t *offsetTracker) inFlight() int { return len(t.pending) }
