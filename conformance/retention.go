package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

func processExpired(cfg *inbox.Config) { cfg.Expired = inbox.ProcessExpired }

// seed processes msgs (which may be expired) and fails unless all are new.
func seed(ctx context.Context, env *Env, msgs ...inbox.Message) error {
	ib := env.Inbox(processExpired)
	for _, m := range msgs {
		if out, err := ib.Process(ctx, m, env.Apply); err != nil || out != inbox.Processed {
			return fmt.Errorf("seeding %q (day %s): outcome %v, error %v", m.ID, m.Day().Format(time.DateOnly), out, err)
		}
	}
	return nil
}

func maintain(ctx context.Context, ib *inbox.Inbox) (storage.MaintenanceReport, error) {
	r, err := ib.Maintain(ctx)
	if err != nil {
		return r, fmt.Errorf("maintain: %w", err)
	}
	return r, nil
}

var retentionChecks = []Check{
	{Area: "retention", Name: "redelivery-after-days-turn-and-maintenance",
		Doc: "a redelivery after the day has turned (three times) and maintenance has run is still a duplicate",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msg := env.Msg("turn-1")
			if _, err := maintain(ctx, ib); err != nil {
				return err
			}
			out, err := ib.Process(ctx, msg, env.Apply)
			if err := expectOutcome("first delivery", out, err, inbox.Processed); err != nil {
				return err
			}
			for day := 1; day <= RetentionDays; day++ {
				env.Clock.AddDays(1)
				if _, err := maintain(ctx, ib); err != nil {
					return err
				}
				out, err := ib.Process(ctx, msg, env.Apply)
				if err := expectOutcome(fmt.Sprintf("redelivery %d days later", day), out, err, inbox.Duplicate); err != nil {
					return err
				}
			}
			return env.expectEffects(ctx, msg, 1)
		}},
	{Area: "retention", Name: "retention-edge",
		Doc: "an event on the oldest retained day is deduplicated; one day older is rejected with ErrExpired and nothing applied by default, and processed only under ProcessExpired",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			edge := env.MsgOn("edge-1", -RetentionDays)
			edge.Time = env.Today.AddDate(0, 0, -RetentionDays) // 00:00:00, the very first instant kept
			beyond := env.MsgOn("beyond-1", -RetentionDays-1)
			beyond.Time = edge.Time.Add(-time.Nanosecond) // the last instant expired
			if _, err := maintain(ctx, ib); err != nil {
				return err
			}
			for i, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				out, err := ib.Process(ctx, edge, env.Apply)
				if err := expectOutcome(fmt.Sprintf("edge delivery %d", i+1), out, err, want); err != nil {
					return err
				}
			}
			ran := false
			out, err := ib.Process(ctx, beyond, func(ctx context.Context, tx *gormDB, m inbox.Message) error {
				ran = true
				return nil
			})
			var expired *inbox.ExpiredError
			if out != inbox.Failed || !errors.Is(err, inbox.ErrExpired) || !errors.As(err, &expired) || ran {
				return fmt.Errorf("expired event: outcome %v, error %v, handler ran %v; want Failed, *inbox.ExpiredError, not run", out, err, ran)
			}
			if err := env.expectEffects(ctx, beyond, 0); err != nil {
				return err
			}
			if err := env.expectStored(ctx, beyond, false); err != nil {
				return err
			}
			out, err = env.Inbox(processExpired).Process(ctx, beyond, env.Apply)
			if err := expectOutcome("expired event under ProcessExpired", out, err, inbox.Processed); err != nil {
				return err
			}
			if _, err := maintain(ctx, ib); err != nil {
				return err
			}
			out, err = ib.Process(ctx, edge, env.Apply)
			if err := expectOutcome("edge delivery after maintenance", out, err, inbox.Duplicate); err != nil {
				return err
			}
			return env.expectEffects(ctx, edge, 1)
		}},
	{Area: "retention", Name: "maintain-removes-only-expired-days",
		Doc: "Maintain removes the rows of every day before the plan's ExpireBefore and of no later day, reports them, and a second run changes nothing",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			plan := ib.Plan()
			if _, err := maintain(ctx, ib); err != nil {
				return err
			}
			var msgs []inbox.Message
			for d := -10; d <= PrepareDays+1; d++ {
				msgs = append(msgs, env.MsgOn(fmt.Sprintf("day%+d", d), d))
			}
			if err := seed(ctx, env, msgs...); err != nil {
				return err
			}
			var wantExpired int64
			for round := 1; round <= 2; round++ {
				report, err := maintain(ctx, ib)
				if err != nil {
					return err
				}
				for _, m := range msgs {
					expired := m.Day().Before(plan.ExpireBefore)
					if round == 1 && expired {
						wantExpired++
						if !slices.ContainsFunc(report.Expired, m.Day().Equal) {
							return fmt.Errorf("round %d: report.Expired %v lacks day %s", round, report.Expired, m.Day().Format(time.DateOnly))
						}
					}
					if err := env.expectStored(ctx, m, !expired); err != nil {
						return fmt.Errorf("round %d, day %s (expire before %s): %w", round, m.Day().Format(time.DateOnly), plan.ExpireBefore.Format(time.DateOnly), err)
					}
				}
				for _, d := range report.Expired {
					if !d.Before(plan.ExpireBefore) {
						return fmt.Errorf("round %d: report.Expired names day %s, not before %s", round, d.Format(time.DateOnly), plan.ExpireBefore.Format(time.DateOnly))
					}
				}
				if env.H.Features.ExpiryCountsRows {
					want := wantExpired
					if round == 2 {
						want = 0
					}
					if report.RowsRemoved != want {
						return fmt.Errorf("round %d: RowsRemoved %d, want %d", round, report.RowsRemoved, want)
					}
				}
			}
			return nil
		}},
	{Area: "retention", Name: "maintain-concurrently",
		Doc: "several processes running Maintain at once all succeed and leave exactly the unexpired rows",
		Run: func(ctx context.Context, env *Env) error {
			var msgs []inbox.Message
			for d := -8; d <= PrepareDays+2; d++ {
				msgs = append(msgs, env.MsgOn(fmt.Sprintf("cm%+d", d), d))
			}
			if err := seed(ctx, env, msgs...); err != nil {
				return err
			}
			err := env.asProcesses(ctx, 4, func(db *gorm.DB) error {
				_, err := env.InboxOn(db).Maintain(ctx)
				return err
			})
			if err != nil {
				return fmt.Errorf("concurrent Maintain: %w", err)
			}
			expireBefore := env.Inbox().Plan().ExpireBefore
			for _, m := range msgs {
				if err := env.expectStored(ctx, m, !m.Day().Before(expireBefore)); err != nil {
					return fmt.Errorf("day %s after concurrent maintenance: %w", m.Day().Format(time.DateOnly), err)
				}
			}
			return nil
		}},
	{Area: "retention", Name: "maintain-dry-run-changes-nothing",
		Doc: "a dry run reports the expired days and removes nothing",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			old := env.MsgOn("dry-old", -RetentionDays-5)
			if err := seed(ctx, env, old); err != nil {
				return err
			}
			plan := ib.Plan()
			plan.DryRun = true
			report, err := ib.MaintainPlan(ctx, plan)
			if err != nil {
				return fmt.Errorf("dry run: %w", err)
			}
			if !slices.ContainsFunc(report.Expired, old.Day().Equal) || !report.DryRun {
				return fmt.Errorf("dry run report %+v does not name day %s", report, old.Day().Format(time.DateOnly))
			}
			return env.expectStored(ctx, old, true)
		}},
	{Area: "retention", Name: "future-dated-events",
		Doc: "events dated days and a year ahead (clock skew) are processed once and deduplicated, before and after maintenance prepares their days",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			msgs := []inbox.Message{env.MsgOn("future+1", 1), env.MsgOn("future+3", PrepareDays+1), env.MsgOn("future+400", 400)}
			for _, m := range msgs {
				out, err := ib.Process(ctx, m, env.Apply)
				if err := expectOutcome("future-dated "+m.ID, out, err, inbox.Processed); err != nil {
					return err
				}
			}
			for step := range 3 {
				if step > 0 {
					env.Clock.AddDays(2)
				}
				if _, err := maintain(ctx, ib); err != nil {
					return err
				}
				for _, m := range msgs {
					out, err := ib.Process(ctx, m, env.Apply)
					if err := expectOutcome(fmt.Sprintf("redelivery of %s after maintenance %d", m.ID, step+1), out, err, inbox.Duplicate); err != nil {
						return err
					}
				}
			}
			for _, m := range msgs {
				if err := env.expectEffects(ctx, m, 1); err != nil {
					return err
				}
			}
			return nil
		}},
	{Area: "retention", Name: "future-dated-in-batch-and-tx",
		Doc: "far-future events in one ProcessBatch (several unprepared days at once) and under ProcessTx (in a transaction with writes of its own) are processed once and deduplicated, without maintenance",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			batch := []inbox.Message{env.MsgOn("batch+0", 0), env.MsgOn("batch+500", 500), env.MsgOn("batch+900", 900), env.MsgOn("batch+501", 501)}
			for round, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				res, err := ib.ProcessBatch(ctx, batch, env.Apply)
				if err != nil {
					return fmt.Errorf("batch round %d: %w", round+1, err)
				}
				for i, r := range res {
					if err := expectOutcome(fmt.Sprintf("batch round %d, %s", round+1, batch[i].ID), r.Outcome, r.Err, want); err != nil {
						return err
					}
				}
			}
			msg := env.MsgOn("tx+700", 700)
			for round, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				var out inbox.Outcome
				err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					// The caller's transaction has written before (its own
					// effect), and claims a row of today after. (Claiming
					// today's row first is not required to work: on MariaDB
					// the caller's transaction would then hold the metadata
					// lock that adding the day's partition needs.)
					if err := env.Apply(ctx, tx, inbox.Message{Consumer: "caller", ID: fmt.Sprintf("own-%d", round)}); err != nil {
						return err
					}
					var err error
					if out, err = ib.ProcessTx(ctx, tx, msg, env.Apply); err != nil {
						return err
					}
					if o, err := ib.ProcessTx(ctx, tx, env.MsgOn(fmt.Sprintf("tx-today-%d", round), 0), env.Apply); err != nil || o != inbox.Processed {
						return fmt.Errorf("ProcessTx of today's event after it: %v %w", o, err)
					}
					return nil
				}, env.H.TxOptions)
				if err := expectOutcome(fmt.Sprintf("ProcessTx round %d", round+1), out, err, want); err != nil {
					return err
				}
			}
			for _, m := range append(batch, msg) {
				if err := env.expectEffects(ctx, m, 1); err != nil {
					return err
				}
			}
			return nil
		}},
	{Area: "retention", Name: "maintain-while-inserting",
		Doc: "Maintain runs repeatedly, with the days moving on, while live events and late expired events are inserted: no live delivery fails or is applied twice, and expired rows end removed",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			late := env.Inbox(processExpired)
			if _, err := maintain(ctx, ib); err != nil {
				return err
			}
			const workers, perWorker = 4, 40
			var t tally
			var wg sync.WaitGroup
			var expiredMsgs []inbox.Message
			var lateErrs []error
			var lateMu sync.Mutex
			stop := make(chan struct{})
			for w := range workers {
				wg.Go(func() {
					for i := range perWorker {
						// Days -1..+2 stay inside retention while the
						// clock moves two days ahead below.
						m := env.MsgOn(fmt.Sprintf("live-%d-%d", w, i), -1+(i+w)%4)
						t.add(ib.Process(ctx, m, env.Apply))
					}
				})
			}
			var lateWG sync.WaitGroup
			lateWG.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					m := env.MsgOn(fmt.Sprintf("late-%d", i), -RetentionDays-2-i%4)
					out, err := late.Process(ctx, m, env.Apply)
					lateMu.Lock()
					if err != nil || out != inbox.Processed {
						lateErrs = append(lateErrs, fmt.Errorf("late %q: %v %v", m.ID, out, err))
					} else {
						expiredMsgs = append(expiredMsgs, m)
					}
					lateMu.Unlock()
					time.Sleep(2 * time.Millisecond)
				}
			})
			var maintErr error
			maintDone := make(chan struct{})
			go func() {
				defer close(maintDone)
				for round := range 8 {
					// Move the days on twice, so that maintenance really
					// prepares and expires days while the inserts run.
					if round == 3 || round == 6 {
						env.Clock.AddDays(1)
					}
					if _, err := maintain(ctx, ib); err != nil {
						maintErr = err
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
			wg.Wait()
			<-maintDone
			close(stop)
			lateWG.Wait()
			if maintErr != nil {
				return maintErr
			}
			if len(lateErrs) > 0 {
				return errors.Join(lateErrs...)
			}
			if len(t.errs) > 0 || t.processed != workers*perWorker {
				return fmt.Errorf("live deliveries during maintenance: %d processed, %d duplicates, errors %v; want %d processed",
					t.processed, t.duplicates, errors.Join(t.errs...), workers*perWorker)
			}
			if _, err := maintain(ctx, ib); err != nil {
				return err
			}
			for _, m := range expiredMsgs {
				if err := env.expectStored(ctx, m, false); err != nil {
					return fmt.Errorf("late expired row after the final maintenance: %w", err)
				}
			}
			total, err := env.TotalEffects(ctx)
			if err != nil {
				return err
			}
			if want := int64(workers*perWorker + len(expiredMsgs)); total != want {
				return fmt.Errorf("%d effects, want %d", total, want)
			}
			return nil
		}},
}
