// Package hooks is how observability reaches into the inbox, the consumer
// and the outbox relay: one [Event] type for everything they report, and
// hooks that stack. It is for whoever feeds metrics, logs or traces
// (the module github.com/inboxgo/inbox/otel is such a hook); applications
// only put hooks into a Config's Hooks list.
//
// A [Hook] is any value; each of inbox.Config, consumer.Config and
// outbox.RelayConfig takes a list of them, and calls every hook that
// implements an interface for what it reports: [EventHook] for events,
// [MessageTracer], [ClaimTracer] and [HandlerTracer] around the inbox's work
// on a message (consumer.ContextHook, in package consumer, for the context
// a Kafka message is processed under). A hook implements only the
// interfaces it cares about; hooks are called in list order.
//
// Each outcome is reported once, by whoever decides it: an inbox used on
// its own reports every message's outcome; an inbox driven by a
// consumer.Consumer reports none (the consumer decides a message's fate,
// after its retries, dead letters and stored offsets) and the consumer
// reports them instead. Tracers are called by the inbox in both cases. A
// consumer.Config whose Hooks is nil takes its inbox's, so hooks given
// once, to the inbox, see each event once.
package hooks

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/storage"
)

// Hook is a value implementing one or more of this package's interfaces
// (or consumer.ContextHook). The New of a Config that takes hooks refuses
// one implementing none (a bare function, a mistyped value), with an error
// wrapping inbox.ErrInvalidConfig; a nil hook is left out.
//
// Hooks are called synchronously on the path of the work they report: they
// must be fast, safe for concurrent use, and must not panic.
type Hook any

// EventHook receives every [Event].
type EventHook interface {
	OnEvent(Event)
}

// EventFunc is an [EventHook] made of a function.
type EventFunc func(Event)

// OnEvent calls f(ev).
func (f EventFunc) OnEvent(ev Event) { f(ev) }

// MessageTracer surrounds one message of an inbox's Process, ProcessTx,
// ProcessBatch or ProcessBatchFunc call, from the call's start to its
// result: end receives the message's outcome (Processed, Duplicate or
// Failed) and, when Failed, its error. A message rejected before any
// transaction (invalid, expired) is reported too. The context it returns is
// the parent of the message's claim and handler spans and is what the
// handler's context derives from.
//
// Every tracer returns the context to use for what it surrounds (derived
// from the one passed in; nil keeps that one) and an end function (nil
// allowed), which is called exactly once, from the same goroutine, when the
// work is over.
//
// The inbox marks the context of each message its caller (a
// consumer.Consumer) deduplicates by a sequenced stream's watermark rather
// than an inbox row (see Event.Sequenced); [IsSequenced] tells a tracer
// which path the message takes.
type MessageTracer interface {
	TraceMessage(ctx context.Context, row storage.InboxRow) (context.Context, func(outcome Kind, err error))
}

// sequencedKey is the context key of the mark of WithSequenced.
type sequencedKey struct{}

// sequencedMark names the message a mark of WithSequenced is for: a
// message of an inbox call made under a derived context (from the
// handler) is not that one.
type sequencedMark struct {
	consumer, eventID, topic string
	partition                int32
	offset                   int64
}

func markOf(row storage.InboxRow) sequencedMark {
	return sequencedMark{consumer: row.Consumer, eventID: row.EventID, topic: row.Topic, partition: row.Partition, offset: row.Offset}
}

// WithSequenced returns ctx marked for the message row names (by its
// Consumer, EventID, Topic, Partition and Offset; Day and EventTime are
// not compared): it is deduplicated by its sequenced stream's watermark,
// not by an inbox row. The inbox calls the MessageTracers of such a message
// under a context so marked.
func WithSequenced(ctx context.Context, row storage.InboxRow) context.Context {
	return context.WithValue(ctx, sequencedKey{}, markOf(row))
}

// IsSequenced reports whether ctx carries the mark of [WithSequenced] for
// the message row names. A MessageTracer calls it with the ctx and row it
// was given; a message of another inbox call made under a context derived
// from that one (a handler's call of another inbox) is not marked by it.
func IsSequenced(ctx context.Context, row storage.InboxRow) bool {
	m, ok := ctx.Value(sequencedKey{}).(sequencedMark)
	return ok && m == markOf(row)
}

// ClaimTracer surrounds each claim of inbox rows: once per transaction
// attempt (a retried transaction claims again), for all the rows of the
// transaction, with BEGIN where the store pipelines the two
// (storage.ClaimBeginner). end receives, on success, which rows were new
// (inserted[i] for rows[i]); on failure, the error and nil. Its parent is
// the message context of the transaction's first message.
type ClaimTracer interface {
	TraceClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func(inserted []bool, err error))
}

// HandlerTracer surrounds each call of a handler: a Handler with one
// message, a BatchHandler with the new messages of a transaction. Its
// parent is the message context of the (first) message, and the handler
// receives the context it returns. end receives what the handler returned
// (an *inbox.PanicError if it panicked).
type HandlerTracer interface {
	TraceHandler(ctx context.Context, rows []storage.InboxRow) (context.Context, func(err error))
}

// Kind says what an [Event] reports.
type Kind int

const (
	// Processed: a message's effect committed.
	Processed Kind = iota + 1
	// Duplicate: the inbox already held the message; nothing applied.
	Duplicate
	// Failed: an inbox call (used without a consumer) failed for the
	// message; nothing of it was committed. Err says why.
	Failed
	// Retry: work failed and will be run again after a backoff. Scope says
	// what: a transaction (the inbox's, after a transient database
	// failure), a message, or a whole batch (the consumer's). Err says why.
	Retry
	// DeadLettered: a message was published to the dead-letter topic.
	DeadLettered
	// PartitionStopped: a partition halted at Offset; Err, a
	// *consumer.PartitionStoppedError, says why.
	PartitionStopped
	// Committed: Offset (the next offset to read) was committed to Kafka.
	Committed
	// Lag: Lag messages of the partition are behind Offset, the next offset
	// to process, as of the last fetch.
	Lag
	// Assigned and Revoked: the partition was assigned to this member
	// (starting at Offset) or taken from it.
	Assigned
	Revoked
	// Maintenance: the inbox's maintenance ran (consumer.Config
	// MaintenanceInterval); Err is set if it failed.
	Maintenance
	// Repositioned (consumer.Config.Offsets.Store): the partition's stored
	// offset was found behind the one this member had committed (a database
	// failover that lost the last commits); the member resumed from it, at
	// Offset, and applies the messages in between again. Err says what was
	// found.
	Repositioned
	// RelayCycle: an outbox relay cycle claimed rows or failed; Relay says
	// what it did.
	RelayCycle
)

var kindNames = [...]string{
	Processed: "processed", Duplicate: "duplicate", Failed: "failed", Retry: "retry",
	DeadLettered: "dead-lettered", PartitionStopped: "partition-stopped", Committed: "committed",
	Lag: "lag", Assigned: "assigned", Revoked: "revoked", Maintenance: "maintenance",
	Repositioned: "repositioned", RelayCycle: "relay-cycle",
}

func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// RetryScope says what a Retry event runs again.
type RetryScope int

const (
	// RetryTransaction: the inbox runs a transaction again after a transient
	// database failure (inbox.Config.MaxAttempts bounds it).
	RetryTransaction RetryScope = iota + 1
	// RetryMessage: the consumer tries a failed message again
	// (consumer.Config.Failure.MaxAttempts bounds it).
	RetryMessage
	// RetryBatch: the consumer runs a batch again that could not commit
	// because the database failed; not bounded, and counts no attempt.
	RetryBatch
)

func (s RetryScope) String() string {
	switch s {
	case RetryTransaction:
		return "transaction"
	case RetryMessage:
		return "message"
	case RetryBatch:
		return "batch"
	}
	return fmt.Sprintf("RetryScope(%d)", int(s))
}

// Event is what the inbox, the consumer and the outbox relay report. The
// fields that do not apply to a Kind are zero.
type Event struct {
	Kind Kind
	// Consumer and EventID name the message, where the event is about one
	// and the reporter knows it (the inbox does; the consumer names the
	// event id of messages it has extracted).
	Consumer string
	EventID  string
	// Topic, Partition and Offset place the message (its offset) or the
	// partition (for Committed, Assigned, Repositioned and Lag: the next
	// offset). Offset is -1 for a batch retry and for Maintenance.
	Topic     string
	Partition int
	Offset    int64
	Attempt   int           // Retry: the attempt that failed
	Scope     RetryScope    // Retry
	Lag       int64         // Lag
	Err       error         // Failed, Retry, DeadLettered, PartitionStopped, Repositioned, a failed Maintenance or RelayCycle
	Duration  time.Duration // Processed, Duplicate, Failed: from the call to its result; RelayCycle: the cycle
	// Sequenced (Processed, Duplicate) says the message was deduplicated
	// by its stream's watermark (the consumer's sequenced dedup), not by
	// an inbox row.
	Sequenced bool
	// NoDedup (Processed) says the message was not deduplicated at all: a
	// consumer with Config.NaturallyIdempotent ran its handler without an
	// inbox row or a watermark.
	NoDedup bool
	// Maintenance is what the inbox's maintenance did.
	Maintenance storage.MaintenanceReport
	// Relay is what a RelayCycle did.
	Relay RelayCycleReport
}

// RelayCycleReport says what one outbox relay cycle did.
type RelayCycleReport struct {
	Claimed   int  // rows claimed
	Published int  // messages acknowledged by the broker and marked published
	LeaseLost bool // another relay took over shards this cycle published
}

// Funcs is a hook made of functions, for the cases a type of its own would
// be too much (tests, a quick log line): it calls each field that is set,
// and does nothing for a nil one, like net/http/httptrace's ClientTrace.
type Funcs struct {
	Event   func(Event)
	Message func(ctx context.Context, row storage.InboxRow) (context.Context, func(outcome Kind, err error))
	Claim   func(ctx context.Context, rows []storage.InboxRow) (context.Context, func(inserted []bool, err error))
	Handler func(ctx context.Context, rows []storage.InboxRow) (context.Context, func(err error))
}

// OnEvent calls f.Event, if set.
func (f *Funcs) OnEvent(ev Event) {
	if f.Event != nil {
		f.Event(ev)
	}
}

// TraceMessage calls f.Message, if set.
func (f *Funcs) TraceMessage(ctx context.Context, row storage.InboxRow) (context.Context, func(Kind, error)) {
	if f.Message == nil {
		return ctx, nil
	}
	return f.Message(ctx, row)
}

// TraceClaim calls f.Claim, if set.
func (f *Funcs) TraceClaim(ctx context.Context, rows []storage.InboxRow) (context.Context, func([]bool, error)) {
	if f.Claim == nil {
		return ctx, nil
	}
	return f.Claim(ctx, rows)
}

// TraceHandler calls f.Handler, if set.
func (f *Funcs) TraceHandler(ctx context.Context, rows []storage.InboxRow) (context.Context, func(error)) {
	if f.Handler == nil {
		return ctx, nil
	}
	return f.Handler(ctx, rows)
}
