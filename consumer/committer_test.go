package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/transport"
)

// recordingGen is a transport.Generation that records the commits.
type recordingGen struct {
	transport.Generation
	commits []int64
	fail    error
}

func (g *recordingGen) ID() int32 { return 1 }

func (g *recordingGen) Commit(topic string, partition int, next int64) error {
	if g.fail != nil {
		return g.fail
	}
	g.commits = append(g.commits, next)
	return nil
}

// recordingHost is a host that records the events.
type recordingHost struct {
	host
	events []hooks.Event
}

func (h *recordingHost) emit(e hooks.Event) { h.events = append(h.events, e) }

// The committer stands alone: it commits the offset after the finished
// messages once it moved, at most once per interval unless forced, never
// past a message not finished, and reports the commit as its partition's.
func TestCommitterCommitsWhatIsFinished(t *testing.T) {
	gen, h := &recordingGen{}, &recordingHost{}
	p := &part{topic: "t", partition: 3, gen: gen, log: slog.New(slog.DiscardHandler), host: h}
	com := &committer{part: p, commitSettings: commitSettings{interval: time.Hour}, lastCommitted: 10, floor: -1}
	com.restart(10)
	ctx := context.Background()
	for o := int64(10); o < 14; o++ {
		if err := com.tracker.fetched(o); err != nil {
			t.Fatal(err)
		}
	}
	com.commit(ctx, true)
	if len(gen.commits) != 0 {
		t.Fatalf("committed %v with nothing finished", gen.commits)
	}
	for _, o := range []int64{10, 11, 13} {
		if err := com.tracker.markDone(o); err != nil {
			t.Fatal(err)
		}
	}
	com.commit(ctx, false)
	if want := []int64{12}; !slices.Equal(gen.commits, want) {
		t.Fatalf("commits %v, want %v: up to the message not finished", gen.commits, want)
	}
	if err := com.tracker.markDone(12); err != nil {
		t.Fatal(err)
	}
	com.commit(ctx, false)
	if len(gen.commits) != 1 {
		t.Fatalf("committed again within the interval: %v", gen.commits)
	}
	com.commit(ctx, true)
	if want := []int64{12, 14}; !slices.Equal(gen.commits, want) {
		t.Fatalf("commits %v, want %v after a forced commit", gen.commits, want)
	}
	if len(h.events) != 2 || h.events[1].Kind != hooks.Committed || h.events[1].Topic != "t" || h.events[1].Partition != 3 || h.events[1].Offset != 14 {
		t.Fatalf("events %+v, want two Committed of t/3, the last at 14", h.events)
	}

	// A refused commit is retried by the next one.
	gen.fail = errors.New("coordinator moving")
	if err := com.tracker.fetched(14); err != nil {
		t.Fatal(err)
	}
	if err := com.tracker.markDone(14); err != nil {
		t.Fatal(err)
	}
	com.commit(ctx, true)
	gen.fail = nil
	com.commit(ctx, true)
	if want := []int64{12, 14, 15}; !slices.Equal(gen.commits, want) {
		t.Fatalf("commits %v, want %v", gen.commits, want)
	}
}
