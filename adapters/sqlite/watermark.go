package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// WatermarkSuffix follows the inbox table's name in the name of its
// watermark table (storage.WatermarkStore): <table>_watermarks. A table
// name of more than 52 bytes has none (its watermark table's name would
// not be a valid identifier): the watermark methods fail with an error
// wrapping storage.ErrInvalidConfig.
const WatermarkSuffix = "_watermarks"

// WatermarkTable returns the name of the watermark table, <table>_watermarks,
// for messages that name it.
func (s *Store) WatermarkTable() string { return s.table + WatermarkSuffix }

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
// it exists, and checks the layout of an existing one (see Verify). It
// never converts a table. Concurrent callers are serialised by SQLite's
// write lock.
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
		return checkWatermarkLayout(tx, table, true)
	})
}

// watermarkColumns are the watermark table's columns, their declared
// types and their places in the primary key (0: none).
var watermarkColumns = map[string]struct {
	typ string
	pk  int
}{
	"scope": {"TEXT", 1}, "topic": {"TEXT", 2}, "partition_no": {"INTEGER", 3}, "source": {"TEXT", 4}, "epoch": {"INTEGER", 5},
	"applied": {"BLOB", 0}, "updated_at": {"TEXT", 0},
}

// collation finds the collations a CREATE TABLE names.
var collation = regexp.MustCompile(`(?i)\bCOLLATE\s+"?(\w+)`)

// checkWatermarkLayout reports how the watermark table differs from what
// the compare-and-set relies on and MigrateWatermarks makes: STRICT (a
// value of another type is refused, not converted), its columns of their
// types and NOT NULL, names compared byte for byte (no collation but
// BINARY), its primary key. A missing table is an error when mustExist,
// and otherwise not in use: nil.
func checkWatermarkLayout(db *gorm.DB, table string, mustExist bool) error {
	var defs []struct {
		SQL    string
		Strict bool
	}
	if err := db.Raw(`SELECT m.sql AS sql, COALESCE(l.strict, 0) AS strict FROM sqlite_schema m
		LEFT JOIN pragma_table_list l ON l.name = m.name AND l.schema = 'main'
		WHERE m.type = 'table' AND m.name = ?`, table).Scan(&defs).Error; err != nil {
		return fmt.Errorf("sqlite: read the layout of %s: %w", table, err)
	}
	if len(defs) == 0 {
		if !mustExist {
			return nil
		}
		return fmt.Errorf("sqlite: watermark table %s does not exist; run MigrateWatermarks", table)
	}
	var problems []string
	if !defs[0].Strict {
		problems = append(problems, "not STRICT: a value of another type would be stored converted")
	}
	for _, m := range collation.FindAllStringSubmatch(defs[0].SQL, -1) {
		if !strings.EqualFold(m[1], "BINARY") {
			problems = append(problems, fmt.Sprintf("collation %s: names differing in case could collide", m[1]))
		}
	}
	var cols []struct {
		Name, Type string
		NotNull    bool
		PK         int
	}
	if err := db.Raw(`SELECT name, type, "notnull" AS not_null, pk FROM pragma_table_info(?)`, table).Scan(&cols).Error; err != nil {
		return fmt.Errorf("sqlite: read the columns of %s: %w", table, err)
	}
	seen := map[string]bool{}
	for _, c := range cols {
		name := strings.ToLower(c.Name)
		want, ok := watermarkColumns[name]
		if !ok {
			continue
		}
		seen[name] = true
		switch {
		case !strings.EqualFold(c.Type, want.typ):
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", c.Name, c.Type, want.typ))
		case !c.NotNull:
			problems = append(problems, fmt.Sprintf("column %s is nullable, want NOT NULL", c.Name))
		case c.PK != want.pk:
			problems = append(problems, fmt.Sprintf("column %s is at place %d of the primary key, want %d (scope, topic, partition_no, source, epoch)", c.Name, c.PK, want.pk))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(watermarkColumns)) {
		if !seen[c] {
			problems = append(problems, "no column "+c)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("sqlite: watermark table %s has an unexpected layout: %s", table, strings.Join(problems, "; "))
	}
	return nil
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
	if err := storage.CheckWatermarkWrites(writes); err != nil {
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
		if err := storage.CheckWatermarkSaved(w, res, err); err != nil {
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
	if err := storage.CheckWatermarkFilter(scope, topic); err != nil {
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
	out, err := storage.ScanWatermarks(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read watermarks of %s: %w", table, err)
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
