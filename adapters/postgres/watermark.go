package postgres

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// WatermarkSuffix follows the inbox table's name in the name of its
// watermark table (storage.WatermarkStore): <table>_watermarks, in the
// inbox table's schema. A table name longer than MaxTableBytes minus one
// has none: its watermark table's name would not fit PostgreSQL's 63
// bytes, and the watermark methods fail with an error wrapping
// storage.ErrInvalidConfig.
const WatermarkSuffix = "_watermarks"

// watermarkSQL is the watermark table's name and statements, made by New.
type watermarkSQL struct {
	name, table    string // unquoted; quoted and schema-qualified
	err            error  // why the inbox table has no watermark table
	insert, update string
}

func newWatermarkSQL(s *Store) watermarkSQL {
	name := s.table + WatermarkSuffix
	if err := storage.ValidateIdentifier("watermark table name", name); err != nil {
		return watermarkSQL{name: name, err: fmt.Errorf("postgres: inbox table %s has no watermark table: %w", s.parent(), err)}
	}
	t := s.qualified(name)
	return watermarkSQL{
		name: name, table: t,
		insert: `INSERT INTO ` + t + ` (scope, source, epoch, topic, partition_no, applied) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (scope, topic, partition_no, source, epoch) DO NOTHING`,
		update: `UPDATE ` + t + ` SET applied = $1, updated_at = now()
			WHERE scope = $2 AND topic = $3 AND partition_no = $4 AND source = $5 AND epoch = $6 AND applied = $7`,
	}
}

// watermarkStatements make the watermark table. Every update replaces
// applied and updated_at, which no index covers, so that it can be a
// heap-only tuple update (no index entry written) in the room the fill
// factor leaves on the row's page: the table holds one small row per
// stream, updated by every transaction of the stream.
func (s *Store) watermarkStatements() []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + s.wm.table + ` (
			scope        text COLLATE "C" NOT NULL,
			source       text COLLATE "C" NOT NULL,
			epoch        bigint      NOT NULL CHECK (epoch >= 1),
			topic        text COLLATE "C" NOT NULL,
			partition_no integer     NOT NULL CHECK (partition_no >= 0),
			applied      bytea       NOT NULL,
			updated_at   timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (scope, topic, partition_no, source, epoch)
		) WITH (fillfactor = 50)`}
}

// MigrateWatermarks creates the watermark table <table>_watermarks (and
// the schema, if it is missing) unless it exists, in one transaction
// under the store's advisory lock (two CREATE TABLE IF NOT EXISTS of one
// name at once can fail on the catalog's unique index), and checks the
// layout of an existing one: its key, byte-for-byte comparison of its
// names, bytea values. It never converts a table.
func (s *Store) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	if s.wm.err != nil {
		return s.wm.err
	}
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := s.createSchema(tx); err != nil {
			return err
		}
		if err := s.lock(tx); err != nil {
			return err
		}
		for _, q := range s.watermarkStatements() {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: migrate %s: %w", s.wm.table, err)
			}
		}
		return nil
	}, readCommitted)
	if err != nil {
		return err
	}
	return s.checkWatermarkLayout(ctx, db)
}

// checkWatermarkLayout reports how an existing watermark table differs
// from what the compare-and-set relies on.
func (s *Store) checkWatermarkLayout(ctx context.Context, db *gorm.DB) error {
	var layout struct {
		Found         bool
		PrimaryKey    string
		Deterministic bool
		AppliedType   string
	}
	err := db.WithContext(ctx).Raw(`
		SELECT true AS found,
		       COALESCE((SELECT string_agg(a.attname, ',' ORDER BY k.ord)
		                   FROM pg_constraint con,
		                        unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
		                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
		                  WHERE con.conrelid = c.oid AND con.contype = 'p'), '') AS primary_key,
		       COALESCE((SELECT bool_and(coll.collisdeterministic) AND count(*) = 3 FROM pg_attribute a
		                   JOIN pg_collation coll ON coll.oid = a.attcollation
		                  WHERE a.attrelid = c.oid AND a.attname IN ('scope', 'topic', 'source') AND NOT a.attisdropped), false) AS deterministic,
		       COALESCE((SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		                  WHERE a.attrelid = c.oid AND a.attname = 'applied' AND NOT a.attisdropped), '') AS applied_type
		  FROM pg_class c
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relname = ?`, s.schema, s.wm.name).Scan(&layout).Error
	if err != nil {
		return fmt.Errorf("postgres: read the layout of %s: %w", s.wm.table, err)
	}
	if !layout.Found {
		return fmt.Errorf("postgres: watermark table %s does not exist; run MigrateWatermarks", s.wm.table)
	}
	var problems []string
	if layout.PrimaryKey != "scope,topic,partition_no,source,epoch" {
		problems = append(problems, fmt.Sprintf("primary key is (%s), want (scope,topic,partition_no,source,epoch)", layout.PrimaryKey))
	}
	if !layout.Deterministic {
		problems = append(problems, "scope, topic or source is missing or has a nondeterministic collation: names differing in case or form could collide")
	}
	if layout.AppliedType != "bytea" {
		problems = append(problems, fmt.Sprintf("column applied has type %q, want bytea", layout.AppliedType))
	}
	if len(problems) > 0 {
		return fmt.Errorf("postgres: watermark table %s has an unexpected layout: %s", s.wm.table, strings.Join(problems, "; "))
	}
	return nil
}

// SaveWatermarks runs one statement per write on tx's connection, as it is
// (no GORM statement building): INSERT ... ON CONFLICT DO NOTHING for a
// stream without a row, UPDATE ... WHERE applied = Old for the others.
// Either affects 0 rows exactly when the stream does not hold Old (at READ
// COMMITTED an UPDATE that waited for a concurrent transaction's row lock
// compares with the row that transaction committed); at REPEATABLE READ and
// SERIALIZABLE a row committed after tx's snapshot fails the statement
// with 40001 instead, which IsRetryable reports, and the run that follows
// sees it. Nothing is written before every write is checked.
func (s *Store) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	if s.wm.err != nil {
		return s.wm.err
	}
	if err := checkWatermarkWrites(writes); err != nil {
		return fmt.Errorf("postgres: save watermarks in %s: %w", s.wm.table, err)
	}
	conn := connOf(tx)
	if conn == nil {
		return fmt.Errorf("postgres: save watermarks in %s: the *gorm.DB has no connection", s.wm.table)
	}
	for _, w := range writes {
		var res sql.Result
		var err error
		if w.Old == nil {
			res, err = conn.ExecContext(ctx, s.wm.insert, w.Scope, w.Source, w.Epoch, w.Topic, w.Partition, w.New)
		} else {
			res, err = conn.ExecContext(ctx, s.wm.update, w.New, w.Scope, w.Topic, w.Partition, w.Source, w.Epoch, w.Old)
		}
		if err != nil {
			return fmt.Errorf("postgres: save the watermark of %s in %s: %w", keyText(w.WatermarkKey), s.wm.table, err)
		}
		if err := oneRow(res, w); err != nil {
			return fmt.Errorf("postgres: save the watermark in %s: %w", s.wm.table, err)
		}
	}
	return nil
}

// Watermarks reads scope's rows with one SELECT on the primary key's
// prefix.
func (s *Store) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	if s.wm.err != nil {
		return nil, s.wm.err
	}
	if err := checkWatermarkFilter(scope, topic); err != nil {
		return nil, fmt.Errorf("postgres: read watermarks of %s: %w", s.wm.table, err)
	}
	q := `SELECT scope, source, epoch, topic, partition_no, applied FROM ` + s.wm.table + ` WHERE scope = $1`
	args := []any{scope}
	if topic != "" {
		args = append(args, topic)
		q += ` AND topic = $` + strconv.Itoa(len(args))
	}
	if partition >= 0 {
		args = append(args, partition)
		q += ` AND partition_no = $` + strconv.Itoa(len(args))
	}
	conn := connOf(db)
	if conn == nil {
		return nil, fmt.Errorf("postgres: read watermarks of %s: the *gorm.DB has no connection", s.wm.table)
	}
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("postgres: read watermarks of %s: %w", s.wm.table, err)
	}
	out, err := scanWatermarks(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: read watermarks of %s: %w", s.wm.table, err)
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
// table cannot store exactly or the contract rules out: a key out of
// bounds, no new value or one longer than storage.MaxWatermarkBytes, a new
// value equal to the old one, keys not distinct and sorted.
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
// limits, not UTF-8 or hold a NUL (which text refuses), or whose epoch or
// partition is out of range.
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
