package outbox_test

import (
	"fmt"
	"time"

	"github.com/inboxgo/inbox/outbox"
)

// Event ids are UUIDv7 when the caller gives none: they carry the event
// time, and the event time header carries it too.
func ExampleNewEventID() {
	at := time.Date(2026, 12, 1, 3, 4, 5, 0, time.UTC)
	id := outbox.NewEventID(at)
	fmt.Println(len(id), id[:13], id[14:15])
	// Output: 36 01a22f8f-3888 7
}
