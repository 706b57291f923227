package main

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
	"github.com/inboxgo/inbox/inbox"
)

// backend is where the demo keeps its inbox and its business tables. The
// parent and every consumer process open the same one.
type backend struct {
	Dialect string `json:"dialect"` // sqlite, postgres or mysql
	DSN     string `json:"dsn"`     // for sqlite: the database file
	RunID   string `json:"run_id"`  // suffix of every table name of this run
}

func (b backend) inboxTable() string   { return "demo_inbox_" + b.RunID }
func (b backend) stockTable() string   { return "demo_stock_" + b.RunID }
func (b backend) ledgerTable() string  { return "demo_reservations_" + b.RunID }
func (b backend) offsetsTable() string { return "demo_offsets_" + b.RunID }

func (b backend) open() (*gorm.DB, inbox.Store, error) {
	cfg := &gorm.Config{Logger: logger.Discard}
	var (
		db    *gorm.DB
		store inbox.Store
		err   error
	)
	switch b.Dialect {
	case "sqlite":
		db, err = gorm.Open(inboxsqlite.Open(b.DSN), cfg)
		if err == nil {
			store, err = inboxsqlite.New(inboxsqlite.Options{Table: b.inboxTable()})
		}
	case "postgres":
		db, err = gorm.Open(gormpostgres.Open(b.DSN), cfg)
		if err == nil {
			store, err = inboxpg.New(inboxpg.Options{Table: b.inboxTable()})
		}
	case "mysql":
		db, err = gorm.Open(gormmysql.Open(b.DSN), cfg)
		if err == nil {
			store, err = inboxmysql.New(inboxmysql.Options{Table: b.inboxTable()})
		}
	default:
		return nil, nil, fmt.Errorf("unknown -db %q: want sqlite, postgres or mysql", b.Dialect)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", b.Dialect, err)
	}
	return db, store, nil
}

// stock is one SKU's reservations: the non-idempotent effect (an increment).
type stock struct {
	SKU      string `gorm:"primaryKey;size:32"`
	Reserved int64  `gorm:"not null"`
}

// reservation is one application of an order's effect. It has no unique
// key on purpose: two rows for one order would show a double reservation.
type reservation struct {
	ID      uint64 `gorm:"primaryKey;autoIncrement"`
	OrderID string `gorm:"size:64;not null;index"`
	Qty     int64  `gorm:"not null"`
}

func (b backend) createTables(ctx context.Context, db *gorm.DB, skus []string) error {
	if err := db.WithContext(ctx).Table(b.stockTable()).Migrator().CreateTable(&stock{}); err != nil {
		return err
	}
	if err := db.WithContext(ctx).Table(b.ledgerTable()).Migrator().CreateTable(&reservation{}); err != nil {
		return err
	}
	rows := make([]stock, len(skus))
	for i, s := range skus {
		rows[i] = stock{SKU: s}
	}
	return db.WithContext(ctx).Table(b.stockTable()).Create(&rows).Error
}

func (b backend) dropTables(ctx context.Context, db *gorm.DB) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m := db.WithContext(ctx).Migrator()
	for _, t := range []string{b.stockTable(), b.ledgerTable(), b.offsetsTable(), b.inboxTable()} {
		_ = m.DropTable(t)
	}
}

// reserve is the inventory handler: record the reservation and increment the
// SKU's reserved stock, in the inbox's transaction.
func (b backend) reserve(ctx context.Context, tx *gorm.DB, o order) error {
	if err := tx.Table(b.ledgerTable()).Create(&reservation{OrderID: o.OrderID, Qty: o.Qty}).Error; err != nil {
		return err
	}
	res := tx.Table(b.stockTable()).Where("sku = ?", o.SKU).Update("reserved", gorm.Expr("reserved + ?", o.Qty))
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("unknown sku %q", o.SKU)
	}
	return nil
}

func (b backend) reservations(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Table(b.ledgerTable()).Count(&n).Error
	return n, err
}
