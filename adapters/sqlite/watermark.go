package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// WatermarkSuffix follows the inbox table's name in the name of its
// watermark table (storage.WatermarkStore): <table>_watermarks. A table
// name of more than 52 bytes has none (its watermark table's name would
// not be a valid identifier): the watermark methods fail with an error
// wrapping storage.ErrInvalidConfig.
const WatermarkSuffix = "_watermarks"

// watermarkTable returns the watermark table's name, or why there is none.
func (s *Store) watermarkTable() (string, error) {
	name := s.table + WatermarkSuffix
	if err := storage.ValidateIdentifier("watermark table name", name); err != nil {
		return "", fmt.Errorf("sqlite: inbox table %s has no watermark table: %w", s.table, err)
	}
	return name, nil
}

// watermarkStatements make the watermark table. TEXT compares with the
// BINARY collation, byte for byte; STRICT refuses a value of another type.
func watermarkStatements(table string) []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + table + ` (
			scope        TEXT    NOT NULL,
			source       TEXT    NOT NULL,
			epoch        INTEGER NOT NULL CHECK (epoch >= 1),
			topic        TEXT    NOT NULL,
			partition_no INTEGER NOT NULL CHECK (partition_no >= 0),
			applied      BLOB    NOT NULL,
			updated_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
			PRIMARY KEY (scope, topic, partition_no, source, epoch)
		) STRICT`}
}

// MigrateWatermarks creates the watermark table <table>_watermarks unless
// it exists. Concurrent callers are serialised by SQLite's write lock.
func (s *Store) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	table, err := s.watermarkTable()
	if err != nil {
		return err
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, q := range watermarkStatements(table) {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("sqlite: migrate %s: %w", table, err)
			}
		}
		return nil
	})
}

// SaveWatermarks runs one statement per write on tx's connection, as it is:
// INSERT ... ON CONFLICT DO NOTHING for a stream without a row, UPDATE ...
// WHERE applied = Old for the others; either changes 0 rows exactly when
// the stream does not hold Old. A transaction holds SQLite's write lock
// from its first write (from BEGIN, with the DSN's immediate
// transactions) to its end, so a concurrent writer waits for it and then
// compares with what it committed, or fails with SQLITE_BUSY, which
// IsRetryable reports.
func (s *Store) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	table, err := s.watermarkTable()
	if err != nil {
		return err
	}
	if err := checkWatermarkWrites(writes); err != nil {
		return fmt.Errorf("sqlite: save watermarks in %s: %w", table, err)
	}
	conn := connOf(tx)
	if conn == nil {
		return fmt.Errorf("sqlite: save watermarks in %s: the *gorm.DB has no connection", table)
	}
	insert := `INSERT INTO ` + table + ` (scope, source, epoch, topic, partition_no, applied) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, topic, partition_no, source, epoch) DO NOTHING`
	update := `UPDATE ` + table + ` SET applied = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
		WHERE scope = ? AND topic = ? AND partition_no = ? AND source = ? AND epoch = ? AND applied = ?`
	for _, w := range writes {
		var res sql.Result
		if w.Old == nil {
			res, err = conn.ExecContext(ctx, insert, w.Scope, w.Source, w.Epoch, w.Topic, w.Partition, w.New)
		} else {
			res, err = conn.ExecContext(ctx, update, w.New, w.Scope, w.Topic, w.Partition, w.Source, w.Epoch, w.Old)
		}
		if err != nil {
			return fmt.Errorf("sqlite: save the watermark of %s in %s: %w", keyText(w.WatermarkKey), table, err)
		}
		if err := oneRow(res, w); err != nil {
			return fmt.Errorf("sqlite: save the watermark in %s: %w", table, err)
		}
	}
	return nil
}

// Watermarks reads scope's rows with one SELECT on the primary key's
// prefix.
func (s *Store) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	table, err := s.watermarkTable()
	if err != nil {
		return nil, err
	}
	if err := checkWatermarkFilter(scope, topic); err != nil {
		return nil, fmt.Errorf("sqlite: read watermarks of %s: %w", table, err)
	}
	q := `SELECT scope, source, epoch, topic, partition_no, applied FROM ` + table + ` WHERE scope = ?`
	args := []any{scope}
	if topic != "" {
		q += ` AND topic = ?`
		args = append(args, topic)
	}
	if partition >= 0 {
		q += ` AND partition_no = ?`
		args = append(args, partition)
	}
	conn := connOf(db)
	if conn == nil {
		return nil, fmt.Errorf("sqlite: read watermarks of %s: the *gorm.DB has no connection", table)
	}
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read watermarks of %s: %w", table, err)
	}
	out, err := scanWatermarks(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read watermarks of %s: %w", table, err)
	}
	return out, nil
}

// scanWatermarks reads the rows of a SELECT of scope, source, epoch,
// topic, partition_no and applied, and closes them.
func scanWatermarks(rows *sql.Rows) ([]storage.WatermarkRow, error) {
	defer rows.Close()
	var out []storage.WatermarkRow
	for rows.Next() {
		var r storage.WatermarkRow
		if err := rows.Scan(&r.Scope, &r.Source, &r.Epoch, &r.Topic, &r.Partition, &r.Applied); err != nil {
			return nil, err
		}
		// The column is NOT NULL: a nil slice here is an empty value,
		// and nil would tell the caller the stream has no row.
		if r.Applied == nil {
			r.Applied = []byte{}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// oneRow turns the affected-row count of w's statement into its outcome:
// 1 is written, 0 is moved, anything else is an error.
func oneRow(res sql.Result, w storage.WatermarkWrite) error {
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("%s: rows affected: %w", keyText(w.WatermarkKey), err)
	case n == 0 && w.Old == nil:
		return fmt.Errorf("%w: %s already has a row", storage.ErrWatermarkMoved, keyText(w.WatermarkKey))
	case n == 0:
		return fmt.Errorf("%w: %s does not hold the value read (changed, or no row)", storage.ErrWatermarkMoved, keyText(w.WatermarkKey))
	case n != 1:
		return fmt.Errorf("%s: %d rows affected, want 1", keyText(w.WatermarkKey), n)
	}
	return nil
}

// connOf is db's connection pool (a transaction's connection, for a
// transaction), or nil if it has none.
func connOf(db *gorm.DB) gorm.ConnPool {
	if db == nil || db.Statement == nil {
		return nil
	}
	return db.Statement.ConnPool
}

// keyText names a stream in errors.
func keyText(k storage.WatermarkKey) string {
	return fmt.Sprintf("stream %q/%q[%d] of source %q epoch %d", k.Scope, k.Topic, k.Partition, k.Source, k.Epoch)
}

// checkWatermarkWrites refuses, before any statement runs, writes the
// contract rules out or another adapter could not store exactly: a key
// out of bounds, no new value or one longer than
// storage.MaxWatermarkBytes, a new value equal to the old one, keys not
// distinct and sorted.
func checkWatermarkWrites(writes []storage.WatermarkWrite) error {
	for i, w := range writes {
		if err := checkWatermarkKey(w.WatermarkKey); err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		switch {
		case w.New == nil:
			return fmt.Errorf("%w: write %d (%s) has no new value", storage.ErrInvalidConfig, i, keyText(w.WatermarkKey))
		case len(w.New) > storage.MaxWatermarkBytes:
			return fmt.Errorf("%w: write %d (%s): a value of %d bytes, at most %d allowed", storage.ErrInvalidConfig, i, keyText(w.WatermarkKey), len(w.New), storage.MaxWatermarkBytes)
		case w.Old != nil && bytes.Equal(w.Old, w.New):
			return fmt.Errorf("%w: write %d (%s): the new value equals the old one", storage.ErrInvalidConfig, i, keyText(w.WatermarkKey))
		case i > 0 && writes[i-1].Compare(w.WatermarkKey) >= 0:
			return fmt.Errorf("%w: write %d (%s): keys not distinct and sorted", storage.ErrInvalidConfig, i, keyText(w.WatermarkKey))
		}
	}
	return nil
}

// checkWatermarkKey refuses a key whose names are empty, longer than their
// limits, not UTF-8 or hold a NUL (as every adapter does: PostgreSQL's
// text cannot hold them), or whose epoch or partition is out of range.
func checkWatermarkKey(k storage.WatermarkKey) error {
	for _, f := range []struct {
		what, v string
		max     int
	}{{"scope", k.Scope, storage.MaxConsumerBytes}, {"source", k.Source, storage.MaxSourceBytes}, {"topic", k.Topic, storage.MaxTopicBytes}} {
		if err := checkName(f.what, f.v, f.max); err != nil {
			return err
		}
	}
	switch {
	case k.Epoch < 1:
		return fmt.Errorf("%w: %s: epoch below 1", storage.ErrInvalidConfig, keyText(k))
	case k.Partition < 0:
		return fmt.Errorf("%w: %s: negative partition", storage.ErrInvalidConfig, keyText(k))
	}
	return nil
}

// checkWatermarkFilter refuses a scope or topic no row can hold; an empty
// topic selects every topic.
func checkWatermarkFilter(scope, topic string) error {
	if err := checkName("scope", scope, storage.MaxConsumerBytes); err != nil {
		return err
	}
	if topic == "" {
		return nil
	}
	return checkName("topic", topic, storage.MaxTopicBytes)
}

func checkName(what, v string, maxBytes int) error {
	if v == "" || len(v) > maxBytes {
		return fmt.Errorf("%w: watermark %s of %d bytes (1..%d allowed)", storage.ErrInvalidConfig, what, len(v), maxBytes)
	}
	if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%w: watermark %s %q is not UTF-8 without NUL bytes", storage.ErrInvalidConfig, what, v)
	}
	return nil
}

var _ storage.WatermarkStore = (*Store)(nil)
