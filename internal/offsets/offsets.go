// Package offsets is the consumer's table of stored offsets
// (consumer.Config.StoreOffsets): the next offset to read of each partition,
// written in the transaction of the effect that made it so.
package offsets

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// offsetRow is one row of the offsets table: the next offset to read of one
// partition for one group, written in the transaction of the effect that
// made it so, with the group generation of its writer and what identifies
// the last message before it. The columns after next_offset came later:
// they have defaults, so that a row written by a version without them (an
// older replica during a rolling deploy) is valid, and Migrate adds them to
// an existing table.
type offsetRow struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
	// Generation is the consumer group generation of the member that wrote
	// the row (0: unknown, a row of a version without the column).
	Generation int32 `gorm:"column:generation;not null;default:0"`
	// LastOffset and LastFingerprint identify the message the stored offset
	// follows: its offset (next_offset - 1 when written with it; -1 if
	// unknown) and a fingerprint of its content (0 if unknown). A row whose
	// LastOffset is not next_offset - 1 was moved by a writer that did not
	// know the message (the group's offset stored at assignment, a version
	// without the columns): its fingerprint says nothing.
	LastOffset      int64 `gorm:"column:last_offset;not null;default:-1"`
	LastFingerprint int64 `gorm:"column:last_fingerprint;not null;default:0"`
}

// Row is a partition's stored position.
type Row struct {
	Next       int64 // the next offset to read
	Generation int32 // the group generation of the member that wrote it; 0 if unknown
	// Last is the fingerprint of the message at Next - 1, the last one
	// finished before the offset was stored; 0 if unknown.
	Last int64
}

// Write is what one write stores for a partition.
type Write struct {
	Next       int64 // the next offset to read
	Generation int32 // the writer's group generation
	Last       int64 // the fingerprint of the message at Next - 1; 0 if unknown
}

func (w Write) columns() map[string]any {
	last := int64(-1)
	if w.Last != 0 {
		last = w.Next - 1
	}
	return map[string]any{"next_offset": w.Next, "generation": w.Generation, "last_offset": last, "last_fingerprint": w.Last}
}

// Store is the offsets table of one consumer group.
type Store struct {
	Table string // the table's name, a plain identifier
	Group string // the consumer group whose rows it reads and writes
}

// Migrate creates the offsets table if it does not exist, and adds the
// columns that came later (generation, last_offset, last_fingerprint: NOT
// NULL with a default, so existing rows stay valid and a version that does
// not know them still writes) to a table made without them. It is safe when
// several processes run it at once (the replicas of a deployment starting
// together), which GORM's AutoMigrate alone is not: it checks for the table
// and then creates it, and all but the first creator fail (PostgreSQL:
// SQLSTATE 23505 on pg_type; MySQL/MariaDB: error 1050; SQLite: "table
// already exists"). On PostgreSQL and MySQL/MariaDB the callers take turns
// under a lock of the database named after the table (a transaction-level
// advisory lock; GET_LOCK), so the first creates the table and the others
// find it; on SQLite, whose write lock already orders them, a caller whose
// CREATE lost the race finds the table made and migrates it as an existing
// table; the same holds for the columns it adds (a caller whose ALTER lost
// the race migrates again). The dialect is told by its name and the locks
// are plain SQL: this package imports no database driver.
//
// On MySQL/MariaDB the table is created as InnoDB whatever the server's
// default engine: a stored offset must roll back with the effect it
// belongs to, which MyISAM ignores (its 1000-byte key limit also refused
// the table: error 1071). An existing table there on an engine without
// transactions makes migrate fail.
func (s Store) Migrate(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	autoMigrate := func(db *gorm.DB) error {
		if err := db.Table(s.Table).AutoMigrate(&offsetRow{}); err != nil {
			return fmt.Errorf("consumer: migrate %s: %w", s.Table, err)
		}
		return nil
	}
	switch db.Name() {
	case "postgres":
		h := fnv.New64a()
		h.Write([]byte("github.com/inboxgo/inbox/consumer offsets table\x00" + s.Table))
		// READ COMMITTED, so that the check for the table, after the lock,
		// sees a table that the previous holder committed.
		return db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(`SELECT pg_advisory_xact_lock(?)`, int64(h.Sum64())).Error; err != nil {
				return fmt.Errorf("consumer: lock for migrating %s: %w", s.Table, err)
			}
			return autoMigrate(tx)
		}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	case "mysql":
		// On one connection, which holds the named lock (the DDL commits
		// by itself); the lock is released even when ctx has ended, and a
		// connection that cannot release it is discarded, so that no pooled
		// connection keeps it.
		const lockName = "CONCAT('inbox-offsets:', LEFT(SHA2(CONCAT(COALESCE(DATABASE(), ''), '.', ?), 256), 40))"
		const lockWait = time.Minute
		return db.Connection(func(pinned *gorm.DB) error {
			conn := pinned.Session(&gorm.Session{}) // each statement on a copy of its own
			var got sql.NullInt64
			if err := conn.Raw("SELECT GET_LOCK("+lockName+", ?)", s.Table, int(lockWait/time.Second)).Row().Scan(&got); err != nil {
				return fmt.Errorf("consumer: lock for migrating %s: %w", s.Table, err)
			}
			if !got.Valid || got.Int64 != 1 {
				return fmt.Errorf("consumer: another process kept the lock for migrating %s for more than %v", s.Table, lockWait)
			}
			defer func() {
				cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if conn.WithContext(cleanup).Exec("SELECT RELEASE_LOCK("+lockName+")", s.Table).Error != nil {
					if c, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
						_ = c.Raw(func(any) error { return driver.ErrBadConn })
					}
				}
			}()
			// Before AutoMigrate, whose ALTERs of a MyISAM table fail with
			// errors that do not name the engine.
			if err := s.checkTransactional(conn); err != nil {
				return err
			}
			if err := autoMigrate(conn.Set("gorm:table_options", "ENGINE=InnoDB")); err != nil {
				return err
			}
			return s.checkTransactional(conn)
		})
	}
	err := autoMigrate(db)
	// The table (or a column) is there now: made by another process. Each
	// failure is another caller's success, so this ends.
	for range 8 {
		if err == nil || !db.Migrator().HasTable(s.Table) {
			break
		}
		err = autoMigrate(db)
	}
	return err
}

// checkTransactional fails if the offsets table exists (in the current
// MySQL/MariaDB database) on an engine without transactions.
func (s Store) checkTransactional(db *gorm.DB) error {
	var rows []struct {
		Engine       sql.NullString
		Transactions sql.NullString
	}
	err := db.Raw(`SELECT t.ENGINE AS engine, e.TRANSACTIONS AS transactions
		FROM information_schema.TABLES t LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE
		WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = ?`, s.Table).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("consumer: read the engine of the offsets table %s: %w", s.Table, err)
	}
	if len(rows) == 0 {
		return nil // not created yet
	}
	if r := rows[0]; !strings.EqualFold(r.Transactions.String, "YES") {
		return fmt.Errorf("consumer: the offsets table %s uses engine %q, which has no transactions: a stored offset would survive the rollback of its effect, and the message would be skipped; convert it (ALTER TABLE %s ENGINE=InnoDB) or drop it and call Migrate again",
			s.Table, r.Engine.String, s.Table)
	}
	return nil
}

// ErrPositionMoved reports that the partition's stored offset is no longer
// at or past the last one this worker committed: the database lost commits
// (a failover to a replica that lacked them) or the row was reset.
var ErrPositionMoved = errors.New("consumer: the stored offset moved back since this worker committed it")

// ErrTakenOver is wrapped by a *TakenOverError.
var ErrTakenOver = errors.New("consumer: the stored offset was written by a newer generation of the group")

// TakenOverError reports a write refused because the row was written by a
// newer generation of the group than the writer's: another member took the
// partition over (the writer was paused past its session timeout and its
// generation is over), or the group was recreated and its generation ids
// started again. Nothing was written.
type TakenOverError struct {
	Topic      string
	Partition  int
	Generation int32 // the row's
	Mine       int32 // the writer's
	Next       int64 // the row's next offset
}

func (e *TakenOverError) Error() string {
	return fmt.Sprintf("%v: %s/%d is stored at %d by generation %d, this member's is %d",
		ErrTakenOver, e.Topic, e.Partition, e.Next, e.Generation, e.Mine)
}

func (e *TakenOverError) Unwrap() error { return ErrTakenOver }

// Save stores w as the partition's position inside tx, unless the row was
// written by a newer generation of the group (*TakenOverError; nothing is
// written). It creates the row if there is none. Moving an offset
// backwards is harmless here (the inbox absorbs the redelivery); the
// consumer never writes one past a message that is not finished.
func (s Store) Save(ctx context.Context, tx *gorm.DB, topic string, partition int, w Write) error {
	return s.write(ctx, tx, topic, partition, -1, w)
}

// Advance is Save for a worker that has committed floor as the stored
// offset (floor < 0: nothing yet, as Save): it writes w only if the stored
// offset is still at least floor and the row's generation is not newer than
// w's. Otherwise nothing is written and it returns a *TakenOverError when
// the row's generation is newer (this member lost the partition: the
// transaction must roll back), or ErrPositionMoved when the offset went
// back with a generation that is not newer (the database lost the worker's
// earlier commits: a failover), so that the transaction rolls back instead
// of committing effects on top of a database that lost the earlier ones.
// Both checks ride on the UPDATE; only an UPDATE that changes no row costs
// a second statement.
func (s Store) Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor int64, w Write) error {
	return s.write(ctx, tx, topic, partition, floor, w)
}

func (s Store) write(ctx context.Context, tx *gorm.DB, topic string, partition int, floor int64, w Write) error {
	tx = tx.WithContext(ctx)
	for inserted := false; ; inserted = true {
		q := tx.Table(s.Table).Where(s.key(topic, partition)).Where("generation <= ?", w.Generation)
		if floor >= 0 {
			q = q.Where("next_offset >= ?", floor)
		}
		res := q.Updates(w.columns())
		if res.Error != nil {
			return fmt.Errorf("consumer: store offset %d of %s/%d: %w", w.Next, topic, partition, res.Error)
		}
		if res.RowsAffected > 0 {
			return nil
		}
		// No row matched, or (MySQL/MariaDB) the row already held these
		// values: read it to tell which.
		cur, found, err := s.read(ctx, tx, topic, partition, true)
		switch {
		case err != nil:
			return err
		case found && cur.Generation > w.Generation:
			return &TakenOverError{Topic: topic, Partition: partition, Generation: cur.Generation, Mine: w.Generation, Next: cur.Next}
		case found && floor >= 0 && cur.Next < floor:
			return fmt.Errorf("%w: %s/%d is stored at %d (by generation %d), this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
				ErrPositionMoved, topic, partition, cur.Next, cur.Generation, floor)
		case found:
			return nil // unchanged
		case floor >= 0:
			return fmt.Errorf("%w: %s/%d has no stored offset, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
				ErrPositionMoved, topic, partition, floor)
		case inserted:
			return fmt.Errorf("consumer: store offset %d of %s/%d: the row inserted is not there", w.Next, topic, partition)
		}
		// No row yet: insert it, then write it through the checked UPDATE
		// again, so that a row another writer inserted meanwhile is
		// checked as well (whatever RowsAffected an upsert reports).
		row := offsetRow{GroupID: s.Group, Topic: topic, Partition: int32(partition), NextOffset: w.Next, Generation: w.Generation, LastOffset: -1}
		if err := tx.Table(s.Table).Clauses(clause.OnConflict{DoNothing: true}).Create(&row).Error; err != nil {
			return fmt.Errorf("consumer: store offset %d of %s/%d: %w", w.Next, topic, partition, err)
		}
	}
}

// Claim marks the partition's row as written by generation gen, if it was
// written by an older one (or by none known), and returns the row as it is
// then; found is false when there is none. A member claims a partition as
// it is assigned, before it reads its position: from then on a write of an
// older generation (a member paused past its session timeout, resuming
// before it learns that its generation is over) is refused, even before
// the new owner writes an offset. A row of a newer generation is left as
// it is and returned: the caller decides whether its own generation is
// over or the group was recreated (see Adopt).
func (s Store) Claim(ctx context.Context, db *gorm.DB, topic string, partition int, gen int32) (row Row, found bool, err error) {
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Table(s.Table).Where(s.key(topic, partition)).Where("generation < ?", gen).Update("generation", gen)
		if res.Error != nil {
			return fmt.Errorf("consumer: claim the stored offset of %s/%d: %w", topic, partition, res.Error)
		}
		row, found, err = s.read(ctx, tx, topic, partition, false)
		return err
	})
	return row, found, err
}

// Adopt sets the generation of the partition's row from from to gen, for a
// member whose generation is current (the group coordinator accepted its
// commit) although the row names a newer one: the group was deleted and
// recreated, and its generation ids started again. It reports false if the
// row no longer holds generation from (another writer came first).
func (s Store) Adopt(ctx context.Context, db *gorm.DB, topic string, partition int, from, gen int32) (bool, error) {
	var n int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Table(s.Table).Where(s.key(topic, partition)).Where("generation = ?", from).Update("generation", gen)
		n = res.RowsAffected
		if res.Error != nil {
			return fmt.Errorf("consumer: take over the stored offset of %s/%d: %w", topic, partition, res.Error)
		}
		if n == 0 {
			// MySQL/MariaDB report 0 rows when from == gen.
			cur, found, err := s.read(ctx, tx, topic, partition, true)
			if err == nil && found && cur.Generation == gen {
				n = 1
			}
			return err
		}
		return nil
	})
	return n > 0, err
}

// Load returns the stored next offset of the partition, or -1 if none.
func (s Store) Load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error) {
	row, found, err := s.Read(ctx, db, topic, partition)
	if err != nil || !found {
		return -1, err
	}
	return row.Next, nil
}

// Read returns the partition's stored position; found is false if there is
// none.
func (s Store) Read(ctx context.Context, db *gorm.DB, topic string, partition int) (row Row, found bool, err error) {
	return s.read(ctx, db, topic, partition, false)
}

// read reads the row through db; locking reads it with a lock (FOR UPDATE)
// on PostgreSQL and MySQL/MariaDB, so that inside a transaction at
// REPEATABLE READ (MySQL's default) it sees the row as the UPDATE before it
// did, not the transaction's snapshot. SQLite has one writer: its
// transactions see the latest row anyway.
func (s Store) read(ctx context.Context, db *gorm.DB, topic string, partition int, locking bool) (Row, bool, error) {
	var r offsetRow
	q := db.WithContext(ctx).Table(s.Table).Where(s.key(topic, partition))
	if locking && db.Name() != "sqlite" {
		q = q.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
	}
	err := q.Take(&r).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("consumer: load stored offset of %s/%d: %w", topic, partition, err)
	}
	row := Row{Next: r.NextOffset, Generation: r.Generation}
	if r.LastOffset >= 0 && r.LastOffset == r.NextOffset-1 {
		row.Last = r.LastFingerprint
	}
	return row, true, nil
}

func (s Store) key(topic string, partition int) map[string]any {
	return map[string]any{"group_id": s.Group, "topic": topic, "partition": partition}
}
