package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// WatermarkSuffix follows the inbox table's name in the name of its
// watermark table (storage.WatermarkStore): <table>_watermarks, in the
// inbox table's database. A table name of more than 52 bytes has none
// (its watermark table's name would not be a valid identifier): the
// watermark methods fail with an error wrapping storage.ErrInvalidConfig.
const WatermarkSuffix = "_watermarks"

// errDupEntry is ER_DUP_ENTRY: the watermark table's only unique key is
// its primary key, so a plain INSERT fails with it exactly when the stream
// has a row. InnoDB undoes the statement, not the transaction.
const errDupEntry = 1062

// watermarkSQL is the watermark table's name and statements, made by New.
type watermarkSQL struct {
	name, table    string // unquoted; quoted and qualified
	err            error  // why the inbox table has no watermark table
	insert, update string
}

func newWatermarkSQL(s *Store) watermarkSQL {
	name := s.name + WatermarkSuffix
	if err := storage.ValidateIdentifier("watermark table name", name); err != nil {
		return watermarkSQL{name: name, err: fmt.Errorf("mysql: inbox table %s has no watermark table: %w", s.name, err)}
	}
	t := s.qualify(name)
	return watermarkSQL{
		name: name, table: t,
		// No IGNORE and no ON DUPLICATE KEY UPDATE: IGNORE would turn a
		// value that does not fit into a warning and 0 rows (a "moved"
		// that is none), and a no-op update reports 1 row for an existing
		// stream under clientFoundRows.
		insert: "INSERT INTO " + t + " (scope, source, epoch, topic, partition_no, applied, updated_at) VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))",
		update: "UPDATE " + t + " SET applied = ?, updated_at = UTC_TIMESTAMP(6)" +
			" WHERE scope = ? AND topic = ? AND partition_no = ? AND source = ? AND epoch = ? AND applied = ?",
	}
}

// watermarkTable is the watermark table's CREATE TABLE. Names are
// VARBINARY, compared byte for byte (the utf8mb4 collations would make
// 'a', 'A' and 'a ' one stream); a BLOB holds storage.MaxWatermarkBytes.
func (s *Store) watermarkTable() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.wm.table + ` (
		scope        VARBINARY(128) NOT NULL,
		source       VARBINARY(64)  NOT NULL,
		epoch        BIGINT         NOT NULL,
		topic        VARBINARY(255) NOT NULL,
		partition_no INT            NOT NULL,
		applied      BLOB           NOT NULL,
		updated_at   DATETIME(6)    NOT NULL,
		PRIMARY KEY (scope, topic, partition_no, source, epoch),
		CHECK (epoch >= 1),
		CHECK (partition_no >= 0)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`
}

// MigrateWatermarks creates the watermark table <table>_watermarks unless
// it exists, under a named lock of its own (GET_LOCK, as Migrate's), and
// checks the layout of an existing one: InnoDB, its key, binary names, a
// BLOB type for the values. It never converts a table.
func (s *Store) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	if s.wm.err != nil {
		return s.wm.err
	}
	return s.withNamedLock(ctx, db, s.wm.name, func(conn *gorm.DB) error {
		if err := conn.Exec(s.watermarkTable()).Error; err != nil {
			return fmt.Errorf("mysql: create %s: %w", s.wm.name, err)
		}
		return s.checkWatermarkLayout(conn)
	})
}

// checkWatermarkLayout reports how an existing watermark table differs
// from what the compare-and-set relies on.
func (s *Store) checkWatermarkLayout(db *gorm.DB) error {
	var engine sql.NullString
	err := db.Raw(`SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`,
		nullIfEmpty(s.schema), s.wm.name).Row().Scan(&engine)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("mysql: watermark table %s does not exist; run MigrateWatermarks", s.wm.name)
	}
	if err != nil {
		return fmt.Errorf("mysql: read the engine of %s: %w", s.wm.name, err)
	}
	var problems []string
	if !strings.EqualFold(engine.String, "InnoDB") {
		problems = append(problems, fmt.Sprintf("engine %q, not InnoDB: its rows would survive a rollback", engine.String))
	}
	var cols []struct {
		Name, Type string
	}
	if err := db.Raw(`SELECT COLUMN_NAME AS name, DATA_TYPE AS type FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`, nullIfEmpty(s.schema), s.wm.name).Scan(&cols).Error; err != nil {
		return fmt.Errorf("mysql: read the columns of %s: %w", s.wm.name, err)
	}
	want := map[string][]string{"scope": {"varbinary"}, "source": {"varbinary"}, "topic": {"varbinary"},
		"applied": {"blob", "mediumblob", "longblob"}}
	for _, c := range cols {
		if types, ok := want[strings.ToLower(c.Name)]; ok {
			if !slices.Contains(types, strings.ToLower(c.Type)) {
				problems = append(problems, fmt.Sprintf("column %s is %s, want %s", c.Name, c.Type, strings.Join(types, " or ")))
			}
			delete(want, strings.ToLower(c.Name))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(want)) {
		problems = append(problems, "no column "+c)
	}
	var key []string
	if err := db.Raw(`SELECT COLUMN_NAME FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX`,
		nullIfEmpty(s.schema), s.wm.name).Scan(&key).Error; err != nil {
		return fmt.Errorf("mysql: read the primary key of %s: %w", s.wm.name, err)
	}
	if k := strings.ToLower(strings.Join(key, ",")); k != "scope,topic,partition_no,source,epoch" {
		problems = append(problems, fmt.Sprintf("primary key is (%s), want (scope,topic,partition_no,source,epoch)", k))
	}
	if len(problems) > 0 {
		return fmt.Errorf("mysql: watermark table %s has an unexpected layout: %s", s.wm.name, strings.Join(problems, "; "))
	}
	return nil
}

// SaveWatermarks runs one statement per write straight on tx's connection
// (GORM would rewrite the SQL: a []byte bound right after "(" becomes one
// placeholder per byte): a plain INSERT for a stream without a row, which
// fails with ER_DUP_ENTRY (1062) when it has one, and UPDATE ... WHERE
// applied = Old for the others. An UPDATE's affected rows are the rows it
// changed, or with clientFoundRows those it matched; New differs from Old,
// so the two agree, and 0 says the stream does not hold Old. The UPDATE
// reads the latest committed row, after waiting for a concurrent
// transaction's lock, at every isolation level. Every value is checked
// against its column before a statement runs, so nothing is truncated
// whatever the sql_mode.
func (s *Store) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	if s.wm.err != nil {
		return s.wm.err
	}
	if err := checkWatermarkWrites(writes); err != nil {
		return fmt.Errorf("mysql: save watermarks in %s: %w", s.wm.name, err)
	}
	// Both statements have a fixed text: under gorm.Config{PrepareStmt:
	// true} each is prepared once per connection.
	conn := connOf(tx)
	if conn == nil {
		return fmt.Errorf("mysql: save watermarks in %s: the *gorm.DB has no connection", s.wm.name)
	}
	for _, w := range writes {
		var res sql.Result
		var err error
		if w.Old == nil {
			res, err = conn.ExecContext(ctx, s.wm.insert, []byte(w.Scope), []byte(w.Source), w.Epoch, []byte(w.Topic), w.Partition, w.New)
			var me *gomysql.MySQLError
			if errors.As(err, &me) && me.Number == errDupEntry {
				return fmt.Errorf("mysql: save the watermark in %s: %w: %s already has a row", s.wm.name, storage.ErrWatermarkMoved, keyText(w.WatermarkKey))
			}
		} else {
			res, err = conn.ExecContext(ctx, s.wm.update, w.New, []byte(w.Scope), []byte(w.Topic), w.Partition, []byte(w.Source), w.Epoch, w.Old)
		}
		if err != nil {
			return fmt.Errorf("mysql: save the watermark of %s in %s: %w", keyText(w.WatermarkKey), s.wm.name, err)
		}
		if err := oneRow(res, w); err != nil {
			return fmt.Errorf("mysql: save the watermark in %s: %w", s.wm.name, err)
		}
	}
	return nil
}

// Watermarks reads scope's rows with one SELECT on the primary key's
// prefix, straight on db's connection.
func (s *Store) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	if s.wm.err != nil {
		return nil, s.wm.err
	}
	if err := checkWatermarkFilter(scope, topic); err != nil {
		return nil, fmt.Errorf("mysql: read watermarks of %s: %w", s.wm.name, err)
	}
	q := "SELECT scope, source, epoch, topic, partition_no, applied FROM " + s.wm.table + " WHERE scope = ?"
	args := []any{[]byte(scope)}
	if topic != "" {
		q += " AND topic = ?"
		args = append(args, []byte(topic))
	}
	if partition >= 0 {
		q += " AND partition_no = ?"
		args = append(args, partition)
	}
	conn := connOf(db)
	if conn == nil {
		return nil, fmt.Errorf("mysql: read watermarks of %s: the *gorm.DB has no connection", s.wm.name)
	}
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("mysql: read watermarks of %s: %w", s.wm.name, err)
	}
	out, err := scanWatermarks(rows)
	if err != nil {
		return nil, fmt.Errorf("mysql: read watermarks of %s: %w", s.wm.name, err)
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
		var scope, source, topic []byte
		if err := rows.Scan(&scope, &source, &r.Epoch, &topic, &r.Partition, &r.Applied); err != nil {
			return nil, err
		}
		r.Scope, r.Source, r.Topic = string(scope), string(source), string(topic)
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
// value equal to the old one (its UPDATE would change no row, and without
// clientFoundRows report 0 rows: "moved"), keys not distinct and sorted.
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
// columns, not UTF-8 or hold a NUL (as every adapter does: PostgreSQL's
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
