package inbox_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// A handler marks the failures that another run of the transaction may
// cure (a lock it could not get, a service that answered 503): the inbox
// then rolls back and runs the transaction again, within
// Config.MaxAttempts. Unmarked errors (a malformed payload, which fails the
// same way every time) are returned at once. The mark keeps the error's
// text and chain, so errors.Is and errors.As still find the cause; it never
// makes the error a database failure: each run counts as an attempt.
func ExampleRetryable() {
	errUnavailable := errors.New("warehouse API: 503 Service Unavailable")

	err := fmt.Errorf("reserve sku-7: %w", inbox.Retryable(errUnavailable))
	fmt.Println(err)
	fmt.Println(errors.Is(err, errUnavailable), inbox.IsDatabaseFailure(err))
	// Output:
	// reserve sku-7: warehouse API: 503 Service Unavailable
	// true false
}

// The inbox key holds the UTC calendar day of the producer's event time, so
// an event stamped late in the evening in Tokyo belongs to the previous UTC
// day, in every redelivery and whatever the consumer's own clock or zone.
func ExampleMessage_Day() {
	tokyo := time.FixedZone("JST", 9*60*60)
	msg := inbox.Message{
		Consumer: "billing",
		ID:       "order-42-placed",
		Time:     time.Date(2026, 12, 1, 8, 30, 0, 0, tokyo),
	}
	fmt.Println(msg.Day().Format(time.DateOnly), msg.Validate())

	msg.ID = ""
	err := msg.Validate()
	fmt.Println(err, errors.Is(err, inbox.ErrInvalidMessage))
	// Output:
	// 2026-11-30 <nil>
	// inbox: invalid event id: empty true
}

// Adapters check every configured table and schema name before it goes
// into SQL; a third-party storage.InboxStore should do the same. The error wraps
// ErrInvalidConfig.
func ExampleValidateIdentifier() {
	fmt.Println(storage.ValidateIdentifier("table name", "inbox_messages"))
	err := storage.ValidateIdentifier("table name", "inbox-messages; DROP TABLE orders")
	fmt.Println(err)
	fmt.Println(errors.Is(err, inbox.ErrInvalidConfig))
	// Output:
	// <nil>
	// inbox: invalid table name "inbox-messages; DROP TABLE orders": must be 1-63 ASCII letters, digits or underscores, not starting with a digit
	// true
}
