package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inboxgo/inbox/hooks"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DefaultOffsetsTable is the table of stored offsets when
// Config.OffsetsTable is empty.
const DefaultOffsetsTable = "inbox_offsets"

// offsetRow is one row of the offsets table: the next offset to read of one
// partition for one group, written in the transaction of the effect that
// made it so.
type offsetRow struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
}

type offsetStore struct {
	table string
	group string
}

// migrate creates the offsets table if it does not exist.
//
// On MySQL/MariaDB the table is created as InnoDB whatever the server's
// default engine: a stored offset must roll back with the effect it
// belongs to, which MyISAM ignores (its 1000-byte key limit also refused
// the table: error 1071). An existing table there on an engine without
// transactions makes migrate fail.
func (s offsetStore) migrate(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	mysql := db.Name() == "mysql"
	if mysql {
		// Before AutoMigrate, whose ALTERs of a MyISAM table fail with
		// errors that do not name the engine.
		if err := s.checkTransactional(db); err != nil {
			return err
		}
		db = db.Set("gorm:table_options", "ENGINE=InnoDB")
	}
	if err := db.Table(s.table).AutoMigrate(&offsetRow{}); err != nil {
		return fmt.Errorf("consumer: migrate %s: %w", s.table, err)
	}
	if mysql {
		return s.checkTransactional(db)
	}
	return nil
}

// checkTransactional fails if the offsets table exists (in the current
// MySQL/MariaDB database) on an engine without transactions.
func (s offsetStore) checkTransactional(db *gorm.DB) error {
	var rows []struct {
		Engine       sql.NullString
		Transactions sql.NullString
	}
	err := db.Raw(`SELECT t.ENGINE AS engine, e.TRANSACTIONS AS transactions
		FROM information_schema.TABLES t LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE
		WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = ?`, s.table).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("consumer: read the engine of the offsets table %s: %w", s.table, err)
	}
	if len(rows) == 0 {
		return nil // not created yet
	}
	if r := rows[0]; !strings.EqualFold(r.Transactions.String, "YES") {
		return fmt.Errorf("consumer: the offsets table %s uses engine %q, which has no transactions: a stored offset would survive the rollback of its effect, and the message would be skipped; convert it (ALTER TABLE %s ENGINE=InnoDB) or drop it and call Migrate again",
			s.table, r.Engine.String, s.table)
	}
	return nil
}

// save records next as the partition's next offset inside tx. Moving an
// offset backwards is harmless (the inbox absorbs the redelivery); the
// consumer never writes one past a message that is not finished.
func (s offsetStore) save(ctx context.Context, tx *gorm.DB, topic string, partition int, next int64) error {
	row := offsetRow{GroupID: s.group, Topic: topic, Partition: int32(partition), NextOffset: next}
	err := tx.WithContext(ctx).Table(s.table).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "group_id"}, {Name: "topic"}, {Name: "partition"}},
		DoUpdates: clause.AssignmentColumns([]string{"next_offset"}),
	}).Create(&row).Error
	if err != nil {
		return fmt.Errorf("consumer: store offset %d of %s/%d: %w", next, topic, partition, err)
	}
	return nil
}

// errPositionMoved reports that the partition's stored offset is no longer
// at or past the last one this worker committed: the database lost commits
// (a failover to a replica that lacked them) or the row was reset.
var errPositionMoved = errors.New("consumer: the stored offset moved back since this worker committed it")

// advance is save for a worker that has committed floor as the stored
// offset (floor < 0: nothing yet): it writes next only if the stored
// offset is still at least floor, and returns errPositionMoved otherwise,
// so that the transaction rolls back instead of committing effects on top
// of a database that lost the worker's earlier commits. The check rides on
// the UPDATE; only an UPDATE that changes no row costs a second statement.
func (s offsetStore) advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor, next int64) error {
	if floor < 0 {
		return s.save(ctx, tx, topic, partition, next)
	}
	key := map[string]any{"group_id": s.group, "topic": topic, "partition": partition}
	res := tx.WithContext(ctx).Table(s.table).Where(key).Where("next_offset >= ?", floor).
		Update("next_offset", next)
	if res.Error != nil {
		return fmt.Errorf("consumer: store offset %d of %s/%d: %w", next, topic, partition, res.Error)
	}
	if res.RowsAffected > 0 {
		return nil
	}
	// MySQL/MariaDB report 0 rows for an UPDATE that leaves the value as it
	// was: read it to tell that apart from a row that moved back.
	cur, err := s.load(ctx, tx, topic, partition)
	if err != nil {
		return err
	}
	if cur >= floor {
		return nil
	}
	return fmt.Errorf("%w: %s/%d is stored at %d, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
		errPositionMoved, topic, partition, cur, floor)
}

// load returns the stored next offset of the partition, or -1 if none.
func (s offsetStore) load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error) {
	var row offsetRow
	err := db.WithContext(ctx).Table(s.table).
		Where(map[string]any{"group_id": s.group, "topic": topic, "partition": partition}).
		Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("consumer: load stored offset of %s/%d: %w", topic, partition, err)
	}
	return row.NextOffset, nil
}

// defaultPosCheckInterval is how often an idle partition with StoreOffsets
// checks that the database still holds the offset it stored: a failover
// that lost the last commits of a partition that then receives no message
// would otherwise leave their effects unapplied until the next rebalance.
const defaultPosCheckInterval = 5 * time.Second

// posCheckInterval is how often an idle partition runs checkPosition.
func (w *worker) posCheckInterval() time.Duration {
	if d := w.c.cfg.posCheckInterval; d > 0 {
		return d
	}
	return defaultPosCheckInterval
}

// checkPosition sets w.lost if the stored offset is behind the one this
// worker committed. A failed read is only logged at Debug: the next idle
// period (or the next write, which checks as well) tries again.
func (w *worker) checkPosition(ctx, dbCtx context.Context) {
	w.lastPosCheck = time.Now()
	if w.floor < 0 || w.tracker.inFlight() > 0 {
		return
	}
	stored, err := w.c.offsets.load(dbCtx, w.c.db(), w.topic, w.partition)
	if err != nil {
		w.log.Debug("cannot read the stored offset", "error", err)
		return
	}
	if stored < w.floor {
		w.lost = fmt.Errorf("%w: %s/%d is stored at %d, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
			errPositionMoved, w.topic, w.partition, stored, w.floor)
	}
}

// reposition resumes the partition from the database's position after
// w.lost: the stored offset went back behind what this worker committed,
// so the effects of the messages in between are gone from the database
// (a failover to a replica that lacked the last commits), and they must be
// applied again. It reads the position as on assignment, checks it against
// the log, discards what the worker holds and moves the reader there. The
// group's offset is not moved back: the database's position wins on the
// next assignment anyway. It returns halt, as process does.
func (w *worker) reposition(ctx, dbCtx context.Context, reader partitionReader) (halt bool) {
	cause := w.lost
	w.lost = nil
	prev, _ := w.tracker.committable()
	start, from, hasStored, ok := w.position(ctx, dbCtx)
	if !ok {
		return false
	}
	start, commitStart, beyondEnd, ok := w.checkLog(ctx, start, from)
	if !ok {
		return false
	}
	if beyondEnd != nil {
		w.stopPartition(beyondEnd, "PARTITION STOPPED: the database's position is past the log end; nothing is consumed until the offsets are reset")
		return true
	}
	if (!hasStored || commitStart) && !w.storeNext(ctx, dbCtx, -1, start) {
		return false
	}
	w.floor = start
	w.log.Warn("the database's stored offset went back behind what this worker committed (a failover to a replica that lacked the last commits?); resuming from it: the messages in between are applied again",
		"stored", start, "worker_next", prev, "redelivered", max(prev-start, 0), "cause", cause)
	w.c.emit(hooks.Event{Kind: hooks.Repositioned, Topic: w.topic, Partition: w.partition, Offset: start, Err: cause})
	w.tracker = newOffsetTracker(start)
	if err := reader.seek(start); err != nil {
		w.log.Error("cannot position the partition reader", "offset", start, "error", err)
		return true
	}
	return false
}
