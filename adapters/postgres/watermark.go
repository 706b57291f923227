package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

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

// WatermarkTable returns the name of the watermark table, <table>_watermarks
// (in the inbox table's schema), for messages that name it.
func (s *Store) WatermarkTable() string { return s.wm.name }

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
// layout of an existing one (see Verify): its columns and their types,
// byte-for-byte comparison of its names, its key. It never converts a
// table.
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
	return s.checkWatermarkLayout(ctx, db, true)
}

// watermarkColumns are the watermark table's columns and their types, as
// format_type names them.
var watermarkColumns = map[string]string{
	"scope": "text", "source": "text", "epoch": "bigint", "topic": "text",
	"partition_no": "integer", "applied": "bytea", "updated_at": "timestamp with time zone",
}

// checkWatermarkLayout reports how the watermark table differs from what
// the compare-and-set relies on and MigrateWatermarks makes: its columns,
// of their types and NOT NULL, names compared byte for byte (a
// deterministic collation), its primary key. A missing table is an error
// when mustExist, and otherwise not in use: nil.
func (s *Store) checkWatermarkLayout(ctx context.Context, db *gorm.DB, mustExist bool) error {
	var found struct {
		Found      bool
		PrimaryKey string
	}
	err := db.WithContext(ctx).Raw(`
		SELECT true AS found,
		       COALESCE((SELECT string_agg(a.attname, ',' ORDER BY k.ord)
		                   FROM pg_constraint con,
		                        unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
		                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
		                  WHERE con.conrelid = c.oid AND con.contype = 'p'), '') AS primary_key
		  FROM pg_class c
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relname = ?`, s.schema, s.wm.name).Scan(&found).Error
	if err != nil {
		return fmt.Errorf("postgres: read the layout of %s: %w", s.wm.table, err)
	}
	if !found.Found {
		if !mustExist {
			return nil
		}
		return fmt.Errorf("postgres: watermark table %s does not exist; run MigrateWatermarks", s.wm.table)
	}
	var cols []struct {
		Name, Type    string
		NotNull       bool
		Deterministic sql.NullBool
	}
	err = db.WithContext(ctx).Raw(`
		SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
		       coll.collisdeterministic AS deterministic
		  FROM pg_attribute a
		  JOIN pg_class c ON c.oid = a.attrelid
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		  LEFT JOIN pg_collation coll ON coll.oid = a.attcollation
		 WHERE n.nspname = ? AND c.relname = ? AND a.attnum > 0 AND NOT a.attisdropped`, s.schema, s.wm.name).Scan(&cols).Error
	if err != nil {
		return fmt.Errorf("postgres: read the columns of %s: %w", s.wm.table, err)
	}
	var problems []string
	seen := map[string]bool{}
	for _, c := range cols {
		want, ok := watermarkColumns[c.Name]
		if !ok {
			continue
		}
		seen[c.Name] = true
		switch {
		case c.Type != want:
			problems = append(problems, fmt.Sprintf("column %s has type %q, want %s", c.Name, c.Type, want))
		case !c.NotNull:
			problems = append(problems, fmt.Sprintf("column %s is nullable, want NOT NULL", c.Name))
		case want == "text" && !c.Deterministic.Bool:
			problems = append(problems, fmt.Sprintf("column %s has a nondeterministic collation: names differing in case or form could collide", c.Name))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(watermarkColumns)) {
		if !seen[c] {
			problems = append(problems, "no column "+c)
		}
	}
	if found.PrimaryKey != "scope,topic,partition_no,source,epoch" {
		problems = append(problems, fmt.Sprintf("primary key is (%s), want (scope,topic,partition_no,source,epoch)", found.PrimaryKey))
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
	if err := storage.CheckWatermarkWrites(writes); err != nil {
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
		if err := storage.CheckWatermarkSaved(w, res, err); err != nil {
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
	if err := storage.CheckWatermarkFilter(scope, topic); err != nil {
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
	out, err := storage.ScanWatermarks(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: read watermarks of %s: %w", s.wm.table, err)
	}
	return out, nil
}

// connOf is db's connection pool (a transaction's connection, for a
// transaction), or nil if it has none.
func connOf(db *gorm.DB) gorm.ConnPool {
	if db == nil || db.Statement == nil {
		return nil
	}
	return db.Statement.ConnPool
}

var _ storage.WatermarkStore = (*Store)(nil)
