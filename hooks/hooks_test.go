package hooks_test

import (
	"context"
	"testing"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/storage"
)

// The mark of WithSequenced is for the one message it names: not for
// another message traced under a context derived from it (an inbox call
// made by the handler), nor for a context without it.
func TestSequencedMarksOneMessage(t *testing.T) {
	row := storage.InboxRow{Consumer: "reserve-stock", EventID: "evt-1", Topic: "orders", Partition: 2, Offset: 41}
	ctx := hooks.WithSequenced(t.Context(), row)
	if !hooks.IsSequenced(ctx, row) {
		t.Error("the marked message is not reported sequenced")
	}
	derived, cancel := context.WithCancel(ctx)
	defer cancel()
	if !hooks.IsSequenced(derived, row) {
		t.Error("the mark is lost in a derived context")
	}
	other := row
	other.Consumer = "ledger"
	if hooks.IsSequenced(derived, other) {
		t.Error("another consumer's message under the marked context is reported sequenced")
	}
	other = row
	other.Offset++
	if hooks.IsSequenced(derived, other) {
		t.Error("another offset's message under the marked context is reported sequenced")
	}
	if hooks.IsSequenced(t.Context(), row) {
		t.Error("a context without the mark reports the message sequenced")
	}
}
