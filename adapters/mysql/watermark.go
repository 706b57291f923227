package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

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

// WatermarkTable returns the name of the watermark table, <table>_watermarks
// (in the inbox table's database), for messages that name it.
func (s *Store) WatermarkTable() string { return s.wm.name }

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
// checks the layout of an existing one (see Verify): InnoDB, its columns
// and their types, its key. It never converts a table.
func (s *Store) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	if s.wm.err != nil {
		return s.wm.err
	}
	return s.withNamedLock(ctx, db, s.wm.name, func(conn *gorm.DB) error {
		if err := conn.Exec(s.watermarkTable()).Error; err != nil {
			return fmt.Errorf("mysql: create %s: %w", s.wm.name, err)
		}
		return s.checkWatermarkLayout(conn, true)
	})
}

// watermarkColumns are the watermark table's columns, the DATA_TYPEs
// each may have, and the bytes a VARBINARY must hold at least.
var watermarkColumns = map[string]struct {
	types []string
	bytes int
}{
	"scope":        {[]string{"varbinary"}, storage.MaxConsumerBytes},
	"source":       {[]string{"varbinary"}, storage.MaxSourceBytes},
	"epoch":        {[]string{"bigint"}, 0},
	"topic":        {[]string{"varbinary"}, storage.MaxTopicBytes},
	"partition_no": {[]string{"int"}, 0},
	"applied":      {[]string{"blob", "mediumblob", "longblob"}, 0},
	"updated_at":   {[]string{"datetime"}, 0},
}

// checkWatermarkLayout reports how the watermark table differs from what
// the compare-and-set relies on and MigrateWatermarks makes: InnoDB, its
// columns of their types (binary names, long enough, NOT NULL; a BLOB type
// for the values), its primary key. A missing table is an error when
// mustExist, and otherwise not in use: nil.
func (s *Store) checkWatermarkLayout(db *gorm.DB, mustExist bool) error {
	var engine sql.NullString
	err := db.Raw(`SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`,
		nullIfEmpty(s.schema), s.wm.name).Row().Scan(&engine)
	if errors.Is(err, sql.ErrNoRows) {
		if !mustExist {
			return nil
		}
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
		Name, Type, Nullable string
		Length               sql.NullInt64
	}
	if err := db.Raw(`SELECT COLUMN_NAME AS name, DATA_TYPE AS type, IS_NULLABLE AS nullable, CHARACTER_MAXIMUM_LENGTH AS length
		FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`, nullIfEmpty(s.schema), s.wm.name).Scan(&cols).Error; err != nil {
		return fmt.Errorf("mysql: read the columns of %s: %w", s.wm.name, err)
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
		case !slices.Contains(want.types, strings.ToLower(c.Type)):
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", c.Name, c.Type, strings.Join(want.types, " or ")))
		case want.bytes > 0 && c.Length.Int64 < int64(want.bytes):
			problems = append(problems, fmt.Sprintf("column %s holds %d bytes, want %d", c.Name, c.Length.Int64, want.bytes))
		case !strings.EqualFold(c.Nullable, "NO"):
			problems = append(problems, fmt.Sprintf("column %s is nullable, want NOT NULL", c.Name))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(watermarkColumns)) {
		if !seen[c] {
			problems = append(problems, "no column "+c)
		}
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
	if err := storage.CheckWatermarkWrites(writes); err != nil {
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
				// The INSERT inserted no row: the stream has one.
				res, err = driver.RowsAffected(0), nil
			}
		} else {
			res, err = conn.ExecContext(ctx, s.wm.update, w.New, []byte(w.Scope), []byte(w.Topic), w.Partition, []byte(w.Source), w.Epoch, w.Old)
		}
		if err := storage.CheckWatermarkSaved(w, res, err); err != nil {
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
	if err := storage.CheckWatermarkFilter(scope, topic); err != nil {
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
	out, err := storage.ScanWatermarks(rows)
	if err != nil {
		return nil, fmt.Errorf("mysql: read watermarks of %s: %w", s.wm.name, err)
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
