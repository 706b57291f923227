// Package inboxotel connects the inbox and its Kafka consumer to
// OpenTelemetry: it continues the producer's trace from W3C trace-context
// headers, opens a span per message with child spans for the inbox claim
// and the handler, and counts outcomes, retries, dead letters, processing
// time and consumer lag through the OpenTelemetry metric API.
//
// It is a module of its own (github.com/inboxgo/inbox/otel), so that users
// of the inbox who do not want OpenTelemetry do not depend on it; the core
// only offers the hooks it plugs into: inbox.Config.Trace,
// inbox.Config.OnEvent, consumer.Config.MessageContext and
// consumer.Config.OnEvent.
//
// # Wiring
//
// A service consuming with consumer.Consumer calls [InstrumentConsumer] once
// with both configurations, before inbox.New:
//
//	icfg := inbox.Config{}
//	ccfg := consumer.Config{Brokers: ..., GroupID: ..., Consumer: ..., Handler: ...}
//	if err := inboxotel.InstrumentConsumer(&icfg, &ccfg, inboxotel.Options{}); err != nil { ... }
//	ib, err := inbox.New(db, store, icfg)
//	ccfg.Inbox = ib
//	c, err := consumer.New(ccfg)
//
// A service calling the inbox itself (Process, ProcessTx, ProcessBatch)
// calls [InstrumentInbox] instead. Use one of the two per inbox, never
// both: see "Each message counted once" below.
//
// # Spans
//
// The message span (kind consumer, named "process <topic>") is a child of
// the span found in the message's headers (the producer's), so that a
// trace runs from the producer through the consumer into the handler's own
// spans. It carries messaging.system=kafka, messaging.destination.name,
// messaging.destination.partition.id, messaging.kafka.partition,
// messaging.kafka.offset, messaging.message.id (the event id),
// messaging.consumer.group.name (with InstrumentConsumer), inbox.consumer
// and, when it ends, inbox.outcome (processed, duplicate or failed) and
// the error. Its children are "inbox claim" (one per transaction attempt:
// inbox.claim.rows, inbox.claim.new) and "inbox handler"
// (inbox.handler.messages); the handler's context is the handler span's.
// Every attempt of the consumer at a message is a span of its own. In a
// batch, the claim of a transaction is a child of the span of its first
// message, and a BatchHandler's span a child of its first new message's.
//
// # Metrics
//
// The meter "github.com/inboxgo/inbox/otel" records:
//
//   - inbox.messages (counter): messages by inbox.outcome, each message
//     counted once when its fate is decided. With InstrumentConsumer:
//     processed or duplicate when its effect committed, failed when the
//     consumer gave up on it (it was dead-lettered or its partition
//     stopped at it; a message tried again after a reassignment counts
//     again). With InstrumentInbox: the outcome of each call.
//   - inbox.retries (counter): by inbox.retry.kind: "transaction" (the
//     inbox ran a transaction again after a transient database failure),
//     "message" (the consumer tries a failed message again) and "batch"
//     (the consumer runs a batch again that could not commit).
//   - inbox.dead_letters (counter): messages published to the dead-letter
//     topic.
//   - inbox.processing.duration (histogram, seconds): each inbox call's
//     time for each message, by inbox.outcome (with the consumer, every
//     attempt).
//   - inbox.consumer.lag (gauge): messages of a partition behind the next
//     offset to process, as of the last fetch; it keeps its last value
//     after the partition is revoked.
//
// # Each message counted once
//
// The inbox and the consumer both report processed and duplicate messages
// (the consumer's report follows the inbox's), and the inbox reports every
// failed attempt as failed. [InstrumentConsumer] therefore counts outcomes
// from the consumer's events only and takes from the inbox's events just
// what the consumer does not report (durations and transaction retries).
// It refuses an inbox.Config that either function already instrumented,
// so that the inbox's outcomes cannot be counted a second time.
package inboxotel
