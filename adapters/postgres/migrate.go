package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

func (s *Store) createStatements() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.parent() + ` (
			consumer     text COLLATE "C" NOT NULL,
			event_id     text COLLATE "C" NOT NULL,
			day          date        NOT NULL,
			event_time   timestamptz NOT NULL,
			topic        text        NOT NULL DEFAULT '',
			partition_no integer     NOT NULL DEFAULT 0,
			offset_no    bigint      NOT NULL DEFAULT 0,
			processed_at timestamptz NOT NULL DEFAULT now(),
			CONSTRAINT ` + quoteIdent(s.table+"_pkey") + ` PRIMARY KEY (consumer, event_id, day)
		) PARTITION BY RANGE (day)`,
	}
}

// MigrationSQL returns the schema and table statements of Migrate, a
// partition for each day from plan.Today through plan.PrepareThrough,
// created directly (on an empty table that is what Maintain's steps for a
// new partition come to), and MigrateWatermarks' watermark table, unless
// the inbox table's name leaves no room for one.
func (s *Store) MigrationSQL(plan storage.MaintenancePlan) ([]string, error) {
	if plan.PrepareThrough.Before(plan.Today) {
		return nil, fmt.Errorf("%w: plan prepares through %s, before %s", storage.ErrInvalidConfig, dayText(plan.PrepareThrough), dayText(plan.Today))
	}
	stmts := append([]string{`CREATE SCHEMA IF NOT EXISTS ` + quoteIdent(s.schema)}, s.createStatements()...)
	for d := storage.DayOf(plan.Today); !d.After(plan.PrepareThrough); d = d.AddDate(0, 0, 1) {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+s.qualified(partitionName(s.table, d))+` PARTITION OF `+s.parent()+` `+bounds(d))
	}
	if s.wm.err == nil {
		stmts = append(stmts, s.watermarkStatements()...)
	}
	return stmts, nil
}

// Migrate creates the schema if it is missing (see createSchema) and the
// partitioned inbox table, in one transaction under the store's advisory
// lock, checks that an existing table has the expected layout, and makes
// the partitions of the day before today through Options.InitialDays after
// it (UTC, by the wall clock). Maintain makes later days' partitions, and
// the inbox any other day's on demand ([Store.PrepareDays]).
//
// An existing table of another layout (not partitioned by RANGE (day), a
// DEFAULT partition, another key, a nondeterministic collation) makes
// Migrate fail with an error that names the table and what it found;
// Migrate never converts or drops such a table, nor makes partitions for it.
func (s *Store) Migrate(ctx context.Context, db *gorm.DB) error {
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := s.createSchema(tx); err != nil {
			return err
		}
		if err := s.lock(tx); err != nil {
			return err
		}
		for _, q := range s.createStatements() {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: migrate %s: %w", s.parent(), err)
			}
		}
		return nil
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	db = db.WithContext(ctx)
	if err := s.checkLayout(ctx, db); err != nil {
		return err
	}
	today := storage.DayOf(time.Now())
	for d := today.AddDate(0, 0, -1); !d.After(today.AddDate(0, 0, s.initialDays)); d = d.AddDate(0, 0, 1) {
		if _, err := s.makeDay(db, d); err != nil {
			return err
		}
	}
	return nil
}

// createSchema creates the store's schema in tx unless it exists, without
// needing the CREATE privilege on the database when it does. The stores of
// one schema (inbox tables, the outbox) migrate under advisory locks of
// their own, and two transactions that create one schema at once fail in
// all but one of them (SQLSTATE 23505, pg_namespace_nspname_index; CREATE
// SCHEMA IF NOT EXISTS included): so a missing schema is created under a
// lock of its own (schemaKey), held until tx ends, and looked up again once
// it is held, for a schema that the previous holder created. tx must be
// READ COMMITTED (each statement sees what committed before it), and this
// must come before the store's lock, so that every Migrate takes the two
// in the same order.
func (s *Store) createSchema(tx *gorm.DB) error {
	for locked := false; ; locked = true {
		var exists bool
		if err := tx.Raw(`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = ?)`, s.schema).Scan(&exists).Error; err != nil {
			return fmt.Errorf("postgres: look up schema %s: %w", s.schema, err)
		}
		switch {
		case exists:
			return nil
		case locked:
			if err := tx.Exec(`CREATE SCHEMA ` + quoteIdent(s.schema)).Error; err != nil {
				return fmt.Errorf("postgres: create schema %s: %w", s.schema, err)
			}
			return nil
		}
		if err := tx.Exec(`SELECT pg_advisory_xact_lock(?)`, s.schemaKey).Error; err != nil {
			return fmt.Errorf("postgres: advisory lock for creating schema %s: %w", s.schema, err)
		}
	}
}

// checkLayout reports how the existing inbox table differs from what the
// store relies on: a table partitioned by RANGE on a date column day, with
// the key (consumer, event_id, day), whose id columns compare byte for
// byte, and no DEFAULT partition (a day without a partition must fail its
// claim, so that the inbox makes the day's partition; a DEFAULT partition
// would take the row instead, and every partition made later would have to
// scan it).
func (s *Store) checkLayout(ctx context.Context, db *gorm.DB) error {
	var layout struct {
		Found         bool
		Strategy      string
		KeyColumns    string
		DayType       string
		DefaultName   string
		PrimaryKey    string
		Deterministic bool
	}
	err := db.WithContext(ctx).Raw(`
		SELECT true AS found,
		       COALESCE(pt.partstrat::text, '') AS strategy,
		       COALESCE((SELECT string_agg(a.attname, ',' ORDER BY k.ord)
		                   FROM unnest(pt.partattrs::int2[]) WITH ORDINALITY AS k(attnum, ord)
		                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum), '') AS key_columns,
		       COALESCE((SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		                  WHERE a.attrelid = c.oid AND a.attname = 'day' AND NOT a.attisdropped), '') AS day_type,
		       COALESCE((SELECT d.relname FROM pg_class d WHERE d.oid = pt.partdefid), '') AS default_name,
		       COALESCE((SELECT string_agg(a.attname, ',' ORDER BY k.ord)
		                   FROM pg_constraint con,
		                        unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
		                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
		                  WHERE con.conrelid = c.oid AND con.contype = 'p'), '') AS primary_key,
		       COALESCE((SELECT bool_and(coll.collisdeterministic) FROM pg_attribute a
		                   JOIN pg_collation coll ON coll.oid = a.attcollation
		                  WHERE a.attrelid = c.oid AND a.attname IN ('consumer', 'event_id')), false) AS deterministic
		  FROM pg_class c
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		  LEFT JOIN pg_partitioned_table pt ON pt.partrelid = c.oid
		 WHERE n.nspname = ? AND c.relname = ?`, s.schema, s.table).Scan(&layout).Error
	if err != nil {
		return fmt.Errorf("postgres: read the layout of %s: %w", s.parent(), err)
	}
	if !layout.Found {
		return fmt.Errorf("postgres: inbox table %s does not exist; run Migrate", s.parent())
	}
	var problems []string
	if layout.Strategy != "r" || layout.KeyColumns != "day" {
		problems = append(problems, fmt.Sprintf("not partitioned by RANGE (day) (strategy %q, key %q)", layout.Strategy, layout.KeyColumns))
	}
	if layout.DayType != "date" {
		problems = append(problems, fmt.Sprintf("column day has type %q, want date", layout.DayType))
	}
	if layout.DefaultName != "" {
		problems = append(problems, fmt.Sprintf("DEFAULT partition %q: not supported, every day needs a partition of its own (move its rows into day partitions and drop it)", layout.DefaultName))
	}
	if layout.PrimaryKey != "consumer,event_id,day" {
		problems = append(problems, fmt.Sprintf("primary key is (%s), want (consumer,event_id,day)", layout.PrimaryKey))
	}
	if !layout.Deterministic {
		problems = append(problems, "consumer or event_id has a nondeterministic collation: ids differing in case or form could collide")
	}
	if len(problems) > 0 {
		return fmt.Errorf("postgres: inbox table %s has an unexpected layout: %s", s.parent(), strings.Join(problems, "; "))
	}
	return nil
}

// Verify checks the inbox table's layout (see Migrate), the watermark
// table's if it exists (see MigrateWatermarks; without one, sequenced
// dedup is not in use, which is no problem), and the server settings that
// durability of committed inbox rows rests on: fsync and full_page_writes
// on, synchronous_commit not off. With synchronous_commit off a crash can
// lose transactions that were reported committed, after the consumer
// committed their broker offsets: those messages would be lost.
func (s *Store) Verify(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	var problems []error
	if err := s.checkLayout(ctx, db); err != nil {
		problems = append(problems, err)
	}
	if s.wm.err == nil {
		if err := s.checkWatermarkLayout(ctx, db, false); err != nil {
			problems = append(problems, err)
		}
	}
	settings, err := durabilityProblems(db)
	if err != nil {
		return err
	}
	problems = append(problems, settings...)
	if len(problems) > 0 {
		return fmt.Errorf("postgres: unsafe settings: %w", errors.Join(problems...))
	}
	return nil
}

// durabilityProblems reports the server settings under which a committed
// transaction (an inbox row, an outbox message) can be lost or corrupted by
// a crash: fsync or full_page_writes off, synchronous_commit off.
func durabilityProblems(db *gorm.DB) ([]error, error) {
	var set struct {
		Fsync             string
		FullPageWrites    string
		SynchronousCommit string
	}
	if err := db.Raw(`SELECT current_setting('fsync') AS fsync, current_setting('full_page_writes') AS full_page_writes,
		current_setting('synchronous_commit') AS synchronous_commit`).Scan(&set).Error; err != nil {
		return nil, fmt.Errorf("postgres: read settings: %w", err)
	}
	var problems []error
	if set.Fsync != "on" {
		problems = append(problems, fmt.Errorf("fsync is %q: a crash can corrupt or lose committed rows", set.Fsync))
	}
	if set.FullPageWrites != "on" {
		problems = append(problems, fmt.Errorf("full_page_writes is %q: a crash can corrupt pages", set.FullPageWrites))
	}
	if set.SynchronousCommit == "off" {
		problems = append(problems, errors.New("synchronous_commit is off: a crash can lose committed transactions whose offsets were already committed"))
	}
	return problems, nil
}
