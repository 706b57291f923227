package storage

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

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

// CheckWatermarkWrites refuses, before any statement runs, writes that the
// WatermarkStore contract rules out or that some adapter could not store
// exactly; SaveWatermarks implementations call it first. Its error wraps
// ErrInvalidConfig and names the first write refused and why: a key whose
// scope, source or topic is empty, longer than MaxConsumerBytes,
// MaxSourceBytes or MaxTopicBytes, not UTF-8 or holding a NUL byte (which
// PostgreSQL's text cannot hold), an epoch below 1 or a negative
// partition; no new value, one longer than MaxWatermarkBytes, or one equal
// to the old value (an UPDATE that changes nothing may report 0 rows,
// which would read as moved); keys not distinct and sorted by
// WatermarkKey.Compare.
func CheckWatermarkWrites(writes []WatermarkWrite) error {
	for i, w := range writes {
		if err := checkWatermarkKey(w.WatermarkKey); err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		switch {
		case w.New == nil:
			return fmt.Errorf("%w: write %d (%s) has no new value", ErrInvalidConfig, i, streamText(w.WatermarkKey))
		case len(w.New) > MaxWatermarkBytes:
			return fmt.Errorf("%w: write %d (%s): a value of %d bytes, at most %d allowed", ErrInvalidConfig, i, streamText(w.WatermarkKey), len(w.New), MaxWatermarkBytes)
		case w.Old != nil && bytes.Equal(w.Old, w.New):
			return fmt.Errorf("%w: write %d (%s): the new value equals the old one", ErrInvalidConfig, i, streamText(w.WatermarkKey))
		case i > 0 && writes[i-1].Compare(w.WatermarkKey) >= 0:
			return fmt.Errorf("%w: write %d (%s): keys not distinct and sorted", ErrInvalidConfig, i, streamText(w.WatermarkKey))
		}
	}
	return nil
}

// CheckWatermarkFilter refuses, with an error wrapping ErrInvalidConfig, a
// scope or topic of a Watermarks call that no row can hold (by the rules
// of CheckWatermarkWrites); an empty topic is allowed: it selects every
// topic.
func CheckWatermarkFilter(scope, topic string) error {
	if err := checkWatermarkName("scope", scope, MaxConsumerBytes); err != nil {
		return err
	}
	if topic == "" {
		return nil
	}
	return checkWatermarkName("topic", topic, MaxTopicBytes)
}

// CheckWatermarkSaved turns the outcome of the statement that saved w (an
// INSERT for a nil Old, a compare-and-set UPDATE otherwise) into
// SaveWatermarks' answer: nil when it affected exactly one row; execErr
// when it failed, wrapped with the stream's name; an error wrapping
// ErrWatermarkMoved when it affected none (the stream has a row already,
// or does not hold Old); any other count, or a count res cannot tell, is
// an error wrapping neither. It decides by the count alone, as the
// contract asks: a statement whose duplicate key is an error rather than
// 0 rows passes a result of 0 rows instead.
func CheckWatermarkSaved(w WatermarkWrite, res sql.Result, execErr error) error {
	if execErr != nil {
		return fmt.Errorf("%s: %w", streamText(w.WatermarkKey), execErr)
	}
	if res == nil {
		return fmt.Errorf("%s: the statement returned no result", streamText(w.WatermarkKey))
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("%s: rows affected: %w", streamText(w.WatermarkKey), err)
	case n == 0 && w.Old == nil:
		return fmt.Errorf("%w: %s already has a row", ErrWatermarkMoved, streamText(w.WatermarkKey))
	case n == 0:
		return fmt.Errorf("%w: %s does not hold the value read (changed, or no row)", ErrWatermarkMoved, streamText(w.WatermarkKey))
	case n != 1:
		return fmt.Errorf("%s: %d rows affected, want 1", streamText(w.WatermarkKey), n)
	}
	return nil
}

// ScanWatermarks reads rows of a SELECT of scope, source, epoch, topic,
// partition_no and applied, in that order, and closes them. Names may come
// as text or as bytes; an applied value is never nil (the column is NOT
// NULL, and a nil Applied would say the stream has no row).
func ScanWatermarks(rows *sql.Rows) ([]WatermarkRow, error) {
	defer rows.Close()
	var out []WatermarkRow
	for rows.Next() {
		var r WatermarkRow
		var scope, source, topic []byte
		if err := rows.Scan(&scope, &source, &r.Epoch, &topic, &r.Partition, &r.Applied); err != nil {
			return nil, err
		}
		r.Scope, r.Source, r.Topic = string(scope), string(source), string(topic)
		if r.Applied == nil {
			r.Applied = []byte{}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func checkWatermarkKey(k WatermarkKey) error {
	for _, f := range []struct {
		what, v string
		max     int
	}{{"scope", k.Scope, MaxConsumerBytes}, {"source", k.Source, MaxSourceBytes}, {"topic", k.Topic, MaxTopicBytes}} {
		if err := checkWatermarkName(f.what, f.v, f.max); err != nil {
			return err
		}
	}
	switch {
	case k.Epoch < 1:
		return fmt.Errorf("%w: %s: epoch below 1", ErrInvalidConfig, streamText(k))
	case k.Partition < 0:
		return fmt.Errorf("%w: %s: negative partition", ErrInvalidConfig, streamText(k))
	}
	return nil
}

func checkWatermarkName(what, v string, maxBytes int) error {
	if v == "" || len(v) > maxBytes {
		return fmt.Errorf("%w: watermark %s of %d bytes (1..%d allowed)", ErrInvalidConfig, what, len(v), maxBytes)
	}
	if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%w: watermark %s %q is not UTF-8 without NUL bytes", ErrInvalidConfig, what, v)
	}
	return nil
}

// streamText names a stream in errors.
func streamText(k WatermarkKey) string {
	return fmt.Sprintf("stream %q/%q[%d] of source %q epoch %d", k.Scope, k.Topic, k.Partition, k.Source, k.Epoch)
}
