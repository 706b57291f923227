// Package inventory is the seeds' scenario shared by the demo and the
// reliability tests: an inventory service reserves stock for each
// OrderCreated event, through the inbox, in consumer processes that can be
// killed at any moment. It owns the business tables, the handler, the
// producer of orders (with duplicates), the consumer process and the ledger
// check that proves every order was reserved exactly once.
package inventory

import (
	"context"
	"fmt"
	"time"

	gormmysql "gorm.io/driver/mysql"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// Backend is where the scenario keeps its inbox and its business tables. The
// parent and every consumer process open the same one.
type Backend struct {
	Dialect string `json:"dialect"` // sqlite, postgres or mysql
	DSN     string `json:"dsn"`     // for sqlite: the database file
	RunID   string `json:"run_id"`  // suffix of every table name of this run
}

func (b Backend) InboxTable() string   { return "inv_inbox_" + b.RunID }
func (b Backend) StockTable() string   { return "inv_stock_" + b.RunID }
func (b Backend) LedgerTable() string  { return "inv_reservations_" + b.RunID }
func (b Backend) OffsetsTable() string { return "inv_offsets_" + b.RunID }

// Open connects to the backend and returns its inbox store.
func (b Backend) Open() (*gorm.DB, storage.InboxStore, error) {
	cfg := &gorm.Config{Logger: logger.Discard}
	var (
		db    *gorm.DB
		store storage.InboxStore
		err   error
	)
	switch b.Dialect {
	case "sqlite":
		db, err = gorm.Open(inboxsqlite.Open(b.DSN), cfg)
		if err == nil {
			store, err = inboxsqlite.New(inboxsqlite.Options{Table: b.InboxTable()})
		}
	case "postgres":
		db, err = gorm.Open(gormpostgres.Open(b.DSN), cfg)
		if err == nil {
			store, err = inboxpg.New(inboxpg.Options{Table: b.InboxTable()})
		}
	case "mysql":
		db, err = gorm.Open(gormmysql.Open(b.DSN), cfg)
		if err == nil {
			store, err = inboxmysql.New(inboxmysql.Options{Table: b.InboxTable()})
		}
	default:
		return nil, nil, fmt.Errorf("unknown database %q: want sqlite, postgres or mysql", b.Dialect)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", b.Dialect, err)
	}
	return db, store, nil
}

// stockRow is one SKU's reservations: the non-idempotent effect (an increment).
type stockRow struct {
	SKU      string `gorm:"primaryKey;size:32"`
	Reserved int64  `gorm:"not null"`
}

// reservationRow is one application of an order's effect. It has no unique
// key on purpose: two rows for one order would show a double reservation.
type reservationRow struct {
	ID      uint64 `gorm:"primaryKey;autoIncrement"`
	OrderID string `gorm:"size:64;not null;index"`
	Qty     int64  `gorm:"not null"`
}

// CreateTables creates the business tables with the given SKUs.
func (b Backend) CreateTables(ctx context.Context, db *gorm.DB, skus []string) error {
	if err := db.WithContext(ctx).Table(b.StockTable()).Migrator().CreateTable(&stockRow{}); err != nil {
		return err
	}
	if err := db.WithContext(ctx).Table(b.LedgerTable()).Migrator().CreateTable(&reservationRow{}); err != nil {
		return err
	}
	rows := make([]stockRow, len(skus))
	for i, s := range skus {
		rows[i] = stockRow{SKU: s}
	}
	return db.WithContext(ctx).Table(b.StockTable()).Create(&rows).Error
}

// DropTables drops every table of this run.
func (b Backend) DropTables(ctx context.Context, db *gorm.DB) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m := db.WithContext(ctx).Migrator()
	for _, t := range []string{b.StockTable(), b.LedgerTable(), b.OffsetsTable(), b.InboxTable()} {
		_ = m.DropTable(t)
	}
}

// Reserve is the inventory handler: record the reservation and increment the
// SKU's reserved stock, in the inbox's transaction.
func (b Backend) Reserve(ctx context.Context, tx *gorm.DB, o Order) error {
	if err := tx.Table(b.LedgerTable()).Create(&reservationRow{OrderID: o.OrderID, Qty: o.Qty}).Error; err != nil {
		return err
	}
	res := tx.Table(b.StockTable()).Where("sku = ?", o.SKU).Update("reserved", gorm.Expr("reserved + ?", o.Qty))
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("unknown sku %q", o.SKU)
	}
	return nil
}

// Reservations counts the reservations applied.
func (b Backend) Reservations(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Table(b.LedgerTable()).Count(&n).Error
	return n, err
}

// StoredOffsets returns the next offsets that group stored for topic's
// partitions in OffsetsTable (consumer.Config.Offsets.Store), by partition.
func (b Backend) StoredOffsets(ctx context.Context, db *gorm.DB, group, topic string) (map[int]int64, error) {
	return StoredOffsets(ctx, db, b.OffsetsTable(), group, topic)
}

// StoredOffsets returns the next offsets that group stored for topic's
// partitions in the offsets table table, by partition.
func StoredOffsets(ctx context.Context, db *gorm.DB, table, group, topic string) (map[int]int64, error) {
	var rows []struct {
		Partition  int
		NextOffset int64
	}
	err := db.WithContext(ctx).Table(table).Select("*").
		Where(map[string]any{"group_id": group, "topic": topic}).Find(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(rows))
	for _, r := range rows {
		out[r.Partition] = r.NextOffset
	}
	return out, nil
}
