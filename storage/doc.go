// Package storage is the contract between this library and a database
// adapter. It is for adapter authors: application code uses packages inbox,
// consumer and outbox, and picks an adapter (adapters/postgres,
// adapters/mysql, adapters/sqlite, or a third party's) without naming
// anything here.
//
// An adapter implements [InboxStore] (four methods) and, for the producer
// side, [OutboxStore], with its own dialect SQL; the portable types in
// packages inbox and outbox own transactions, retries, validation, logging
// and metrics, so a store does none of those. Optional capabilities
// ([ClaimBeginner], [DayPreparer], [Verifier], [SchemaPrinter],
// [StatsReporter], [WatermarkStore], [OffsetStore], [MissingTableReporter],
// and for an OutboxStore [Sequenced], [Sharded] and [MarkReader]) are
// detected by type assertion, as database/sql/driver detects optional
// driver features.
//
// Package storage/adapterkit holds what the adapters here share and
// another adapter may use: a transaction opened without BEGIN of its own
// (for a ClaimBeginner), the global order of a claim's row locks, and the
// offsets table on GORM (for an OffsetStore).
//
// The doc comments here state the contract; package conformance is its
// executable form. A store that passes conformance.Run is fit for use, and
// the suite is itself tested against deliberately broken stores, so each of
// its checks is known to fail when its rule is broken.
package storage
