package txn

import (
	"context"
	"testing"
	"time"
)

// detach's context outlives its parent by the grace, no more, and keeps the
// parent's deadline (shifted by the grace) so that GORM's Begin adds no
// DefaultTransactionTimeout where it would not have to the parent.
func TestDetach(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(t.Context(), key{}, "v"))
	dctx, release := detach(parent, 50*time.Millisecond)
	defer release()
	if dctx.Value(key{}) != "v" {
		t.Error("the detached context lost the parent's values")
	}
	if _, ok := dctx.Deadline(); ok {
		t.Error("a deadline without one on the parent")
	}
	cancel()
	select {
	case <-dctx.Done():
		t.Fatal("cancelled with its parent")
	case <-time.After(20 * time.Millisecond):
	}
	select {
	case <-dctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not cancelled a grace after its parent")
	}

	d := time.Now().Add(time.Hour)
	parent, cancel = context.WithDeadline(t.Context(), d)
	defer cancel()
	dctx, release = detach(parent, time.Minute)
	if got, ok := dctx.Deadline(); !ok || !got.Equal(d.Add(time.Minute)) {
		t.Errorf("deadline %v %v, want the parent's plus the grace", got, ok)
	}
	release()
	if dctx.Err() == nil {
		t.Error("release did not cancel it")
	}
}
