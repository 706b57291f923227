package inventory

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/inboxgo/inbox/hooks"
)

// A trace read back tells where the partitions were and what was charged.
func TestTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.trace")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	on := traceEvents(f)
	t0 := time.Now()
	on(hooks.Event{Kind: hooks.Assigned, Partition: 1, Offset: 0})
	on(hooks.Event{Kind: hooks.Assigned, Partition: 2, Offset: 0})
	on(hooks.Event{Kind: hooks.Lag, Partition: 2, Lag: 5}) // not traced
	on(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryBatch, Partition: 1, Offset: -1})
	time.Sleep(2 * time.Millisecond)
	mid := time.Now()
	time.Sleep(2 * time.Millisecond)
	on(hooks.Event{Kind: hooks.Processed, Partition: 2, Offset: 7})
	on(hooks.Event{Kind: hooks.Revoked, Partition: 1})
	on(hooks.Event{Kind: hooks.Retry, Scope: hooks.RetryMessage, Partition: 2, Offset: 8})
	f.Close()
	// A line cut short by a killed process is left out.
	if err := os.WriteFile(path, append(must(os.ReadFile(path)), []byte("17 1 2")...), 0o644); err != nil {
		t.Fatal(err)
	}

	trace, err := ReadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(trace) != 6 {
		t.Fatalf("%d events read, want 6: %v", len(trace), trace)
	}
	if got := Owned(trace, mid); !got[1] || !got[2] || len(got) != 2 {
		t.Errorf("owned at mid: %v, want 1 and 2", got)
	}
	if got := Owned(trace, time.Now()); !got[2] || len(got) != 1 {
		t.Errorf("owned at the end: %v, want 2", got)
	}
	if at, ok := FirstCommit(trace, 2, mid); !ok || !at.After(mid) {
		t.Errorf("first commit on 2 after mid: %v %v", at, ok)
	}
	if _, ok := FirstCommit(trace, 1, t0.Add(-time.Second)); ok {
		t.Error("a commit on 1, which had none")
	}
	charged := Charged(trace)
	if len(charged) != 1 || charged[0].Scope != hooks.RetryMessage || charged[0].Offset != 8 {
		t.Errorf("charged %v, want the message retry at offset 8 alone (a batch retry charges nothing)", charged)
	}
	if missing, err := ReadTrace(filepath.Join(t.TempDir(), "none")); err != nil || missing != nil {
		t.Errorf("a missing trace: %v, %v", missing, err)
	}
	if !bytes.Contains([]byte(charged[0].String()), []byte("(message)")) {
		t.Errorf("String %q names no scope", charged[0].String())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
