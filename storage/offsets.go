package storage

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// OffsetStore is an optional InboxStore capability: the table of stored
// offsets of consumer.Config.Offsets.Store. A consumer that stores offsets
// writes each partition's next offset to read into it, in the transaction
// of the effect that made it so, and starts each assigned partition there.
// The consumer takes it from its inbox's Store (or, for a naturally
// idempotent consumer without an inbox, its Classifier), and refuses
// Offsets.Store without one.
//
// A row is one partition of one consumer group (OffsetKey): its next
// offset, the group generation of the member that wrote it (a newer
// generation's row fences off the writes of an older one: a paused or
// zombie member), and what identifies the message before the next offset
// (its fingerprint, checked on assignment). Table names the table, a
// plain identifier (ValidateIdentifier) that the caller chose
// (consumer.Config.Offsets.Table); a store keeps a table's name, columns
// and data stable across versions, so that rows written by an older
// version stay readable.
//
// An OffsetStore must be safe for concurrent use. Package
// storage/adapterkit implements the table on GORM for any adapter but its
// migration (adapterkit.OffsetTable).
type OffsetStore interface {
	// MigrateOffsets creates the offsets table or upgrades it. It must be
	// idempotent and safe when several processes run it at the same time.
	// The table must be transactional: a row written by a transaction that
	// rolls back must keep its old value.
	MigrateOffsets(ctx context.Context, db *gorm.DB, table string) error

	// Offsets returns group's committed rows of topic (every topic when
	// empty) and partition (every partition when negative), sorted by
	// topic and partition.
	Offsets(ctx context.Context, db *gorm.DB, table, group, topic string, partition int32) ([]OffsetRow, error)

	// SaveOffset writes w inside tx, the transaction of the effect, and
	// creates the row if there is none, unless the row is of a newer
	// generation than w's (an *OffsetTakenOverError), or, with a Floor of
	// 0 or more, the row is missing or its next offset is below Floor (an
	// error wrapping ErrOffsetMoved): then nothing is written, and the
	// caller rolls tx back. A row that already holds w is no error. A
	// concurrent writer's row is waited for and compared with what it
	// committed.
	SaveOffset(ctx context.Context, tx *gorm.DB, table string, w OffsetWrite) error

	// ClaimOffset sets the generation of key's row to gen if it is older,
	// in a transaction of its own, and returns the row as it is then (a row
	// of a newer generation is returned unchanged); found is false when
	// there is no row. From then on SaveOffset refuses the writes of older
	// generations.
	ClaimOffset(ctx context.Context, db *gorm.DB, table string, key OffsetKey, gen int32) (row OffsetRow, found bool, err error)

	// AdoptOffset sets the generation of key's row from from to gen (lower,
	// for a group whose generation ids started again), in a transaction of
	// its own, and reports false if the row does not hold from (and not gen
	// already).
	AdoptOffset(ctx context.Context, db *gorm.DB, table string, key OffsetKey, from, gen int32) (bool, error)

	// ResetOffsets sets the next offset of each of group's partitions of
	// topic in next, in one transaction, creating the rows that are
	// missing: the fingerprint is cleared (the message before the new
	// offset is unknown) and the generation kept (the fence holds). For
	// operators, on a group without running members.
	ResetOffsets(ctx context.Context, db *gorm.DB, table, group, topic string, next map[int32]int64) error
}

// OffsetKey names one partition of one consumer group in an offsets table.
type OffsetKey struct {
	Group     string // the consumer group id, at most 255 bytes
	Topic     string // at most MaxTopicBytes (Kafka's own limit is 249)
	Partition int32
}

// OffsetRow is a partition's stored position.
type OffsetRow struct {
	OffsetKey
	Next       int64 // the next offset to read
	Generation int32 // the group generation of the member that wrote it; 0 if unknown
	// Last is the fingerprint of the message at Next - 1, the last one
	// finished before the offset was stored; 0 if unknown (a reset row,
	// the group's offset stored at assignment, a version without it).
	Last int64
}

// OffsetWrite is what SaveOffset stores for a partition.
type OffsetWrite struct {
	OffsetKey
	Next       int64 // the next offset to read
	Generation int32 // the writer's group generation
	Last       int64 // the fingerprint of the message at Next - 1; 0 if unknown
	// Floor is the stored offset the writer committed last, below which
	// the row must not have gone; negative: none (the first write).
	Floor int64
}

// ErrOffsetMoved is wrapped by SaveOffset's error when the row is no
// longer at or past the writer's Floor: the database lost commits (a
// failover to a replica that lacked them) or the row was reset.
var ErrOffsetMoved = errors.New("storage: the stored offset moved back since it was committed")

// ErrOffsetTakenOver is wrapped by an *OffsetTakenOverError.
var ErrOffsetTakenOver = errors.New("storage: the stored offset was written by a newer generation of the group")

// OffsetTakenOverError reports a write refused because the row was written
// by a newer generation of the group than the writer's: another member took
// the partition over, or the group was recreated and its generation ids
// started again. Nothing was written.
type OffsetTakenOverError struct {
	OffsetKey
	Generation int32 // the row's
	Mine       int32 // the writer's
	Next       int64 // the row's next offset
}

func (e *OffsetTakenOverError) Error() string {
	return fmt.Sprintf("%v: %s/%d is stored at %d by generation %d, this member's is %d",
		ErrOffsetTakenOver, e.Topic, e.Partition, e.Next, e.Generation, e.Mine)
}

func (e *OffsetTakenOverError) Unwrap() error { return ErrOffsetTakenOver }
