package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// queueReader hands out queued messages at once, and waits for ctx when it
// has none, as a reader at the partition's end does.
type queueReader struct{ queue []kafka.Message }

func (r *queueReader) SetOffset(int64) error { return nil }
func (r *queueReader) Close() error          { return nil }
func (r *queueReader) CaughtUp() bool        { return len(r.queue) == 0 }

func (r *queueReader) Fetch(ctx context.Context) (kafka.Message, error) {
	if len(r.queue) == 0 {
		<-ctx.Done()
		return kafka.Message{}, ctx.Err()
	}
	m := r.queue[0]
	r.queue = r.queue[1:]
	return m, nil
}

// A batch that can be processed now does not wait for BatchWait when its
// reader is at the partition's end; what is fetched already goes in it.
func TestBatchDoesNotWaitAtPartitionEnd(t *testing.T) {
	const wait = 5 * time.Second
	w := &worker{part: &part{log: slog.New(slog.DiscardHandler)}, fetchSettings: fetchSettings{batchSize: 10, batchWait: wait, idle: time.Second}}
	r := &queueReader{queue: []kafka.Message{{Offset: 1}, {Offset: 2}, {Offset: 3}}}
	start := time.Now()
	batch := w.fetch(t.Context(), r)
	if took := time.Since(start); took > wait/2 {
		t.Fatalf("the batch waited %v with nothing more fetched (BatchWait %v)", took, wait)
	}
	if len(batch) != 3 {
		t.Fatalf("batch of %d messages, want the 3 fetched", len(batch))
	}
}
