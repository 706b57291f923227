// Package inboxotel connects the inbox, its Kafka consumer and the outbox
// relay to OpenTelemetry: it continues the producer's trace from W3C
// trace-context headers, opens a span per message with child spans for the
// inbox claim and the handler, and counts outcomes, retries, dead letters,
// processing time and consumer lag through the OpenTelemetry metric API.
//
// It is a module of its own (github.com/inboxgo/inbox/otel), so that users
// of the inbox who do not want OpenTelemetry do not depend on it; the core
// only offers the hooks it plugs into (package hooks).
//
// # Wiring
//
// [New] returns one [Hook]; put it into the Hooks of every Config it should
// see: the inbox's (a consumer whose own Hooks is nil takes the inbox's), a
// naturally idempotent consumer's without an inbox, the relay's. Hooks
// stack, so it goes beside any other hook, and nothing is rewritten:
//
//	h, err := inboxotel.New(inboxotel.Options{ConsumerGroup: "billing"})
//	ib, err := inbox.New(db, store, inbox.Config{Hooks: []hooks.Hook{h}})
//	c, err := consumer.New(consumer.Config{Inbox: ib, ...}) // the inbox's Hooks
//
// # Spans
//
// The message span (kind consumer, named "process <topic>") is a child of
// the span found in the message's headers (the producer's), so that a
// trace runs from the producer through the consumer into the handler's own
// spans. It carries messaging.system=kafka, messaging.destination.name,
// messaging.destination.partition.id, messaging.kafka.partition,
// messaging.kafka.offset, messaging.message.id (the event id),
// messaging.consumer.group.name (Options.ConsumerGroup), inbox.consumer
// and, when it ends, inbox.outcome (processed, duplicate or failed), for a
// processed or duplicate message inbox.dedup (how it was deduplicated:
// "row", by its inbox row, or "watermark", by its sequenced stream's
// watermark, for an aligned source in a consumer's
// Config.Sequenced.Sources; a copy the
// watermark covers has its span too, though no transaction runs for it),
// and the error. Its children are "inbox claim" (one per transaction
// attempt: inbox.claim.rows, inbox.claim.new) and "inbox handler"
// (inbox.handler.messages); the handler's context is the handler span's.
// Every attempt of the consumer at a message is a span of its own. In a
// batch, the claim of a transaction is a child of the span of its first
// message, and a BatchHandler's span a child of its first new message's.
//
// # Metrics
//
// The meter "github.com/inboxgo/inbox/otel" records:
//
//   - inbox.messages (counter): messages by inbox.outcome (and inbox.dedup,
//     as on the span, for processed and duplicate; "none" for the messages
//     of a consumer with Config.NaturallyIdempotent), each message
//     counted once when its fate is decided. With a consumer: processed or
//     duplicate when its effect committed, failed when the consumer gave up
//     on it (it was dead-lettered or its partition stopped at it; a message
//     tried again after a reassignment counts again). With the inbox alone:
//     the outcome of each call.
//   - inbox.retries (counter): by inbox.retry.kind: "transaction" (the
//     inbox ran a transaction again after a transient database failure),
//     "message" (the consumer tries a failed message again) and "batch"
//     (the consumer runs a batch again that could not commit).
//   - inbox.dead_letters (counter): messages published to the dead-letter
//     topic.
//   - inbox.processing.duration (histogram, seconds): each inbox call's
//     time for each message, by inbox.outcome and, for processed and
//     duplicate, inbox.dedup (with the consumer, every attempt), measured
//     by the message span.
//   - inbox.consumer.lag (gauge): messages of a partition behind the next
//     offset to process, as of the last fetch; it keeps its last value
//     after the partition is revoked.
//
// Each outcome is reported once by whoever decides it (an inbox driven by a
// consumer leaves them to the consumer; see package hooks), so the Hook
// given to the inbox, which its consumer takes, counts each message once,
// as it does when given to both Configs.
package inboxotel
