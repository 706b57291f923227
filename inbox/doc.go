// Package inbox makes message consumers idempotent with the transactional
// inbox pattern on top of GORM.
//
// In one database transaction, [Inbox.Process] inserts the pair (consumer,
// event id) into an inbox table whose unique key turns a second insert into a
// no-op, and runs the caller's [Handler] with that transaction only when the
// row was new. A redelivered event finds its row and the handler is skipped,
// so the business effect happens once even though the broker delivers at least
// once. Commit the broker offset only after Process returns.
//
// What differs between databases (the conflict-ignoring insert, the schema,
// date partitions and their expiry, which errors mean "retry") lives behind
// the small [storage.InboxStore] interface; adapters for PostgreSQL, MySQL/MariaDB and
// SQLite are in the adapters/ directory, and the conformance/ package is the
// suite every storage.InboxStore must pass.
//
// The inbox row is keyed by (consumer, event id, day), where day is the UTC
// calendar day of the event time set by the producer. The day lets adapters
// partition the table and expire whole days cheaply; because it is derived
// from the event and never from the processing time, every redelivery of an
// event lands on the same key.
//
// Config.Hooks (see package hooks) receive every outcome and retry and let a
// tracing system open a span per message with child spans for its claim and
// its handler; the module github.com/inboxgo/inbox/otel does both for
// OpenTelemetry. [Inbox.Counters] keeps the totals.
//
// This package is for applications. Adapter authors implement the contract
// in package storage and prove it with package conformance.
package inbox
