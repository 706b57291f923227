package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// chainDB is one database for the chain test: its connection and the stores
// of the inboxes and outboxes, on tables named with suffix.
type chainDB struct {
	db        *gorm.DB
	newInbox  func(table string) (storage.InboxStore, error)
	newOutbox func(table string) (storage.OutboxStore, error)
	drop      func(tables ...string)
	// qualify names a table the stores made (in their schema, if any).
	qualify func(table string) string
}

func postgresChain(t *testing.T) chainDB {
	db, err := gorm.Open(gormpg.Open(testservers.PostgresDSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	// The inboxes and outboxes live in a schema of their own; the business
	// tables in the default one, dropped by name.
	schema := "chain_" + conformance.RandomSuffix()
	var made []string
	var mu sync.Mutex
	t.Cleanup(func() {
		db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
		for _, table := range made {
			db.Exec(`DROP TABLE IF EXISTS ` + table)
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return chainDB{
		db: db,
		newInbox: func(table string) (storage.InboxStore, error) {
			return inboxpg.New(inboxpg.Options{Schema: schema, Table: table})
		},
		newOutbox: func(table string) (storage.OutboxStore, error) {
			return inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Table: table, Shards: 16})
		},
		drop: func(tables ...string) {
			mu.Lock()
			defer mu.Unlock()
			made = append(made, tables...)
		},
		qualify: func(table string) string { return schema + "." + table },
	}
}

func mysqlChain(t *testing.T) chainDB {
	d, err := inboxmysql.Open(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	var made []string
	var mu sync.Mutex
	t.Cleanup(func() {
		for _, table := range made {
			db.Exec("DROP TABLE IF EXISTS `" + table + "`")
		}
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	remember := func(tables ...string) {
		mu.Lock()
		defer mu.Unlock()
		made = append(made, tables...)
	}
	return chainDB{
		db: db,
		newInbox: func(table string) (storage.InboxStore, error) {
			remember(table)
			return inboxmysql.New(inboxmysql.Options{Table: table})
		},
		newOutbox: func(table string) (storage.OutboxStore, error) {
			remember(table, table+"_shards", table+"_relay", table+"_source")
			return inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Shards: 16})
		},
		drop:    remember,
		qualify: func(table string) string { return table },
	}
}

// TestChain is the chain on each database, in one process against a
// real broker: service A takes orders and enqueues OrderCreated in the same
// transaction; relays publish them (one is killed without releasing its
// leases, another replaces it); service B consumes OrderCreated through its
// inbox, reserves stock and enqueues StockReserved in the same transaction
// (its consumer is replaced halfway); a relay publishes those; a ledger
// consumes them through its inbox. Every order must be reserved exactly
// once, every StockReserved applied exactly once, in order per key.
func TestChain(t *testing.T) {
	for _, tc := range chainBackends {
		t.Run(tc.name, func(t *testing.T) { runChain(t, tc.open(t)) })
	}
}

// chainBackends are the databases TestChain runs on; SQLite adds itself
// where cgo is available.
var chainBackends = []struct {
	name string
	open func(t *testing.T) chainDB
}{{"postgres", postgresChain}, {"mysql", mysqlChain}}

func runChain(t *testing.T, c chainDB) {
	brokers := testservers.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sfx := conformance.RandomSuffix()
	const skus, perSKU, writers, partitions = 12, 20, 4, 4
	total := skus * perSKU
	orders, stock, ledger := "orders_"+sfx, "stock_"+sfx, "ledger_"+sfx
	c.drop(orders, stock, ledger)
	for _, q := range []string{
		`CREATE TABLE ` + orders + ` (id VARCHAR(64) PRIMARY KEY, sku VARCHAR(64) NOT NULL)`,
		`CREATE TABLE ` + stock + ` (sku VARCHAR(64) PRIMARY KEY, reserved INT NOT NULL, last_n INT NOT NULL)`,
		`CREATE TABLE ` + ledger + ` (sku VARCHAR(64) PRIMARY KEY, total INT NOT NULL, last_n INT NOT NULL)`,
	} {
		if err := c.db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	for s := range skus {
		sku := "sku-" + strconv.Itoa(s)
		c.db.Exec(`INSERT INTO `+stock+` (sku, reserved, last_n) VALUES (?, 0, 0)`, sku)
		c.db.Exec(`INSERT INTO `+ledger+` (sku, total, last_n) VALUES (?, 0, 0)`, sku)
	}
	topicOrders, topicStock := "chain-orders-"+sfx, "chain-stock-"+sfx
	for _, topic := range []string{topicOrders, topicStock} {
		if err := inventory.CreateTopic(ctx, brokers[0], topic, partitions); err != nil {
			t.Fatal(err)
		}
	}
	newOutbox := func(table string) *outbox.Outbox {
		store, err := c.newOutbox(table)
		if err != nil {
			t.Fatal(err)
		}
		ob, err := outbox.New(c.db, store, outbox.Config{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Maintain(ctx); err != nil {
			t.Fatal(err)
		}
		return ob
	}
	newInbox := func(table string) *inbox.Inbox {
		store, err := c.newInbox(table)
		if err != nil {
			t.Fatal(err)
		}
		ib, err := inbox.New(c.db, store, inbox.Config{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := ib.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := ib.Maintain(ctx); err != nil {
			t.Fatal(err)
		}
		return ib
	}
	obA, obB := newOutbox("outbox_a_"+sfx), newOutbox("outbox_b_"+sfx)
	ibB, ibC := newInbox("inbox_b_"+sfx), newInbox("inbox_c_"+sfx)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	startRelay := func(ob *outbox.Outbox, id string, runCtx context.Context, release bool) {
		w := outbox.NewKafkaWriter(brokers...)
		kp, err := outbox.NewKafkaPublisher(w)
		if err != nil {
			t.Fatal(err)
		}
		// Every third publish "loses its acknowledgement": the broker has
		// the messages, the relay does not mark them and sends them again.
		pub := &ackLosing{Publisher: kp, every: 3}
		r, err := ob.NewRelay(pub, outbox.RelayConfig{ID: id, Lease: 3 * time.Second, MaxMessages: 50, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer w.Close()
			if release {
				_ = r.Run(runCtx)
				return
			}
			// Dies without releasing its leases, as a SIGKILLed relay.
			for runCtx.Err() == nil {
				_, _ = r.PublishOnce(runCtx)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	doomedCtx, killRelay := context.WithCancel(runCtx)
	defer killRelay()
	startRelay(obA, "relay-a-doomed", doomedCtx, false)
	startRelay(obA, "relay-a-1", runCtx, true)
	startRelay(obB, "relay-b-1", runCtx, true)

	var reorders atomic.Int64
	parse := func(v []byte) (sku string, n int) {
		parts := strings.Split(string(v), "|")
		n, _ = strconv.Atoi(parts[2])
		return parts[1], n
	}
	reserve := func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		sku, n := parse(msg.Value)
		var last int
		if err := tx.Raw(`SELECT last_n FROM `+stock+` WHERE sku = ?`, sku).Scan(&last).Error; err != nil {
			return err
		}
		if n != last+1 {
			reorders.Add(1)
		}
		if err := tx.Exec(`UPDATE `+stock+` SET reserved = reserved + 1, last_n = ? WHERE sku = ?`, n, sku).Error; err != nil {
			return err
		}
		return obB.Enqueue(ctx, tx, outbox.Message{Topic: topicStock, Key: []byte(sku), Value: msg.Value, ID: "stock-reserved-" + msg.EventID})
	}
	book := func(ctx context.Context, tx *gorm.DB, msg consumer.Message) error {
		sku, n := parse(msg.Value)
		var last int
		if err := tx.Raw(`SELECT last_n FROM `+ledger+` WHERE sku = ?`, sku).Scan(&last).Error; err != nil {
			return err
		}
		if n != last+1 {
			reorders.Add(1)
		}
		return tx.Exec(`UPDATE `+ledger+` SET total = total + 1, last_n = ? WHERE sku = ?`, n, sku).Error
	}
	startConsumer := func(runCtx context.Context, group, topic, name string, ib *inbox.Inbox, h consumer.Handler) {
		cons, err := consumer.New(consumer.Config{Brokers: brokers, GroupID: group, Topics: []string{topic}, Inbox: ib, Consumer: name, Handler: h, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = cons.Run(runCtx) })
	}
	firstB, stopFirstB := context.WithCancel(runCtx)
	defer stopFirstB()
	startConsumer(firstB, "chain-b-"+sfx, topicOrders, "reserve", ibB, reserve)
	startConsumer(runCtx, "chain-c-"+sfx, topicStock, "ledger", ibC, book)

	// Service A.
	var writing sync.WaitGroup
	for w := range writers {
		writing.Go(func() {
			for n := 1; n <= perSKU; n++ {
				if w == 0 && n == perSKU/2 {
					killRelay()
					startRelay(obA, "relay-a-2", runCtx, true)
					stopFirstB()
					startConsumer(runCtx, "chain-b-"+sfx, topicOrders, "reserve", ibB, reserve)
				}
				for s := w; s < skus; s += writers {
					sku := "sku-" + strconv.Itoa(s)
					id := fmt.Sprintf("%s-%d", sku, n)
					err := c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						if err := tx.Exec(`INSERT INTO `+orders+` (id, sku) VALUES (?, ?)`, id, sku).Error; err != nil {
							return err
						}
						return obA.Enqueue(ctx, tx, outbox.Message{Topic: topicOrders, Key: []byte(sku), Value: []byte(id + "|" + sku + "|" + strconv.Itoa(n)), ID: "order-created-" + id})
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	writing.Wait()

	var booked int64
	for ctx.Err() == nil {
		if err := c.db.Raw(`SELECT COALESCE(SUM(total), 0) FROM ` + ledger).Scan(&booked).Error; err != nil {
			t.Fatal(err)
		}
		if booked >= int64(total) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // a late duplicate would show now
	stop()
	wg.Wait()

	var rows []struct {
		SKU      string
		Reserved int
		Total    int
	}
	if err := c.db.Raw(`SELECT s.sku AS sku, s.reserved AS reserved, l.total AS total FROM ` + stock + ` s JOIN ` + ledger + ` l ON l.sku = s.sku`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	lost, twice := 0, 0
	for _, r := range rows {
		for _, got := range []int{r.Reserved, r.Total} {
			if got < perSKU {
				lost += perSKU - got
			}
			if got > perSKU {
				twice += got - perSKU
			}
		}
	}
	t.Logf("%d orders: %d lost, %d applied twice, %d reordered within a key; duplicates dropped by the inboxes: B %d, C %d",
		total, lost, twice, reorders.Load(), ibB.Counters().Duplicates, ibC.Counters().Duplicates)
	if lost != 0 || twice != 0 || reorders.Load() != 0 {
		t.Fatalf("chain broken: %d lost, %d applied twice, %d reordered within a key", lost, twice, reorders.Load())
	}
}

// ackLosing publishes through Publisher and then reports every every-th
// call as failed, as a relay that crashed between the broker's
// acknowledgement and marking the messages published.
type ackLosing struct {
	outbox.Publisher
	every int
	calls atomic.Int64
}

func (p *ackLosing) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := p.Publisher.Publish(ctx, msgs); err != nil {
		return err
	}
	if p.calls.Add(1)%int64(p.every) == 0 {
		return errors.New("acknowledgement lost (injected)")
	}
	return nil
}
