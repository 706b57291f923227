package conformance

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

var errHandler = errors.New("conformance: handler fails on purpose")

var atomicityChecks = []Check{
	{Area: "atomicity", Name: "first-delivery-commits-row-and-effect",
		Doc: "a first delivery commits the inbox row and the effect together",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("first-1")
			out, err := ib.Process(ctx, msg, env.Apply)
			if err := expectOutcome("first delivery", out, err, inbox.Processed); err != nil {
				return err
			}
			if err := env.expectEffects(ctx, msg, 1); err != nil {
				return err
			}
			return env.expectStored(ctx, msg, true)
		}},
	{Area: "atomicity", Name: "duplicate-skips-handler",
		Doc: "a redelivery is reported Duplicate, its handler does not run, the effect stays applied once",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("dup-1")
			out, err := ib.Process(ctx, msg, env.Apply)
			if err := expectOutcome("first delivery", out, err, inbox.Processed); err != nil {
				return err
			}
			for i := range 3 {
				ran := false
				out, err := ib.Process(ctx, msg, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
					ran = true
					return env.Apply(ctx, tx, m)
				})
				if err := expectOutcome(fmt.Sprintf("redelivery %d", i+1), out, err, inbox.Duplicate); err != nil {
					return err
				}
				if ran {
					return fmt.Errorf("redelivery %d: handler ran for a duplicate", i+1)
				}
			}
			return env.expectEffects(ctx, msg, 1)
		}},
	{Area: "atomicity", Name: "handler-error-rolls-back",
		Doc: "a failing handler leaves neither inbox row nor effect, and the redelivery is applied",
		Run: func(ctx context.Context, env *Env) error {
			return failThenRedeliver(ctx, env, "herr-1", func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				if err := env.Apply(ctx, tx, m); err != nil {
					return err
				}
				return errHandler
			}, func(err error) error {
				if !errors.Is(err, errHandler) {
					return fmt.Errorf("error %v does not wrap the handler's error", err)
				}
				return nil
			})
		}},
	{Area: "atomicity", Name: "handler-panic-rolls-back",
		Doc: "a panicking handler is recovered into an error and leaves neither row nor effect",
		Run: func(ctx context.Context, env *Env) error {
			return failThenRedeliver(ctx, env, "hpanic-1", func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				if err := env.Apply(ctx, tx, m); err != nil {
					return err
				}
				panic("conformance: handler panics on purpose")
			}, func(err error) error {
				var pe *inbox.PanicError
				if !errors.As(err, &pe) {
					return fmt.Errorf("error %v is not a *inbox.PanicError", err)
				}
				return nil
			})
		}},
	{Area: "atomicity", Name: "begin-in-handler-is-refused",
		Doc: "a handler's Begin on the transaction it was given fails instead of opening a transaction that commits apart from the inbox row",
		Run: func(ctx context.Context, env *Env) error {
			var beginErr error
			err := failThenRedeliver(ctx, env, "begin-1", func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				if err := env.Apply(ctx, tx, m); err != nil {
					return err
				}
				inner := tx.Begin()
				if beginErr = inner.Error; beginErr == nil {
					_ = inner.Rollback().Error
				}
				return errHandler
			}, func(err error) error {
				if !errors.Is(err, errHandler) {
					return fmt.Errorf("error %v does not wrap the handler's error", err)
				}
				return nil
			})
			if beginErr == nil {
				return errors.Join(errors.New("a handler's Begin opened a transaction of its own, which commits apart from the inbox row (the transaction must not offer BeginTx)"), err)
			}
			return err
		}},
	{Area: "atomicity", Name: "nested-transaction-is-a-savepoint",
		Doc: "a nested Transaction in a handler is a savepoint: its failure rolls back only its own writes, and the rest commits with the inbox row",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg, inner := env.Msg("nested-1"), env.Msg("nested-inner-1")
			var nestedErr error
			out, err := ib.Process(ctx, msg, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				if err := env.Apply(ctx, tx, m); err != nil {
					return err
				}
				nestedErr = tx.Transaction(func(sp *gorm.DB) error {
					if err := env.Apply(ctx, sp, inner); err != nil {
						return err
					}
					return errHandler
				})
				return nil
			})
			if err := expectOutcome("delivery whose nested transaction failed", out, err, inbox.Processed); err != nil {
				return err
			}
			if !errors.Is(nestedErr, errHandler) {
				return fmt.Errorf("the nested Transaction returned %v, want the error of its function", nestedErr)
			}
			if err := env.expectEffects(ctx, inner, 0); err != nil {
				return fmt.Errorf("the failed nested transaction: %w", err)
			}
			if err := env.expectEffects(ctx, msg, 1); err != nil {
				return err
			}
			if err := env.expectStored(ctx, msg, true); err != nil {
				return err
			}
			out, err = ib.Process(ctx, msg, env.Apply)
			return expectOutcome("redelivery", out, err, inbox.Duplicate)
		}},
	{Area: "atomicity", Name: "cancelled-context-rolls-back",
		Doc: "a context cancelled before commit leaves neither row nor effect",
		Run: func(ctx context.Context, env *Env) error {
			pctx, cancel := context.WithCancel(ctx)
			defer cancel()
			ib := env.Inbox()
			msg := env.Msg("cancel-1")
			out, err := ib.Process(pctx, msg, func(hctx context.Context, tx *gorm.DB, m inbox.Message) error {
				if err := env.Apply(hctx, tx, m); err != nil {
					return err
				}
				cancel()
				return nil
			})
			if err == nil || out != inbox.Failed {
				return fmt.Errorf("delivery whose context was cancelled before commit: outcome %v, error %v; want Failed with an error", out, err)
			}
			if !errors.Is(err, context.Canceled) {
				return fmt.Errorf("error %v does not wrap context.Canceled", err)
			}
			return expectRedeliveryApplies(ctx, env, ib, msg)
		}},
	{Area: "atomicity", Name: "caller-rollback-removes-both",
		Doc: "ProcessTx inside a caller's transaction: the caller's rollback removes the inbox row and the effect",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("callerrb-1")
			errCaller := errors.New("caller rolls back")
			err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				out, err := ib.ProcessTx(ctx, tx, msg, env.Apply)
				if err := expectOutcome("ProcessTx", out, err, inbox.Processed); err != nil {
					return err
				}
				return errCaller
			}, env.H.TxOptions)
			if !errors.Is(err, errCaller) {
				return fmt.Errorf("caller transaction: %v", err)
			}
			return expectRedeliveryApplies(ctx, env, ib, msg)
		}},
	{Area: "atomicity", Name: "caller-commit-keeps-both",
		Doc: "ProcessTx inside a caller's transaction that commits: row and effect stay, a redelivery is a duplicate",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("callercommit-1")
			for i, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					out, err := ib.ProcessTx(ctx, tx, msg, env.Apply)
					return expectOutcome(fmt.Sprintf("delivery %d", i+1), out, err, want)
				}, env.H.TxOptions)
				if err != nil {
					return err
				}
			}
			return env.expectEffects(ctx, msg, 1)
		}},
	{Area: "atomicity", Name: "processtx-error-keeps-caller-tx-usable",
		Doc: "a failing handler under ProcessTx rolls back only its own row and effect; the caller's transaction goes on and commits",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			own := env.Msg("caller-own-write")
			failing := env.Msg("sp-fail-1")
			after := env.Msg("sp-after-1")
			err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if err := env.Apply(ctx, tx, own); err != nil {
					return err
				}
				out, err := ib.ProcessTx(ctx, tx, failing, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
					if err := env.Apply(ctx, tx, m); err != nil {
						return err
					}
					return errHandler
				})
				if out != inbox.Failed || !errors.Is(err, errHandler) {
					return fmt.Errorf("failing ProcessTx: outcome %v, error %v; want Failed wrapping the handler error", out, err)
				}
				out, err = ib.ProcessTx(ctx, tx, after, env.Apply)
				return expectOutcome("ProcessTx after a failed one in the same transaction", out, err, inbox.Processed)
			}, env.H.TxOptions)
			if err != nil {
				return fmt.Errorf("caller transaction: %w", err)
			}
			for _, c := range []struct {
				m       inbox.Message
				effects int64
				stored  bool
			}{{own, 1, false}, {failing, 0, false}, {after, 1, true}} {
				if err := env.expectEffects(ctx, c.m, c.effects); err != nil {
					return err
				}
				if c.m.ID != own.ID {
					if err := env.expectStored(ctx, c.m, c.stored); err != nil {
						return err
					}
				}
			}
			return nil
		}},
}

// failThenRedeliver delivers id with a failing handler, checks the error with
// checkErr, then checks that nothing was committed and a redelivery applies.
func failThenRedeliver(ctx context.Context, env *Env, id string, h inbox.Handler, checkErr func(error) error) error {
	ib := env.Inbox()
	msg := env.Msg(id)
	out, err := ib.Process(ctx, msg, h)
	if err == nil || out != inbox.Failed {
		return fmt.Errorf("failing delivery: outcome %v, error %v; want Failed with an error", out, err)
	}
	if err := checkErr(err); err != nil {
		return err
	}
	return expectRedeliveryApplies(ctx, env, ib, msg)
}

// expectRedeliveryApplies checks that msg left nothing behind and that its
// redelivery is applied once.
func expectRedeliveryApplies(ctx context.Context, env *Env, ib *inbox.Inbox, msg inbox.Message) error {
	if err := env.expectEffects(ctx, msg, 0); err != nil {
		return fmt.Errorf("after the failed delivery: %w", err)
	}
	if err := env.expectStored(ctx, msg, false); err != nil {
		return fmt.Errorf("after the failed delivery: %w", err)
	}
	out, err := ib.Process(ctx, msg, env.Apply)
	if err := expectOutcome("redelivery", out, err, inbox.Processed); err != nil {
		return err
	}
	return env.expectEffects(ctx, msg, 1)
}
