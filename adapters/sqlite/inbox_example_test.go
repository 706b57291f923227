//go:build cgo

package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// Open sets what the inbox relies on (write-ahead logging, immediate
// transactions, a busy timeout, durable commits); Verify refuses a
// connection without them, for instance one opened with a DSN of the
// application's own. New only checks its options: the table name must be a
// plain identifier.
func ExampleOpen() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	store, err := inboxsqlite.New(inboxsqlite.Options{Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}

	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Verify(ctx, db))

	// GORM's SQLite driver with a bare path: go-sqlite3's defaults.
	plain, err := gorm.Open(sqlite.Open(filepath.Join(dir, "plain.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Verify(ctx, plain) != nil)

	_, err = inboxsqlite.New(inboxsqlite.Options{Table: "inbox-messages"})
	fmt.Println(errors.Is(err, storage.ErrInvalidConfig))
	// Output:
	// <nil>
	// true
	// true
}

// Payment is the business table of the ProcessTx example.
type Payment struct {
	EventID string `gorm:"primaryKey"`
	Cents   int
}

// ProcessTx puts the inbox row and the handler's writes into a transaction
// the caller already holds, in a savepoint: the caller commits (and only
// then commits the broker offset), and if the caller rolls back, the inbox
// row goes too, so a redelivery is applied. ProcessTx never retries, since
// only the owner of the transaction can run it again: decide with
// ib.IsRetryable(err).
func Example_processTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{})
	if err := errors.Join(ib.Migrate(ctx), db.AutoMigrate(&Payment{})); err != nil {
		log.Fatal(err)
	}

	credit := func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
		return tx.Create(&Payment{EventID: msg.ID, Cents: 1250}).Error
	}
	// deliver handles one delivery in the caller's transaction; the
	// caller's own later step may still fail and roll everything back.
	deliver := func(id string, callerFails bool) {
		msg := inbox.Message{Consumer: "payments", ID: id, Time: time.Now()}
		err := db.Transaction(func(tx *gorm.DB) error {
			out, err := ib.ProcessTx(ctx, tx, msg, credit)
			if err != nil {
				return err
			}
			fmt.Println(id, out)
			if callerFails {
				return errors.New("the caller's next step failed")
			}
			return nil
		})
		if err != nil {
			fmt.Println(id, "rolled back:", err)
		}
	}
	deliver("pay-1", false)
	deliver("pay-1", false) // redelivered
	deliver("pay-2", true)
	deliver("pay-2", false) // redelivered after the rollback

	var n int64
	db.Model(&Payment{}).Count(&n)
	fmt.Println("payments:", n)
	// Output:
	// pay-1 processed
	// pay-1 duplicate
	// pay-2 processed
	// pay-2 rolled back: the caller's next step failed
	// pay-2 processed
	// payments: 2
}

// LedgerEntry is the business table of the ProcessBatchFunc example.
type LedgerEntry struct {
	EventID string `gorm:"primaryKey"`
	Account string
}

// ProcessBatchFunc calls a batch handler once per transaction with all the
// new messages of the batch, duplicates left out, so the effect can be one
// set-based statement (here one multi-row INSERT). When the handler fails,
// the batch is split until the failing message is alone: every other
// message still commits.
func Example_processBatchFunc() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{})
	if err := errors.Join(ib.Migrate(ctx), db.AutoMigrate(&LedgerEntry{})); err != nil {
		log.Fatal(err)
	}

	book := func(ctx context.Context, tx *gorm.DB, msgs []inbox.Message) error {
		entries := make([]LedgerEntry, 0, len(msgs))
		for _, m := range msgs {
			if m.ID == "e4" {
				return errors.New("account closed")
			}
			entries = append(entries, LedgerEntry{EventID: m.ID, Account: "acc-9"})
		}
		return tx.Create(&entries).Error
	}
	now := time.Now()
	batch := func(ids ...string) []inbox.Message {
		msgs := make([]inbox.Message, len(ids))
		for i, id := range ids {
			msgs[i] = inbox.Message{Consumer: "ledger", ID: id, Time: now}
		}
		return msgs
	}
	if _, err := ib.ProcessBatchFunc(ctx, batch("e1"), book); err != nil {
		log.Fatal(err)
	}
	// e1 was booked before; e4 cannot be booked.
	results, err := ib.ProcessBatchFunc(ctx, batch("e1", "e2", "e3", "e4", "e5"), book)
	if err != nil {
		log.Fatal(err) // the whole batch could not commit (the database failed)
	}
	for i, r := range results {
		fmt.Println("e"+fmt.Sprint(i+1), r.Outcome, r.Err)
	}
	var n int64
	db.Model(&LedgerEntry{}).Count(&n)
	fmt.Println("entries:", n)
	// Output:
	// e1 duplicate <nil>
	// e2 processed <nil>
	// e3 processed <nil>
	// e4 failed inbox: consumer "ledger" event "e4": account closed
	// e5 processed <nil>
	// entries: 4
}

// A handler marks with inbox.Retryable a failure that another run may
// cure: the inbox rolls the transaction back (the inbox row with it) and
// runs it again, up to Config.MaxAttempts runs in all. An unmarked error
// fails the message at once.
func Example_retryable() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(inboxsqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := inboxsqlite.New(inboxsqlite.Options{})
	ib, _ := inbox.New(db, store, inbox.Config{MaxAttempts: 5, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	errUnavailable := errors.New("fraud check: 503")
	calls := 0
	check := func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
		calls++
		if calls < 3 {
			return inbox.Retryable(errUnavailable) // the service is restarting
		}
		return nil
	}
	msg := inbox.Message{Consumer: "fraud", ID: "order-42", Time: time.Now()}
	out, err := ib.Process(ctx, msg, check)
	fmt.Println(out, err, "after", calls, "runs")

	calls = 0
	reject := func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
		calls++
		return errors.New("malformed amount")
	}
	msg.ID = "order-43"
	out, err = ib.Process(ctx, msg, reject)
	fmt.Println(out, err, "after", calls, "run")
	fmt.Println("retries:", ib.Counters().Retries)
	// Output:
	// processed <nil> after 3 runs
	// failed inbox: consumer "fraud" event "order-43": malformed amount after 1 run
	// retries: 2
}
