// Package seam lets the project's own tests reach into package consumer.
//
// Those tests need a database driver and an in-process Kafka broker, so they
// live in the dev module (a user who depends on the library then
// never downloads either); a test there cannot see consumer's unexported
// names. Package consumer fills these variables when it is initialised, and
// nothing outside this repository can import them. They change no behaviour
// unless a test sets a Config hook through them.
package seam

import (
	"context"
	"time"

	"gorm.io/gorm"
)

// AfterDB is the test hook called after each database commit of a
// partition, before its Kafka offset commit; returning ErrCrash simulates a
// crash at that point.
type AfterDB func(topic string, partition int, next int64, processed int) error

// OffsetStore is the consumer's table of stored offsets (Config.StoreOffsets).
type OffsetStore interface {
	Table() string
	Migrate(ctx context.Context, db *gorm.DB) error
	Save(ctx context.Context, tx *gorm.DB, topic string, partition int, next int64) error
	Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor, next int64) error
	Load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error)
}

// Filled by package consumer.
var (
	// ErrCrash is what an AfterDB hook returns to simulate a crash.
	ErrCrash error
	// ErrPositionMoved is Advance's error when the stored offset moved back.
	ErrPositionMoved error
	// DeadLetterUnknownTopicAttempts is how many unknown-topic answers in a
	// row make a dead-letter publish fail for good.
	DeadLetterUnknownTopicAttempts int

	// SetAfterDB sets the AfterDB hook of a *consumer.Config.
	SetAfterDB func(cfg any, hook AfterDB)
	// SetLogCheckInterval sets how often an idle partition of a
	// *consumer.Config checks the log end.
	SetLogCheckInterval func(cfg any, every time.Duration)
	// SetPosCheckInterval sets how often an idle partition of a
	// *consumer.Config checks its stored position.
	SetPosCheckInterval func(cfg any, every time.Duration)
	// NewOffsetStore returns the offset store of a table and group.
	NewOffsetStore func(table, group string) OffsetStore
	// OffsetsOf returns the offset store a *consumer.Consumer uses.
	OffsetsOf func(c any) OffsetStore
)
