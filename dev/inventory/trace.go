package inventory

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/inboxgo/inbox/hooks"
)

// A trace is one consumer process's account of where its partitions went
// and what it charged: one line per event, "unixnano kind partition offset
// scope", written unbuffered, so that the driver can read it while the
// process runs (and a killed process loses at most its last line). The
// driver compares the traces of several processes on one clock, the
// machine's.

// TraceEvent is one line of a trace.
type TraceEvent struct {
	At        time.Time
	Kind      hooks.Kind
	Partition int
	Offset    int64
	Scope     hooks.RetryScope // Retry only
}

// traced are the kinds a trace records: assignments, commits, and what a
// message was charged.
var traced = map[hooks.Kind]bool{
	hooks.Processed: true, hooks.Duplicate: true, hooks.Assigned: true, hooks.Revoked: true,
	hooks.Retry: true, hooks.DeadLettered: true, hooks.PartitionStopped: true,
}

// traceEvents returns a hook that appends the traced events to w.
func traceEvents(w io.Writer) func(hooks.Event) {
	return func(e hooks.Event) {
		if !traced[e.Kind] {
			return
		}
		line := fmt.Sprintf("%d %d %d %d %d\n", time.Now().UnixNano(), int(e.Kind), e.Partition, e.Offset, int(e.Scope))
		_, _ = w.Write([]byte(line))
	}
}

// ReadTrace reads a trace; a missing file is an empty trace, and a last
// line cut short (the process was writing it) is left out.
func ReadTrace(path string) ([]TraceEvent, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []TraceEvent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 5 {
			continue
		}
		var n [5]int64
		ok := true
		for i, s := range fields {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				ok = false
				break
			}
			n[i] = v
		}
		if !ok {
			continue
		}
		out = append(out, TraceEvent{At: time.Unix(0, n[0]), Kind: hooks.Kind(n[1]), Partition: int(n[2]), Offset: n[3], Scope: hooks.RetryScope(n[4])})
	}
	return out, sc.Err()
}

// Owned returns the partitions a trace says its process held at t: the
// last Assigned of each, not followed by a Revoked, up to t.
func Owned(trace []TraceEvent, t time.Time) map[int]bool {
	owned := map[int]bool{}
	for _, e := range trace {
		if e.At.After(t) {
			break
		}
		switch e.Kind {
		case hooks.Assigned:
			owned[e.Partition] = true
		case hooks.Revoked:
			delete(owned, e.Partition)
		}
	}
	return owned
}

// FirstCommit returns the time of the first Processed or Duplicate of
// partition after t in a trace (the event follows the database commit),
// and false if there is none.
func FirstCommit(trace []TraceEvent, partition int, t time.Time) (time.Time, bool) {
	for _, e := range trace {
		if e.Partition == partition && e.At.After(t) && (e.Kind == hooks.Processed || e.Kind == hooks.Duplicate) {
			return e.At, true
		}
	}
	return time.Time{}, false
}

// Charged returns the events of a trace that charged a message: a retry of
// the message itself (an attempt counted), a dead letter, a stopped
// partition.
func Charged(trace []TraceEvent) []TraceEvent {
	var out []TraceEvent
	for _, e := range trace {
		if e.Kind == hooks.Retry && e.Scope == hooks.RetryMessage || e.Kind == hooks.DeadLettered || e.Kind == hooks.PartitionStopped {
			out = append(out, e)
		}
	}
	return out
}

func (e TraceEvent) String() string {
	s := fmt.Sprintf("%s %v partition %d offset %d", e.At.UTC().Format("15:04:05.000"), e.Kind, e.Partition, e.Offset)
	if e.Kind == hooks.Retry {
		s += " (" + e.Scope.String() + ")"
	}
	return s
}
