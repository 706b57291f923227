package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"

	"gorm.io/gorm"
)

// WatermarkStore is an optional InboxStore capability: the watermarks of
// sequenced dedup. A consumer told to trust a sequenced outbox source (see
// package consumer, "Sequenced dedup") decides whether it applied such a
// message by its sequence number instead of an inbox row: it keeps, per
// stream (consumer scope, source, epoch, topic, partition), the highest
// sequence number it applied in each shard of the source, and writes the
// new value in the transaction that applies the messages, with a
// compare-and-set, so that two members (a paused or zombie one, or one
// talking to a database that failed over) can never both apply a message.
//
// The applied value is opaque to the store: bytes the consumer encodes, at
// most MaxWatermarkBytes, stored and returned byte for byte. A store keeps
// one row per stream, which never expires.
//
// A WatermarkStore must be safe for concurrent use.
type WatermarkStore interface {
	// MigrateWatermarks creates the watermark table (or upgrades it). It
	// must be idempotent and safe when several processes run it at the
	// same time.
	MigrateWatermarks(ctx context.Context, db *gorm.DB) error

	// Watermarks returns the committed rows of scope's streams on topic's
	// partition, in no particular order: one per source and epoch seen.
	// An empty topic returns the rows of every topic, a negative partition
	// those of every partition.
	Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]WatermarkRow, error)

	// SaveWatermarks writes each of writes inside tx, the transaction that
	// applies the messages, if and only if every stream still holds its
	// Old value: a write with a nil Old inserts the stream's row, which
	// must not exist yet; any other replaces Applied where it equals Old
	// (New always differs from Old). If any stream does not hold its Old
	// value (another transaction changed it, or the row exists, or is
	// missing), it returns an error wrapping ErrWatermarkMoved, and the
	// caller rolls tx back. The decision must rest on the number of rows
	// each statement matched, never on message text; a row locked by a
	// concurrent transaction is waited for, then compared with what that
	// transaction committed. The keys in writes are distinct and sorted
	// (WatermarkKey.Compare), so two callers lock rows in the same order.
	//
	// On a transient failure it returns an error for which the InboxStore's
	// IsRetryable is true.
	SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []WatermarkWrite) error
}

// WatermarkBeginner is an optional WatermarkStore capability: a store that
// can open a transaction and save watermarks in it in one round trip
// (PostgreSQL pipelines BEGIN with the writes) implements it, and the
// inbox calls it for a transaction that has watermarks to write and no
// inbox row to claim. Its contract is ClaimBeginner's, with the writes of
// SaveWatermarks instead of the claim: when the writes fail (an error
// wrapping ErrWatermarkMoved, or any other), nothing is left open; ok is
// false, with nothing opened and no error, when it cannot do so for db.
type WatermarkBeginner interface {
	BeginSaveWatermarks(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, writes []WatermarkWrite) (tx *gorm.DB, ok bool, err error)
}

// MaxWatermarkBytes is the longest applied value a WatermarkStore must
// store.
const MaxWatermarkBytes = 65535

// ErrWatermarkMoved is wrapped by SaveWatermarks' error when a stream no
// longer holds the value the caller read: another member of the group
// wrote it (this one was paused past its session, or is a zombie after a
// rebalance), or the database lost commits in a failover. The caller reads
// the watermarks again before it decides anything more.
var ErrWatermarkMoved = errors.New("storage: the watermark moved since it was read")

// WatermarkKey identifies one sequenced stream of a consumer scope: the
// messages of one source and epoch on one partition of a topic.
type WatermarkKey struct {
	Scope     string // the inbox consumer name, at most MaxConsumerBytes
	Source    string // the outbox source id, at most MaxSourceBytes
	Epoch     int64
	Topic     string // at most MaxTopicBytes
	Partition int32
}

// Compare orders keys by scope, topic, partition, source and epoch.
func (k WatermarkKey) Compare(o WatermarkKey) int {
	return cmp.Or(
		cmp.Compare(k.Scope, o.Scope),
		cmp.Compare(k.Topic, o.Topic),
		cmp.Compare(k.Partition, o.Partition),
		cmp.Compare(k.Source, o.Source),
		cmp.Compare(k.Epoch, o.Epoch),
	)
}

// WatermarkRow is a stream's committed watermark.
type WatermarkRow struct {
	WatermarkKey
	Applied []byte
}

// WatermarkWrite moves a stream's watermark from Old (nil: the stream has
// no row yet) to New.
type WatermarkWrite struct {
	WatermarkKey
	Old, New []byte
}
