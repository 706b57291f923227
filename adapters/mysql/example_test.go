package mysql_test

import (
	"context"
	"log"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/inbox"
)

// Example wires an inbox to MySQL or MariaDB. It needs a server, so it is
// compiled but not run.
func Example() {
	ctx := context.Background()
	dialector, err := inboxmysql.Open("app:secret@tcp(127.0.0.1:3306)/app?parseTime=true&loc=UTC")
	if err != nil {
		log.Fatal(err)
	}
	db, err := gorm.Open(dialector, &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	store, err := inboxmysql.New(inboxmysql.Options{Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{RetentionDays: 14})
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// Refuse to run on settings that break the inbox's guarantees (a lax
	// sql_mode, a non-InnoDB table).
	if err := store.Verify(ctx, db); err != nil {
		log.Fatal(err)
	}
	// Add the coming days' partitions now, and keep doing it (and expiring
	// old days) in the background.
	if _, err := ib.Maintain(ctx); err != nil {
		log.Fatal(err)
	}
	go func() { _ = ib.RunMaintenance(ctx, time.Hour) }()

	msg := inbox.Message{Consumer: "billing", ID: "order-42", Time: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
	outcome, err := ib.Process(ctx, msg, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		return tx.Exec("UPDATE accounts SET balance = balance - 10 WHERE id = ?", 7).Error
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Println(outcome) // processed the first time, duplicate on a redelivery
}
