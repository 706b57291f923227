//go:build cgo

package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
)

// An adapter, ours or a third party's, proves its stores with the
// conformance suite. Its tests hand the suite a HarnessMaker, which returns
// a fresh database with a fresh inbox Store and, if the adapter has one,
// outbox Store for every check, and run every check as a subtest:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, newHarness)
//	}
//
// The checks return errors rather than failing a *testing.T, so they also
// run outside a test, as here against the SQLite stores (inboxctl check does
// the same for a live database).
func Example_conformance() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-conformance")
	defer os.RemoveAll(dir)

	n := 0
	newHarness := func(ctx context.Context) (*conformance.Harness, error) {
		n++ // a database file per check
		path := filepath.Join(dir, "check-"+strconv.Itoa(n)+".db")
		open := func(context.Context) (*gorm.DB, error) {
			return gorm.Open(inboxsqlite.Open(path), &gorm.Config{Logger: logger.Discard})
		}
		db, err := open(ctx)
		if err != nil {
			return nil, err
		}
		store, err := inboxsqlite.New(inboxsqlite.Options{})
		if err != nil {
			return nil, err
		}
		ob, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{})
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{
			DB:       db,
			Store:    store,
			Outbox:   ob,   // nil skips the outbox checks
			Open:     open, // a second connection pool, as another process would have
			Features: conformance.Features{ExpiryCountsRows: true},
			Close: func() error {
				sqlDB, err := db.DB()
				if err != nil {
					return err
				}
				return sqlDB.Close()
			},
		}, nil
	}

	failed := 0
	for _, c := range conformance.Checks() {
		err := conformance.RunCheck(ctx, newHarness, c)
		switch {
		case errors.Is(err, conformance.ErrSkipped):
			// A capability the Store does not have (here: opening the
			// transaction with its watermark writes in one round trip).
			fmt.Println("skipped", c.ID())
		case err != nil:
			fmt.Println(err) // the check's id and what the Store got wrong
			failed++
		}
	}
	fmt.Println("checks failed:", failed)
	// Output:
	// skipped watermark/begin-and-save
	// checks failed: 0
}
