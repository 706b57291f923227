package postgres_test

import (
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/storage"
)

// New checks the options and touches no database: a configuration error
// shows at start-up, wrapping storage.ErrInvalidConfig. Table names are
// bounded so that the day partitions' names (<table>_pYYYYMMDD) fit
// PostgreSQL's 63 bytes.
func ExampleNew() {
	store, err := inboxpg.New(inboxpg.Options{Schema: "billing", Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Schema(), store.Table())

	_, err = inboxpg.New(inboxpg.Options{Table: "inbox_messages_of_the_billing_service_for_the_eu_region_v2"})
	fmt.Println(errors.Is(err, storage.ErrInvalidConfig))
	// Output:
	// billing inbox_messages
	// true
}

// Teams that keep their DDL in a migration tool (goose, Atlas,
// golang-migrate) write MigrationSQL's statements into a migration instead
// of calling Migrate. Maintain must still run afterwards (RunMaintenance,
// or the consumer does it hourly): it creates the following days'
// partitions and drops expired ones. The last statement makes the
// watermark table of sequenced dedup. Only the first line of each
// statement is printed here.
func ExampleStore_MigrationSQL() {
	store, err := inboxpg.New(inboxpg.Options{Schema: "billing", Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}
	today := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	stmts, err := store.MigrationSQL(storage.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range stmts {
		first, _, _ := strings.Cut(s, "\n")
		fmt.Println(first)
	}
	// Output:
	// CREATE SCHEMA IF NOT EXISTS "billing"
	// CREATE TABLE IF NOT EXISTS "billing"."inbox_messages" (
	// CREATE TABLE IF NOT EXISTS "billing"."inbox_messages_p20261201" PARTITION OF "billing"."inbox_messages" FOR VALUES FROM ('2026-12-01') TO ('2026-12-02')
	// CREATE TABLE IF NOT EXISTS "billing"."inbox_messages_p20261202" PARTITION OF "billing"."inbox_messages" FOR VALUES FROM ('2026-12-02') TO ('2026-12-03')
	// CREATE TABLE IF NOT EXISTS "billing"."inbox_messages_watermarks" (
}
