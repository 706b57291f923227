package inbox

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/inboxgo/inbox/internal/short"
	"github.com/inboxgo/inbox/storage"
)

var (
	// ErrInvalidMessage is wrapped by every *ValidationError.
	ErrInvalidMessage = errors.New("inbox: invalid message")
	// ErrExpired is returned, under the default [RejectExpired] policy, for
	// an event whose day is older than the retention window: its inbox row may
	// already have been removed, so the inbox cannot tell whether the event was
	// processed. Nothing was applied; route the message to a dead-letter queue
	// or decide by hand.
	ErrExpired = errors.New("inbox: event is older than the retention window")
	// ErrHandlerPanic is wrapped by every *PanicError.
	ErrHandlerPanic = errors.New("inbox: handler panicked")
	// ErrPermanent is wrapped by every error marked with [Permanent], also
	// when the handler wrapped the marked error further.
	ErrPermanent = errors.New("inbox: permanent failure")
	// ErrInvalidConfig is wrapped by configuration errors from New and the
	// adapters' constructors.
	ErrInvalidConfig = storage.ErrInvalidConfig
)

// ValidationError says which part of a message or name is unusable and why.
type ValidationError struct {
	Field  string
	Value  string // the offending value, shortened for display; empty if not useful
	Reason string

	sentinel error // ErrInvalidConfig for names; nil means ErrInvalidMessage
}

func (e *ValidationError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("inbox: invalid %s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("inbox: invalid %s %q: %s", e.Field, short.String(e.Value), e.Reason)
}

func (e *ValidationError) Unwrap() error {
	if e.sentinel != nil {
		return e.sentinel
	}
	return ErrInvalidMessage
}

// ExpiredError is the error for an event older than the retention window.
type ExpiredError struct {
	Day    time.Time // the event's day
	Oldest time.Time // the oldest day the inbox still guarantees to hold
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("inbox: event day %s is older than the retention window (oldest checked day %s): cannot tell whether it was processed",
		e.Day.Format(time.DateOnly), e.Oldest.Format(time.DateOnly))
}

func (e *ExpiredError) Unwrap() error { return ErrExpired }

// PanicError carries a recovered handler panic. The transaction was rolled
// back.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("inbox: handler panicked: %v", e.Value) }

func (e *PanicError) Unwrap() error { return ErrHandlerPanic }

func newPanicError(v any) *PanicError { return &PanicError{Value: v, Stack: debug.Stack()} }

type retryableError struct{ err error }

func (e retryableError) Error() string { return e.err.Error() }
func (e retryableError) Unwrap() error { return e.err }

// Retryable marks a handler error as transient: the inbox rolls the
// transaction back and runs it again, within its attempt limit (each run
// counts). Under a consumer.Consumer, which owns the retries of what it
// runs, every handler error counts an attempt of the consumer's, marked or
// not. Handler errors that are not marked are returned at once, unless a
// statement of the transaction failed with a transient database error (a
// deadlock raised by the handler's own statement): that is a database
// failure, see [IsDatabaseFailure]. Marking never makes an error a database
// failure. An error also marked [Permanent] is not retried.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return retryableError{err: err}
}

// isMarkedRetryable reports whether err, or an error it wraps, was marked
// with [Retryable].
func isMarkedRetryable(err error) bool {
	var r retryableError
	return errors.As(err, &r)
}

type permanentError struct{ err error }

func (e permanentError) Error() string   { return e.err.Error() }
func (e permanentError) Unwrap() []error { return []error{e.err, ErrPermanent} }

// Permanent marks a handler error as the message's permanent failure: no
// run of it can succeed (a payload that does not decode, a reference that
// will never exist). The inbox never runs its transaction again, even if
// the error is also marked [Retryable]; a consumer.Consumer sends the
// message to its failure policy (dead letter or stopped partition) at the
// first such failure instead of retrying it MaxAttempts times. The mark
// survives further wrapping (fmt.Errorf with %w): test it with [IsPermanent]
// or errors.Is(err, ErrPermanent). The error's text is err's. A database
// failure ([IsDatabaseFailure]) stays one, marked or not: the database, not
// the message, failed, and it is retried as such.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// [Permanent].
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }
