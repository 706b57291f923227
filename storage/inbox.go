package storage

import (
	"context"
	"database/sql"
	"time"

	"gorm.io/gorm"
)

// InboxStore is the inbox's storage contract: the part of the inbox that
// differs between databases. An adapter implements it with its own dialect SQL; inbox.Inbox owns
// transactions, retries, validation, logging and metrics, so an InboxStore does
// none of those. The conformance package is the executable form of this
// contract: an InboxStore that passes it is fit for use.
//
// An InboxStore must be safe for concurrent use.
type InboxStore interface {
	// Migrate creates the inbox table (and whatever the InboxStore's partitions and
	// indexes need) or upgrades it to the InboxStore's current schema. It must be
	// idempotent and safe when several processes run it at the same time.
	// The table must be transactional: a row inserted by a transaction that
	// rolls back must vanish.
	Migrate(ctx context.Context, db *gorm.DB) error

	// Claim inserts rows inside tx, ignoring rows whose key (consumer, event
	// id, day) already exists, and reports for each row whether this call
	// inserted it: inserted[i] is true if and only if rows[i] is new. The
	// keys in rows are distinct. Rows committed by other transactions, and
	// rows of concurrent uncommitted transactions once those commit, are
	// duplicates; if a concurrent inserter of the same key rolls back, the
	// row is new.
	//
	// Claim must not issue a statement that fails on a duplicate key (on
	// PostgreSQL that would abort the caller's transaction), and it must never
	// report as a duplicate a row that was not stored for another reason (a
	// missing partition, truncation, a NULL): such failures are errors. Ids
	// must be stored byte for byte: ids that differ only in letter case or
	// trailing spaces are different keys.
	//
	// On a transient failure Claim returns an error for which IsRetryable
	// is true; it never retries by itself.
	Claim(ctx context.Context, tx *gorm.DB, rows []InboxRow) (inserted []bool, err error)

	// Maintain prepares storage for the days up to plan.PrepareThrough and
	// removes rows of days before plan.ExpireBefore, and of no other day. It
	// must be idempotent and safe while other transactions insert and read
	// rows. With plan.DryRun it changes nothing and reports what it would do.
	Maintain(ctx context.Context, db *gorm.DB, plan MaintenancePlan) (MaintenanceReport, error)

	// IsRetryable reports whether err (from Claim, or from any statement run
	// in the same transaction) is a transient failure after which the whole
	// transaction can be run again: a serialization failure, a deadlock, a
	// lock wait timeout, a busy database. The decision must rest on error
	// codes, never on message text.
	IsRetryable(err error) bool
}

// MaintenancePlan tells an InboxStore which days to prepare and which to expire.
// All days are midnight UTC.
type MaintenancePlan struct {
	Today          time.Time
	PrepareThrough time.Time // prepare every day from Today through this one
	ExpireBefore   time.Time // remove rows of every day strictly before this one
	DryRun         bool
}

// MaintenanceReport says what a Maintain call did (or, in a dry run, would
// do).
type MaintenanceReport struct {
	Prepared    []time.Time // days (or partitions) made ready
	Expired     []time.Time // days whose rows were removed
	RowsRemoved int64       // rows deleted, where the store counts them; -1 if unknown (a dropped partition)
	// Held are expired days an OutboxStore kept because they still hold
	// unpublished rows (a relay that is down or stuck is the usual cause).
	// An InboxStore never holds a day.
	Held   []time.Time
	DryRun bool
}

// Verifier is an optional InboxStore capability: Verify checks that the database
// and connection settings behind db keep the InboxStore's guarantees (a
// transactional table engine, a strict SQL mode, write-ahead logging), and
// so do the layouts of its tables, the watermark table of a WatermarkStore
// included when it exists (without one sequenced dedup is not in use, which
// is no problem), and returns an error naming each setting or column that
// does not.
type Verifier interface {
	Verify(ctx context.Context, db *gorm.DB) error
}

// ClaimBeginner is an optional InboxStore capability: an InboxStore that can open a
// transaction and claim rows in it in one round trip (PostgreSQL pipelines
// BEGIN with the claim) implements it, and Process and ProcessBatch then
// call it instead of BEGIN followed by Claim.
//
// BeginClaim opens a transaction on db with opts and claims rows in it,
// with the contract of Claim. The transaction it returns must be a
// *gorm.DB whose Statement.ConnPool is a gorm.TxCommitter (so that GORM's
// Commit and Rollback end it, and a nested Transaction takes a savepoint),
// and must not offer BeginTx (so that a handler's Begin fails as it does
// inside any transaction, rather than committing early); the conformance
// checks atomicity/nested-transaction-is-a-savepoint and
// atomicity/begin-in-handler-is-refused hold a Store to both. Its statements,
// and its life as database/sql binds a transaction to the context of
// BeginTx, go by db's context (db.Statement.Context), which is the
// transaction's; ctx is the claim's (with a Trace, the Claim hook's) and
// bounds only the claim and BEGIN. It may return db itself with its
// Statement.ConnPool replaced (the inbox passes a session of its own, from
// WithContext, so that no further copy of GORM's statement is needed).
// When it returns an
// error, nothing is left open. ok is false, with nothing opened and no
// error, when it cannot do so for db (another driver, GORM's prepared
// statements): the inbox then begins and claims as usual.
type ClaimBeginner interface {
	BeginClaim(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, rows []InboxRow) (tx *gorm.DB, inserted []bool, ok bool, err error)
}

// DayPreparer is an optional InboxStore capability, for Stores that keep each
// day's rows in storage of its own (a partition) and have none for a day
// until it is made: Maintain makes the days of its plan, and the inbox makes
// any other day (an event dated beyond PrepareThrough, or a late event of an
// expired day under ProcessExpired) on demand, when a claim finds no storage
// for it.
//
// When Claim fails and IsMissingDay reports that the failure is a row's day
// without storage, Process and ProcessBatch roll the transaction back, call
// PrepareDays with the days of the claimed rows and run the transaction
// again, at most MaxDayPreparations times per call (a PrepareDays that fails
// ends the run with its error, which the retry loop may retry as any other
// database failure); ProcessTx does the same
// inside the caller's transaction (rolling back to its savepoint, and
// calling PrepareDays on the inbox's own database handle while the caller's
// transaction stays open). A claim that still finds no storage fails with
// the InboxStore's error, retryable (inbox.Inbox.IsRetryable): its days were made, so
// another run later may see them (see dayUnseenError), and the retry loop
// bounds how often. These runs are not counted against Config.MaxAttempts.
type DayPreparer interface {
	// IsMissingDay reports whether err, returned by Claim, says that a row's
	// day has no storage. The decision must rest on error codes (and the
	// error's table), never on message text.
	IsMissingDay(err error) bool
	// PrepareDays makes storage for each of days (midnight UTC, distinct)
	// that has none, and does nothing for the others. It must be idempotent
	// and safe while other processes call it or Maintain, and must not wait
	// for a transaction that holds rows of the inbox table other than for
	// the short lock of a catalog change: it may be called while such a
	// transaction of the caller is open.
	PrepareDays(ctx context.Context, db *gorm.DB, days []time.Time) error
}

// MaxDayPreparations bounds how often one Process, ProcessBatch or ProcessTx
// call makes missing days' storage (see [DayPreparer]) and runs its claim
// again. More than one is needed only when a concurrent Maintain removes
// the day again in between (a late event of an expired day).
const MaxDayPreparations = 3

// SchemaPrinter is an optional InboxStore capability for teams that keep their
// DDL in a migration tool (goose, Atlas, golang-migrate). MigrationSQL
// returns the statements Migrate runs on a database without the inbox
// table, followed by those that prepare the days Today through
// PrepareThrough of plan and, for a WatermarkStore, those MigrateWatermarks
// runs on a database without the watermark table (none when the store has
// no watermark table), in order, each a complete statement without a
// terminating semicolon. Maintain must still run afterwards (the consumer
// does, hourly): it prepares the following days and expires old ones.
type SchemaPrinter interface {
	MigrationSQL(plan MaintenancePlan) ([]string, error)
}

// DayStats is one line of [StatsReporter] output: the rows of one day (and,
// for an InboxStore, of one consumer).
type DayStats struct {
	Consumer    string // inbox only
	Day         time.Time
	Rows        int64
	Unpublished int64 // outbox only: rows not yet published
}

// StatsReporter is an optional capability of an InboxStore or an
// OutboxStore, used by operators' tools and the conformance suite.
type StatsReporter interface {
	Stats(ctx context.Context, db *gorm.DB) ([]DayStats, error)
}

// Limits on the identifiers stored in the inbox key and its provenance. They
// are byte lengths of the UTF-8 encoding; every adapter must store values of
// these lengths exactly, without truncation or normalisation.
const (
	MaxEventIDBytes  = 255
	MaxConsumerBytes = 128
	MaxTopicBytes    = 255 // the provenance topic (Kafka's own limit is 249)
)

// InboxRow is the inbox row an [InboxStore] writes for one message.
type InboxRow struct {
	Consumer  string
	EventID   string
	Day       time.Time // midnight UTC; part of the key
	EventTime time.Time // UTC
	Topic     string
	Partition int32
	Offset    int64
}

// InboxKey identifies an inbox row: the unique key every InboxStore
// enforces.
type InboxKey struct {
	Consumer string
	EventID  string
	Day      time.Time
}

// Key returns the row's unique key.
func (r InboxRow) Key() InboxKey {
	return InboxKey{Consumer: r.Consumer, EventID: r.EventID, Day: r.Day}
}

// DayOf returns midnight UTC of the calendar day t falls on in UTC: the day
// part of the inbox key, and the day an outbox row is stored under.
func DayOf(t time.Time) time.Time {
	u := t.UTC()
	return time.Date(u.Year(), u.Month(), u.Day(), 0, 0, 0, 0, time.UTC)
}
