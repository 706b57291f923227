package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

type gormDB = gorm.DB

var schemaChecks = []Check{
	{Area: "schema", Name: "migrate-is-idempotent",
		Doc: "Migrate run again on a migrated database succeeds and keeps the rows",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("migrate-1")
			if out, err := ib.Process(ctx, msg, env.Apply); err != nil || out != inbox.Processed {
				return fmt.Errorf("first delivery: %v %v", out, err)
			}
			for range 2 {
				if err := env.H.Store.Migrate(ctx, env.H.DB.WithContext(ctx)); err != nil {
					return fmt.Errorf("second Migrate: %w", err)
				}
			}
			out, err := ib.Process(ctx, msg, env.Apply)
			return expectOutcome("redelivery after re-migration", out, err, inbox.Duplicate)
		}},
	{Area: "schema", Name: "migrate-concurrently",
		Doc:        "several processes running Migrate at once on a fresh database all succeed",
		Unmigrated: true,
		Run: func(ctx context.Context, env *Env) error {
			err := env.asProcesses(ctx, 4, func(db *gorm.DB) error { return env.H.Store.Migrate(ctx, db.WithContext(ctx)) })
			if err != nil {
				return fmt.Errorf("concurrent Migrate: %w", err)
			}
			out, err := env.Inbox().Process(ctx, env.Msg("concurrent-migrate-1"), env.Apply)
			return expectOutcome("delivery after concurrent migration", out, err, inbox.Processed)
		}},
	{Area: "schema", Name: "table-is-transactional",
		Doc: "a claim in a rolled-back transaction leaves no row, a committed one does; a Store that can check its settings finds them safe",
		Run: func(ctx context.Context, env *Env) error {
			msg := env.Msg("tx-1")
			for _, commit := range []bool{false, true} {
				errRollback := errors.New("roll back")
				err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					inserted, err := env.H.Store.Claim(ctx, tx, []storage.InboxRow{RowOf(msg)})
					if err != nil {
						return err
					}
					if !slices.Equal(inserted, []bool{true}) {
						return fmt.Errorf("claim of a new row answered %v", inserted)
					}
					if commit {
						return nil
					}
					return errRollback
				}, env.H.TxOptions)
				if err != nil && !errors.Is(err, errRollback) {
					return err
				}
				if err := env.expectStored(ctx, msg, commit); err != nil {
					return fmt.Errorf("after commit=%v: %w", commit, err)
				}
			}
			if v, ok := env.H.Store.(storage.Verifier); ok {
				if err := v.Verify(ctx, env.H.DB); err != nil {
					return fmt.Errorf("the Store's Verify on the harness database: %w", err)
				}
			}
			return nil
		}},
	{Area: "schema", Name: "claim-answers-each-row",
		Doc: "one multi-row Claim answers, row by row and in order, which rows are new",
		Run: func(ctx context.Context, env *Env) error {
			m := func(id string) storage.InboxRow { return RowOf(env.Msg(id)) }
			steps := []struct {
				rows []storage.InboxRow
				want []bool
			}{
				{[]storage.InboxRow{m("c-a"), m("c-b"), m("c-c")}, []bool{true, true, true}},
				{[]storage.InboxRow{m("c-d"), m("c-b"), m("c-e"), m("c-a")}, []bool{true, false, true, false}},
				{[]storage.InboxRow{m("c-e")}, []bool{false}},
			}
			for i, s := range steps {
				err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					got, err := env.H.Store.Claim(ctx, tx, s.rows)
					if err != nil {
						return err
					}
					if !slices.Equal(got, s.want) {
						return fmt.Errorf("the claim answered %v, want %v", got, s.want)
					}
					return nil
				}, env.H.TxOptions)
				if err != nil {
					return fmt.Errorf("step %d: %w", i+1, err)
				}
			}
			return nil
		}},
	{Area: "schema", Name: "missing-table-is-reported",
		Doc:        "a Store that reports missing tables (storage.MissingTableReporter) says so of a claim before Migrate, and of no other error",
		Unmigrated: true,
		Run: func(ctx context.Context, env *Env) error {
			mt, ok := env.H.Store.(storage.MissingTableReporter)
			if !ok {
				return fmt.Errorf("%w: the inbox Store does not implement storage.MissingTableReporter", ErrSkipped)
			}
			errClaimed := errors.New("claimed")
			err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if _, err := env.H.Store.Claim(ctx, tx, []storage.InboxRow{RowOf(env.Msg("no-table-1"))}); err != nil {
					return err
				}
				return errClaimed
			}, env.H.TxOptions)
			switch {
			case errors.Is(err, errClaimed):
				return errors.New("a claim before Migrate succeeded")
			case !mt.IsMissingTable(err):
				return fmt.Errorf("IsMissingTable is false for a claim before Migrate: %v", err)
			}
			// Another error of a statement on an existing table.
			err = env.H.DB.WithContext(ctx).Raw(`SELECT no_such_column FROM ` + env.effects).Scan(new(int)).Error
			switch {
			case err == nil:
				return fmt.Errorf("a select of a column that does not exist succeeded")
			case mt.IsMissingTable(err):
				return fmt.Errorf("IsMissingTable is true for a column that does not exist: %v", err)
			case mt.IsMissingTable(nil):
				return errors.New("IsMissingTable is true for nil")
			}
			return nil
		}},
}

// asProcesses runs fn n times at once, each on its own connection pool when
// the harness can open one (as separate processes would), and joins their
// errors.
func (env *Env) asProcesses(ctx context.Context, n int, fn func(db *gorm.DB) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			db := env.H.DB
			if env.H.Open != nil {
				other, err := env.H.Open(ctx)
				if err != nil {
					errs[i] = fmt.Errorf("open: %w", err)
					return
				}
				defer closeDB(other)
				db = other
			}
			errs[i] = fn(db)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}
