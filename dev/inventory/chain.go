package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// Chain is the two-service scenario of the outbox, on one
// database: service A takes orders and enqueues OrderCreated in the order's
// transaction (outbox A); relay A publishes them; service B, the inventory,
// consumes OrderCreated through its inbox, reserves stock and enqueues
// StockReserved in the same transaction (outbox B); relay B publishes those;
// a ledger service consumes StockReserved through its inbox and books them.
//
// Every effect is an increment plus one row per application (no unique key,
// so an effect applied twice shows as two rows), and each stage checks,
// inside its transaction, that the per-key sequence number of each event is
// the one after the last it applied: a reordering is recorded in a table,
// where it survives the process that saw it being killed.
//
// The two consuming stages deduplicate in the two ways the consumer offers,
// so that every run exercises both:
//   - B trusts outbox A's source (consumer.Config.Sequenced.Sources): it
//     keeps one watermark row per stream instead of an inbox row per event.
//     Outbox A is aligned to the orders topic (outbox.Config.AlignedTopic:
//     its shards are the topic's partitions), so each stream is contiguous
//     and a message lost between A's outbox and B stops B's partition
//     (consumer.ReasonSequenceGap) instead of going unnoticed.
//   - The ledger claims an inbox row per event, though StockReserved carries
//     sequence headers too: outbox B keeps the default shards (more than
//     the partitions, holding keys of several partitions each), the layout
//     most outboxes have, and the inbox-row path stays under the same
//     chaos.
type Chain struct {
	Backend Backend // Dialect, DSN and RunID (the suffix of every name)
	// Partitions is the partition count of both topics, and so the shard
	// count of the aligned outbox A.
	Partitions int `json:"partitions"`
}

// Stages of the chain, as named in tables, processes and reports.
const (
	StageOrders  = "orders"  // service A: outbox A, relay A, topic of OrderCreated
	StageReserve = "reserve" // service B: inbox B, outbox B, relay B, topic of StockReserved
	StageLedger  = "ledger"  // the ledger: inbox C
)

// ChainEvent is the payload of OrderCreated and of StockReserved: N is the
// order's place among its SKU's orders, from 1, in the order service A
// committed them.
type ChainEvent struct {
	Order string `json:"order"`
	SKU   string `json:"sku"`
	N     int64  `json:"n"`
}

// Table and topic names of the run.
func (c Chain) OrdersTable() string   { return "chain_orders_" + c.Backend.RunID }
func (c Chain) StockTable() string    { return "chain_stock_" + c.Backend.RunID }
func (c Chain) ReservedTable() string { return "chain_reserved_" + c.Backend.RunID }
func (c Chain) LedgerTable() string   { return "chain_ledger_" + c.Backend.RunID }
func (c Chain) BookedTable() string   { return "chain_booked_" + c.Backend.RunID }
func (c Chain) ReorderTable() string  { return "chain_reorders_" + c.Backend.RunID }
func (c Chain) OrdersTopic() string   { return "chain-orders-" + c.Backend.RunID }
func (c Chain) StockTopic() string    { return "chain-stock-" + c.Backend.RunID }

// OffsetsTable is the stored offsets' table of a consuming stage's
// consumers (with StoreOffsets).
func (c Chain) OffsetsTable(stage string) string {
	return "chain_offsets_" + stage + "_" + c.Backend.RunID
}

// inboxTable is the inbox of the stage that consumes (reserve or ledger);
// outboxTable the outbox of the stage that publishes (orders or reserve).
func (c Chain) inboxTable(stage string) string  { return "chain_in_" + stage + "_" + c.Backend.RunID }
func (c Chain) outboxTable(stage string) string { return "chain_out_" + stage + "_" + c.Backend.RunID }

// ChainShards is outbox B's shard count: small, so that several relays
// really share (and take over) shards. Outbox A has one per partition.
const ChainShards = 8

// Shards is the shard count of a publishing stage's outbox.
func (c Chain) Shards(stage string) int {
	if stage == StageOrders {
		return c.Partitions
	}
	return ChainShards
}

// Sequenced reports whether a consuming stage deduplicates the messages of
// the outbox before it by their sequence (StageReserve), rather than by
// inbox rows (StageLedger).
func Sequenced(stage string) bool { return stage == StageReserve }

// Open connects to the chain's database.
func (c Chain) Open() (*gorm.DB, error) {
	db, _, err := c.Backend.Open()
	return db, err
}

// Inbox returns the inbox Store of a consuming stage (StageReserve or
// StageLedger).
func (c Chain) Inbox(stage string) (storage.InboxStore, error) {
	table := c.inboxTable(stage)
	switch c.Backend.Dialect {
	case "sqlite":
		return inboxsqlite.New(inboxsqlite.Options{Table: table})
	case "postgres":
		return inboxpg.New(inboxpg.Options{Table: table})
	case "mysql":
		return inboxmysql.New(inboxmysql.Options{Table: table})
	}
	return nil, fmt.Errorf("unknown database %q", c.Backend.Dialect)
}

// Outbox returns the outbox Store of a publishing stage (StageOrders or
// StageReserve).
func (c Chain) Outbox(stage string) (storage.OutboxStore, error) {
	table, shards := c.outboxTable(stage), c.Shards(stage)
	if shards < 1 {
		return nil, fmt.Errorf("the %s outbox needs Chain.Partitions", stage)
	}
	switch c.Backend.Dialect {
	case "sqlite":
		return inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: table, Shards: shards})
	case "postgres":
		return inboxpg.NewOutbox(inboxpg.OutboxOptions{Table: table, Shards: shards})
	case "mysql":
		return inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Shards: shards})
	}
	return nil, fmt.Errorf("unknown database %q", c.Backend.Dialect)
}

// watermarkTable is the watermark table of a consuming stage's inbox
// (made by consumer.Consumer.Migrate when the stage is Sequenced).
func (c Chain) watermarkTable(stage string) string {
	suffix := inboxsqlite.WatermarkSuffix
	switch c.Backend.Dialect {
	case "postgres":
		suffix = inboxpg.WatermarkSuffix
	case "mysql":
		suffix = inboxmysql.WatermarkSuffix
	}
	return c.inboxTable(stage) + suffix
}

// Source returns the source id and epoch of a publishing stage's outbox,
// the values its relays stamp (storage.Sequenced).
func (c Chain) Source(ctx context.Context, db *gorm.DB, stage string) (string, int64, error) {
	store, err := c.Outbox(stage)
	if err != nil {
		return "", 0, err
	}
	sq, ok := store.(storage.Sequenced)
	if !ok {
		return "", 0, fmt.Errorf("the %s outbox store stamps no sequence", c.Backend.Dialect)
	}
	return sq.Source(ctx, db.WithContext(ctx))
}

// chainOrderRow is an order of service A.
type chainOrderRow struct {
	OrderID string `gorm:"primaryKey;size:64"`
	SKU     string `gorm:"size:32;not null"`
	N       int64  `gorm:"not null"`
}

// chainCounterRow is a stage's per-SKU total and the last sequence number
// it applied.
type chainCounterRow struct {
	SKU     string `gorm:"primaryKey;size:32"`
	Applied int64  `gorm:"not null"`
	LastN   int64  `gorm:"not null"`
}

// chainEffectRow is one application of an event; no unique key on purpose.
type chainEffectRow struct {
	ID      uint64 `gorm:"primaryKey;autoIncrement"`
	OrderID string `gorm:"size:64;not null;index"`
	SKU     string `gorm:"size:32;not null"`
	N       int64  `gorm:"not null"`
}

// chainReorderRow is an event a stage applied out of its key's order.
type chainReorderRow struct {
	ID    uint64 `gorm:"primaryKey;autoIncrement"`
	Stage string `gorm:"size:16;not null"`
	SKU   string `gorm:"size:32;not null"`
	Got   int64  `gorm:"not null"`
	Want  int64  `gorm:"not null"`
}

// Setup creates the inboxes, the outboxes and the business tables, with
// counters for skus.
func (c Chain) Setup(ctx context.Context, db *gorm.DB, skus []string, log *slog.Logger) error {
	for _, stage := range []string{StageReserve, StageLedger} {
		store, err := c.Inbox(stage)
		if err != nil {
			return err
		}
		ib, err := inbox.New(db, store, inbox.Config{Logger: log})
		if err != nil {
			return err
		}
		if err := ib.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate inbox %s: %w", stage, err)
		}
		if _, err := ib.Maintain(ctx); err != nil {
			return fmt.Errorf("maintain inbox %s: %w", stage, err)
		}
	}
	for _, stage := range []string{StageOrders, StageReserve} {
		ob, err := c.NewOutbox(db, stage, log)
		if err != nil {
			return err
		}
		if err := ob.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate outbox %s: %w", stage, err)
		}
		if _, err := ob.Maintain(ctx); err != nil {
			return fmt.Errorf("maintain outbox %s: %w", stage, err)
		}
	}
	m := db.WithContext(ctx)
	if err := m.Table(c.OrdersTable()).Migrator().CreateTable(&chainOrderRow{}); err != nil {
		return err
	}
	for _, t := range []string{c.StockTable(), c.LedgerTable()} {
		if err := m.Table(t).Migrator().CreateTable(&chainCounterRow{}); err != nil {
			return err
		}
		rows := make([]chainCounterRow, len(skus))
		for i, s := range skus {
			rows[i] = chainCounterRow{SKU: s}
		}
		if err := m.Table(t).Create(&rows).Error; err != nil {
			return err
		}
	}
	for _, t := range []string{c.ReservedTable(), c.BookedTable()} {
		if err := m.Table(t).Migrator().CreateTable(&chainEffectRow{}); err != nil {
			return err
		}
	}
	return m.Table(c.ReorderTable()).Migrator().CreateTable(&chainReorderRow{})
}

// Drop removes every table of the run, best effort.
func (c Chain) Drop(ctx context.Context, db *gorm.DB) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	tables := []string{c.OrdersTable(), c.StockTable(), c.ReservedTable(), c.LedgerTable(), c.BookedTable(), c.ReorderTable(),
		c.inboxTable(StageReserve), c.inboxTable(StageLedger), c.OffsetsTable(StageReserve), c.OffsetsTable(StageLedger),
		c.watermarkTable(StageReserve), c.watermarkTable(StageLedger)}
	for _, stage := range []string{StageOrders, StageReserve} {
		t := c.outboxTable(stage)
		tables = append(tables, t, t+"_shards", t+"_relay", t+"_source")
	}
	for _, t := range tables {
		q := `DROP TABLE IF EXISTS "` + t + `" CASCADE` // PostgreSQL: the partitions go with it
		switch c.Backend.Dialect {
		case "mysql":
			q = "DROP TABLE IF EXISTS `" + t + "`"
		case "sqlite":
			q = `DROP TABLE IF EXISTS "` + t + `"`
		}
		_ = db.WithContext(ctx).Exec(q).Error
	}
}

// NewOutbox returns the Outbox of a publishing stage.
func (c Chain) NewOutbox(db *gorm.DB, stage string, log *slog.Logger) (*outbox.Outbox, error) {
	store, err := c.Outbox(stage)
	if err != nil {
		return nil, err
	}
	cfg := outbox.Config{Logger: log}
	if stage == StageOrders {
		cfg.AlignedTopic = c.OrdersTopic()
	}
	return outbox.New(db, store, cfg)
}

// PlaceOrder is service A: it stores ev's order and enqueues OrderCreated
// in one transaction, retried until it commits or ctx ends. A retry after a
// commit whose outcome was lost (the connection died at COMMIT) finds the
// order and stops: the order is placed once.
func (c Chain) PlaceOrder(ctx context.Context, db *gorm.DB, ob *outbox.Outbox, ev ChainEvent) error {
	value, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	wait := 20 * time.Millisecond
	for {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var n int64
			if err := tx.Table(c.OrdersTable()).Where("order_id = ?", ev.Order).Count(&n).Error; err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if err := tx.Table(c.OrdersTable()).Create(&chainOrderRow{OrderID: ev.Order, SKU: ev.SKU, N: ev.N}).Error; err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: c.OrdersTopic(), Key: []byte(ev.SKU), Value: value, ID: "order-created-" + ev.Order})
		})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("place order %s: %w (last error: %v)", ev.Order, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// ReserveHandler is service B's handler: it reserves the order's stock and
// enqueues StockReserved in the inbox's transaction.
func (c Chain) ReserveHandler(ob *outbox.Outbox) consumer.Handler {
	return func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
		ev, err := c.apply(tx, StageReserve, c.StockTable(), c.ReservedTable(), m)
		if err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: c.StockTopic(), Key: []byte(ev.SKU), Value: m.Value, ID: "stock-reserved-" + ev.Order})
	}
}

// LedgerHandler is the ledger's handler: it books a StockReserved.
func (c Chain) LedgerHandler() consumer.Handler {
	return func(_ context.Context, tx *gorm.DB, m consumer.Message) error {
		_, err := c.apply(tx, StageLedger, c.LedgerTable(), c.BookedTable(), m)
		return err
	}
}

// apply checks ev's sequence number against its key's last one, records a
// reordering, increments the counter and writes the effect row.
func (c Chain) apply(tx *gorm.DB, stage, counters, effects string, m consumer.Message) (ChainEvent, error) {
	var ev ChainEvent
	if err := json.Unmarshal(m.Value, &ev); err != nil {
		return ev, fmt.Errorf("event %s: %w", m.EventID, err)
	}
	lock := " FOR UPDATE" // the counter row is the key's lock; SQLite has one writer
	if c.Backend.Dialect == "sqlite" {
		lock = ""
	}
	var last []int64
	if err := tx.Raw("SELECT last_n FROM "+counters+" WHERE sku = ?"+lock, ev.SKU).Scan(&last).Error; err != nil {
		return ev, err
	}
	if len(last) != 1 {
		return ev, fmt.Errorf("unknown sku %q", ev.SKU)
	}
	if ev.N != last[0]+1 {
		if err := tx.Table(c.ReorderTable()).Create(&chainReorderRow{Stage: stage, SKU: ev.SKU, Got: ev.N, Want: last[0] + 1}).Error; err != nil {
			return ev, err
		}
	}
	res := tx.Table(counters).Where("sku = ?", ev.SKU).Updates(map[string]any{"applied": gorm.Expr("applied + 1"), "last_n": ev.N})
	if res.Error != nil {
		return ev, res.Error
	}
	return ev, tx.Table(effects).Create(&chainEffectRow{OrderID: ev.Order, SKU: ev.SKU, N: ev.N}).Error
}

// ChainOrders makes n orders over skus, round robin, numbered per SKU.
func ChainOrders(runID string, n int, skus []string) []ChainEvent {
	out := make([]ChainEvent, n)
	next := map[string]int64{}
	for i := range out {
		sku := skus[i%len(skus)]
		next[sku]++
		out[i] = ChainEvent{Order: runID + "-" + strconv.Itoa(i+1), SKU: sku, N: next[sku]}
	}
	return out
}

// OutboxEntry is a row of an outbox: its event and its place there, which
// the relay stamps on the event's messages.
type OutboxEntry struct {
	EventID string
	Shard   int32
	Seq     int64
}

// OutboxEntries returns the rows of a publishing stage's outbox, published
// or not, in shard and sequence order.
func (c Chain) OutboxEntries(ctx context.Context, db *gorm.DB, stage string) ([]OutboxEntry, error) {
	var rows []OutboxEntry
	err := db.WithContext(ctx).Table(c.outboxTable(stage)).Select("event_id, shard, seq").Order("shard, seq").Scan(&rows).Error
	return rows, err
}

// ReservedCounts returns how many times service B reserved each order, by
// order id (orders never reserved are absent).
func (c Chain) ReservedCounts(ctx context.Context, db *gorm.DB) (map[string]int64, error) {
	m, _, err := effectCounts(db.WithContext(ctx), c.ReservedTable())
	return m, err
}

// Reorders counts the events a stage applied out of their key's order.
func (c Chain) Reorders(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Table(c.ReorderTable()).Count(&n).Error
	return n, err
}

// effectCounts counts the effect rows of table per order, and in all.
func effectCounts(db *gorm.DB, table string) (map[string]int64, int64, error) {
	var rows []struct {
		OrderID string
		N       int64
	}
	if err := db.Table(table).Select("order_id, COUNT(*) AS n").Group("order_id").Scan(&rows).Error; err != nil {
		return nil, 0, err
	}
	m := make(map[string]int64, len(rows))
	var total int64
	for _, r := range rows {
		m[r.OrderID] = r.N
		total += r.N
	}
	return m, total, nil
}

// Booked counts the effects the ledger applied.
func (c Chain) Booked(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Table(c.BookedTable()).Count(&n).Error
	return n, err
}

// Reserved counts the reservations service B applied.
func (c Chain) Reserved(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Table(c.ReservedTable()).Count(&n).Error
	return n, err
}

// ChainLedger is what the chain's tables say.
type ChainLedger struct {
	Orders                    int   // orders placed
	Placed                    int64 // rows in service A's orders table
	Reserved, Booked          int64 // effect rows of B and of the ledger
	ReserveLost, ReserveTwice int64 // orders B never reserved / reserved more than once
	BookLost, BookTwice       int64 // orders the ledger never booked / booked more than once
	Reordered                 int64 // events a stage applied out of their key's order
	CountersOff               int64 // SKUs whose counter disagrees with the effect rows
	// After rewinds of service A's database (CheckRewound): orders among
	// Orders that a restore took out of A's table after their OrderCreated
	// was published, and events a stage applied past a hole in their key's
	// numbers left by orders a restore took back before anything saw them
	// (not counted in Reordered).
	RolledBackSent, RewoundHoles int64
	// The dedup state each consuming stage left: B's streams in its
	// watermark table and no inbox row (Sequenced), the ledger's inbox
	// rows, one per event it booked.
	ReserveInboxRows, LedgerInboxRows int64
	// Rows of a Sequenced stage's watermark table: one per stream (source,
	// epoch, partition).
	ReserveWatermarks, LedgerWatermarks int64
	// rowsOff are the dedup states that disagree with the path the stage
	// should have taken.
	rowsOff []string
}

// Problems lists what is wrong.
func (l ChainLedger) Problems() []string {
	var p []string
	add := func(n int64, what string) {
		if n != 0 {
			p = append(p, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(int64(l.Orders)-l.RolledBackSent-l.Placed, "orders not placed by service A")
	add(l.ReserveLost, "orders never reserved")
	add(l.ReserveTwice, "reservations applied twice")
	add(l.BookLost, "StockReserved never booked in the ledger")
	add(l.BookTwice, "StockReserved booked twice")
	add(l.Reordered, "events applied out of their key's order")
	add(l.CountersOff, "counters that disagree with their effect rows")
	return append(p, l.rowsOff...)
}

// Check reads the chain's tables and compares them with orders.
func (c Chain) Check(ctx context.Context, db *gorm.DB, orders []ChainEvent) (ChainLedger, error) {
	l := ChainLedger{Orders: len(orders)}
	db = db.WithContext(ctx)
	if err := db.Table(c.OrdersTable()).Count(&l.Placed).Error; err != nil {
		return l, err
	}
	reserved, total, err := effectCounts(db, c.ReservedTable())
	if err != nil {
		return l, err
	}
	l.Reserved = total
	booked, total, err := effectCounts(db, c.BookedTable())
	if err != nil {
		return l, err
	}
	l.Booked = total
	for _, o := range orders {
		switch n := reserved[o.Order]; {
		case n == 0:
			l.ReserveLost++
		case n > 1:
			l.ReserveTwice += n - 1
		}
		switch n := booked[o.Order]; {
		case n == 0:
			l.BookLost++
		case n > 1:
			l.BookTwice += n - 1
		}
	}
	if int64(len(reserved)) > int64(len(orders))-l.ReserveLost || int64(len(booked)) > int64(len(orders))-l.BookLost {
		return l, errors.New("effect rows for orders that were never placed")
	}
	if err := db.Table(c.ReorderTable()).Count(&l.Reordered).Error; err != nil {
		return l, err
	}
	if err := c.checkDedup(db, &l, len(reserved), len(booked)); err != nil {
		return l, err
	}
	for _, pair := range [][2]string{{c.StockTable(), c.ReservedTable()}, {c.LedgerTable(), c.BookedTable()}} {
		var off int64
		q := "SELECT COUNT(*) FROM " + pair[0] + " s WHERE s.applied <> (SELECT COUNT(*) FROM " + pair[1] + " e WHERE e.sku = s.sku)"
		if err := db.Raw(q).Scan(&off).Error; err != nil {
			return l, err
		}
		l.CountersOff += off
	}
	return l, nil
}

// CheckRewound is Check for a run in which service A's database was
// rewound, with RolledBack's verdict: orders are the orders to check, sent
// how many of them a restore took out of A's table, and gone the holes in
// the keys' numbers that the orders a restore took back before anything
// saw them left: an event applied right after such a hole is not counted
// as reordered.
func (c Chain) CheckRewound(ctx context.Context, db *gorm.DB, orders []ChainEvent, sent int, gone map[string]map[int64]bool) (ChainLedger, error) {
	l, err := c.Check(ctx, db, orders)
	if err != nil {
		return l, err
	}
	l.RolledBackSent = int64(sent)
	var rows []chainReorderRow
	if err := db.WithContext(ctx).Table(c.ReorderTable()).Find(&rows).Error; err != nil {
		return l, err
	}
	l.Reordered = 0
	for _, r := range rows {
		hole := r.Got > r.Want
		for n := r.Want; hole && n < r.Got; n++ {
			hole = gone[r.SKU][n]
		}
		if hole {
			l.RewoundHoles++
		} else {
			l.Reordered++
		}
	}
	return l, nil
}

// checkDedup reads what each consuming stage kept to deduplicate, and
// records in l.rowsOff where it is not what its path keeps: a Sequenced
// stage keeps watermark rows and never an inbox row (Sequenced.RowsUntil is
// not set), the other stage an inbox row per distinct event it applied
// (the row commits with the effect).
func (c Chain) checkDedup(db *gorm.DB, l *ChainLedger, distinctReserved, distinctBooked int) error {
	for _, st := range []struct {
		stage       string
		rows, marks *int64
		distinct    int
	}{
		{StageReserve, &l.ReserveInboxRows, &l.ReserveWatermarks, distinctReserved},
		{StageLedger, &l.LedgerInboxRows, &l.LedgerWatermarks, distinctBooked},
	} {
		if err := db.Table(c.inboxTable(st.stage)).Count(st.rows).Error; err != nil {
			return err
		}
		if !Sequenced(st.stage) {
			if *st.rows != int64(st.distinct) {
				l.rowsOff = append(l.rowsOff, fmt.Sprintf("%d inbox rows in the %s inbox for %d events applied", *st.rows, st.stage, st.distinct))
			}
			continue
		}
		if *st.rows != 0 {
			l.rowsOff = append(l.rowsOff, fmt.Sprintf("%d inbox rows in the %s inbox: its messages went through inbox rows, not its watermarks", *st.rows, st.stage))
		}
		if err := db.Table(c.watermarkTable(st.stage)).Count(st.marks).Error; err != nil {
			return err
		}
		if *st.marks == 0 && st.distinct > 0 {
			l.rowsOff = append(l.rowsOff, fmt.Sprintf("%d events applied by %s, and no watermark row", st.distinct, st.stage))
		}
	}
	return nil
}

// PathProblems checks that a consuming stage's processes logged their
// outcomes (o) on its dedup path only (Sequenced), and some.
func (o Outcomes) PathProblems(stage string) []string {
	marks := o.WatermarkProcessed + o.WatermarkDuplicates
	rows := o.Processed + o.Duplicates - marks
	switch {
	case Sequenced(stage) && (rows > 0 || marks == 0):
		return []string{fmt.Sprintf("%s: %d outcomes by inbox row and %d by watermark; it trusts the source, so every one must be by watermark", stage, rows, marks)}
	case !Sequenced(stage) && (marks > 0 || rows == 0):
		return []string{fmt.Sprintf("%s: %d outcomes by watermark and %d by inbox row; it trusts no source, so every one must be by inbox row", stage, marks, rows)}
	}
	return nil
}

// Unpublished counts the rows of a publishing stage's outbox that no relay
// has marked published yet.
func (c Chain) Unpublished(ctx context.Context, db *gorm.DB, stage string) (int64, error) {
	store, err := c.Outbox(stage)
	if err != nil {
		return 0, err
	}
	sr, ok := store.(storage.StatsReporter)
	if !ok {
		return 0, fmt.Errorf("the %s outbox store reports no stats", c.Backend.Dialect)
	}
	days, err := sr.Stats(ctx, db)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, d := range days {
		n += d.Unpublished
	}
	return n, nil
}
