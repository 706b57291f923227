package inventory

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// A rewind of service A's database: its tables (the orders and outbox A's
// rows, counters, marks, leases, source and epoch) put back as a backup
// taken earlier had them, with plain SQL: CREATE TABLE ... AS SELECT for
// the backup, DELETE and INSERT ... SELECT in one transaction for the
// restore. Services B and the ledger keep their databases.

// serviceATables are service A's tables, outbox A's marks table last: a
// backup copied with A's writers stopped, but its relays running, then
// holds no mark past the rows it copied.
func (c Chain) serviceATables() []string {
	t := c.outboxTable(StageOrders)
	tables := []string{c.OrdersTable(), t, t + "_shards", t + "_source"}
	if c.Backend.Dialect != "sqlite" { // SQLite keeps the marks in _shards
		tables = append(tables, t+"_relay")
	}
	return tables
}

func backupTable(tag, table string) string { return "bak" + tag + "_" + table }

// ABackup is what a backup of service A's database holds.
type ABackup struct {
	Tag         string
	Taken       time.Time
	Orders      int64 // orders in A's table
	Unpublished int64 // rows of outbox A that no relay had marked published
	Epoch       int64 // outbox A's epoch
}

// BackupA copies service A's tables under tag. The copies agree with one
// another only if no order is placed meanwhile: the caller keeps A's
// writers out, as a consistent backup would.
func (c Chain) BackupA(ctx context.Context, db *gorm.DB, tag string) (ABackup, error) {
	b := ABackup{Tag: tag, Taken: time.Now()}
	db = db.WithContext(ctx)
	for _, t := range c.serviceATables() {
		bak := backupTable(tag, t)
		if err := db.Exec(`DROP TABLE IF EXISTS ` + bak).Error; err != nil {
			return b, err
		}
		if err := db.Exec(`CREATE TABLE ` + bak + ` AS SELECT * FROM ` + t).Error; err != nil {
			return b, fmt.Errorf("back up %s: %w", t, err)
		}
	}
	out := c.outboxTable(StageOrders)
	marks := backupTable(tag, out+"_relay")
	if c.Backend.Dialect == "sqlite" {
		marks = backupTable(tag, out+"_shards")
	}
	if err := db.Raw(`SELECT COUNT(*) FROM ` + backupTable(tag, c.OrdersTable())).Scan(&b.Orders).Error; err != nil {
		return b, err
	}
	q := `SELECT COUNT(*) FROM ` + backupTable(tag, out) + ` o JOIN ` + marks + ` m ON m.shard = o.shard WHERE o.seq > m.published_through`
	if err := db.Raw(q).Scan(&b.Unpublished).Error; err != nil {
		return b, err
	}
	err := db.Raw(`SELECT epoch FROM ` + backupTable(tag, out+"_source")).Scan(&b.Epoch).Error
	return b, err
}

// RestoreA puts service A's tables back as BackupA copied them under tag,
// in one transaction: every row deleted, the copy's inserted. It returns
// the orders A's table held before and holds after.
func (c Chain) RestoreA(ctx context.Context, db *gorm.DB, tag string) (before, after int64, err error) {
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw(`SELECT COUNT(*) FROM ` + c.OrdersTable()).Scan(&before).Error; err != nil {
			return err
		}
		for _, t := range c.serviceATables() {
			if err := tx.Exec(`DELETE FROM ` + t).Error; err != nil {
				return fmt.Errorf("restore %s: %w", t, err)
			}
			if err := tx.Exec(`INSERT INTO ` + t + ` SELECT * FROM ` + backupTable(tag, t)).Error; err != nil {
				return fmt.Errorf("restore %s: %w", t, err)
			}
		}
		return tx.Raw(`SELECT COUNT(*) FROM ` + c.OrdersTable()).Scan(&after).Error
	})
	return before, after, err
}

// DropBackupA drops the copies BackupA made under tag, best effort.
func (c Chain) DropBackupA(ctx context.Context, db *gorm.DB, tag string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, t := range c.serviceATables() {
		_ = db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS ` + backupTable(tag, t)).Error
	}
}

// PlacedOrders returns the ids of the orders in service A's table.
func (c Chain) PlacedOrders(ctx context.Context, db *gorm.DB) (map[string]bool, error) {
	var ids []string
	if err := db.WithContext(ctx).Table(c.OrdersTable()).Pluck("order_id", &ids).Error; err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// Epoch returns outbox A's epoch.
func (c Chain) Epoch(ctx context.Context, db *gorm.DB) (int64, error) {
	_, epoch, err := c.Source(ctx, db, StageOrders)
	return epoch, err
}

// RolledBack sorts the orders of a run in which service A's database was
// rewound. An order missing from A's table was placed after a backup and
// taken back by a restore of it: if its OrderCreated was published before
// the restore (published says so, or service B reserved it), it counts
// like any other order, to be reserved once and booked once; if not, the
// rewind took it before anything saw it, and it is not the library's to
// deliver. check returns the orders to check, sent how many of them A's
// table no longer holds, and gone the others by SKU and N: the holes they
// leave in their keys' numbers.
func (c Chain) RolledBack(ctx context.Context, db *gorm.DB, orders []ChainEvent, published func(ChainEvent) bool) (check []ChainEvent, sent int, gone map[string]map[int64]bool, err error) {
	placed, err := c.PlacedOrders(ctx, db)
	if err != nil {
		return nil, 0, nil, err
	}
	reserved, err := c.ReservedCounts(ctx, db)
	if err != nil {
		return nil, 0, nil, err
	}
	gone = map[string]map[int64]bool{}
	for _, o := range orders {
		switch {
		case placed[o.Order]:
			check = append(check, o)
		case reserved[o.Order] > 0 || published(o):
			check = append(check, o)
			sent++
		default:
			if gone[o.SKU] == nil {
				gone[o.SKU] = map[int64]bool{}
			}
			gone[o.SKU][o.N] = true
		}
	}
	return check, sent, gone, nil
}

// UnsentBelowMark returns, of the rows of a publishing stage's outbox whose
// event ids are in ids, those at or below their shard's mark: rows marked
// published, though their events were never sent.
func (c Chain) UnsentBelowMark(ctx context.Context, db *gorm.DB, stage string, ids []string) (rows []OutboxEntry, marks map[int32]int64, err error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	var all []OutboxEntry
	if err := db.WithContext(ctx).Table(c.outboxTable(stage)).Select("event_id, shard, seq").Where("event_id IN ?", ids).Order("shard, seq").Scan(&all).Error; err != nil {
		return nil, nil, err
	}
	store, err := c.Outbox(stage)
	if err != nil {
		return nil, nil, err
	}
	mr, ok := store.(storage.MarkReader)
	if !ok {
		return nil, nil, fmt.Errorf("the %s outbox store reads no marks", c.Backend.Dialect)
	}
	shards := make([]int32, c.Shards(stage))
	for i := range shards {
		shards[i] = int32(i)
	}
	got, err := mr.Marks(ctx, db.WithContext(ctx), shards)
	if err != nil {
		return nil, nil, err
	}
	marks = map[int32]int64{}
	for _, m := range got {
		marks[m.Shard] = m.Seq
	}
	for _, r := range all {
		if r.Seq <= marks[r.Shard] {
			rows = append(rows, r)
		}
	}
	return rows, marks, nil
}
