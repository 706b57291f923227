package inventory

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// Ledger is what the database says was applied.
type Ledger struct {
	Applied      int64 // reservation rows
	Distinct     int64 // orders with at least one reservation
	AppliedTwice int64 // orders with more than one reservation
	Example      string
	Reserved     int64 // stock reserved over all SKUs
	Ordered      int64 // quantity of all orders
	Lost         int64 // orders never reserved
}

// Problems lists what is wrong: an order applied twice or lost, or stock
// that does not add up. Empty means exactly once.
func (l Ledger) Problems() []string {
	var p []string
	if l.AppliedTwice > 0 {
		p = append(p, fmt.Sprintf("%d orders reserved more than once (e.g. %s)", l.AppliedTwice, l.Example))
	}
	if l.Lost > 0 {
		p = append(p, fmt.Sprintf("%d orders never reserved", l.Lost))
	}
	if l.Reserved != l.Ordered {
		p = append(p, fmt.Sprintf("stock reserved %d != %d ordered", l.Reserved, l.Ordered))
	}
	return p
}

// Check reads the ledger of orders.
func (b Backend) Check(ctx context.Context, db *gorm.DB, orders []Order) (Ledger, error) {
	db = db.WithContext(ctx)
	var l Ledger
	for _, o := range orders {
		l.Ordered += o.Qty
	}
	var err error
	if l.Applied, err = b.Reservations(ctx, db); err != nil {
		return l, err
	}
	var twice []struct {
		OrderID string
		N       int64
	}
	if err := db.Table(b.LedgerTable()).Select("order_id, COUNT(*) AS n").Group("order_id").Having("COUNT(*) > 1").Scan(&twice).Error; err != nil {
		return l, err
	}
	l.AppliedTwice = int64(len(twice))
	if len(twice) > 0 {
		l.Example = fmt.Sprintf("%s ×%d", twice[0].OrderID, twice[0].N)
	}
	if err := db.Table(b.LedgerTable()).Distinct("order_id").Count(&l.Distinct).Error; err != nil {
		return l, err
	}
	l.Lost = int64(len(orders)) - l.Distinct
	if err := db.Table(b.StockTable()).Select("COALESCE(SUM(reserved), 0)").Scan(&l.Reserved).Error; err != nil {
		return l, err
	}
	return l, nil
}

// Applications returns how often each order was reserved, by order id: 1 for
// exactly once, more for an order applied twice; orders never applied are
// absent.
func (b Backend) Applications(ctx context.Context, db *gorm.DB) (map[string]int64, error) {
	var rows []struct {
		OrderID string
		N       int64
	}
	if err := db.WithContext(ctx).Table(b.LedgerTable()).Select("order_id, COUNT(*) AS n").Group("order_id").Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.OrderID] = r.N
	}
	return out, nil
}
