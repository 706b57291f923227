package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

func expectResults(results []inbox.Result, err error, want []inbox.Outcome) error {
	if err != nil {
		return fmt.Errorf("batch: unexpected error: %w", err)
	}
	got := make([]inbox.Outcome, len(results))
	for i, r := range results {
		got[i] = r.Outcome
		if (r.Outcome == inbox.Failed) != (r.Err != nil) {
			return fmt.Errorf("batch result %d: outcome %v with error %v", i, r.Outcome, r.Err)
		}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("batch outcomes %v, want %v", got, want)
	}
	return nil
}

var batchChecks = []Check{
	{Area: "batch", Name: "duplicates-inside-batch-and-stored",
		Doc: "a batch with duplicates inside it and against stored rows applies exactly the new ones, once",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			a, b, c, d, e := env.Msg("b-a"), env.Msg("b-b"), env.Msg("b-c"), env.Msg("b-d"), env.Msg("b-e")
			for _, m := range []inbox.Message{a, b} {
				if out, err := ib.Process(ctx, m, env.Apply); err != nil || out != inbox.Processed {
					return fmt.Errorf("seeding %q: %v %v", m.ID, out, err)
				}
			}
			res, err := ib.ProcessBatch(ctx, []inbox.Message{a, c, d, c, b, e, e}, env.Apply)
			P, D := inbox.Processed, inbox.Duplicate
			if err := expectResults(res, err, []inbox.Outcome{D, P, P, D, D, P, D}); err != nil {
				return err
			}
			res, err = ib.ProcessBatch(ctx, []inbox.Message{e, d, c, b, a}, env.Apply)
			if err := expectResults(res, err, []inbox.Outcome{D, D, D, D, D}); err != nil {
				return fmt.Errorf("redelivered batch: %w", err)
			}
			for _, m := range []inbox.Message{a, b, c, d, e} {
				if err := env.expectEffects(ctx, m, 1); err != nil {
					return err
				}
			}
			return nil
		}},
	{Area: "batch", Name: "failing-message-is-isolated",
		Doc: "a failing, a panicking and an invalid message in a batch fail alone; the rest commit, and the failed ones apply on redelivery",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			x, poison, y, bomb, z := env.Msg("iso-x"), env.Msg("iso-poison"), env.Msg("iso-y"), env.Msg("iso-bomb"), env.Msg("iso-z")
			invalid := env.Msg("")
			h := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
				if err := env.Apply(ctx, tx, m); err != nil {
					return err
				}
				switch m.ID {
				case poison.ID:
					return errHandler
				case bomb.ID:
					panic("conformance: batch handler panics on purpose")
				}
				return nil
			}
			res, err := ib.ProcessBatch(ctx, []inbox.Message{x, poison, y, invalid, bomb, z}, h)
			P, F := inbox.Processed, inbox.Failed
			if err := expectResults(res, err, []inbox.Outcome{P, F, P, F, F, P}); err != nil {
				return err
			}
			if !errors.Is(res[1].Err, errHandler) || !errors.Is(res[3].Err, inbox.ErrInvalidMessage) || !errors.Is(res[4].Err, inbox.ErrHandlerPanic) {
				return fmt.Errorf("batch errors do not say what failed: %v / %v / %v", res[1].Err, res[3].Err, res[4].Err)
			}
			for m, want := range map[inbox.Message]int64{x: 1, y: 1, z: 1, poison: 0, bomb: 0} {
				if err := env.expectEffects(ctx, m, want); err != nil {
					return err
				}
			}
			for _, m := range []inbox.Message{poison, bomb} {
				if err := env.expectStored(ctx, m, false); err != nil {
					return err
				}
			}
			res, err = ib.ProcessBatch(ctx, []inbox.Message{x, poison, bomb}, env.Apply)
			if err := expectResults(res, err, []inbox.Outcome{inbox.Duplicate, P, P}); err != nil {
				return fmt.Errorf("redelivery: %w", err)
			}
			for _, m := range []inbox.Message{x, poison, bomb} {
				if err := env.expectEffects(ctx, m, 1); err != nil {
					return err
				}
			}
			return nil
		}},
	{Area: "batch", Name: "large-batch",
		Doc: "a batch of 12,000 messages, every third already stored, reports each one right (more bind parameters than any dialect allows in one statement, so it proves the multi-row claim is chunked)",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			const n = 12000
			msgs := make([]inbox.Message, n)
			var seeded []inbox.Message
			want := make([]inbox.Outcome, n)
			for i := range msgs {
				msgs[i] = env.MsgOn(fmt.Sprintf("large-%05d", i), -(i % 3))
				want[i] = inbox.Processed
				if i%3 == 0 {
					seeded = append(seeded, msgs[i])
					want[i] = inbox.Duplicate
				}
			}
			// One message first: a store that fails every delivery fails
			// here, not after the batch has isolated thousands of them.
			out, err := ib.Process(ctx, seeded[0], env.Apply)
			if err := expectOutcome("seeding "+seeded[0].ID, out, err, inbox.Processed); err != nil {
				return err
			}
			res, err := ib.ProcessBatch(ctx, seeded[1:], env.Apply)
			if err != nil {
				return fmt.Errorf("seeding: %w", err)
			}
			for i, r := range res {
				if r.Outcome != inbox.Processed {
					return fmt.Errorf("seeding %q: %v %v", seeded[i+1].ID, r.Outcome, r.Err)
				}
			}
			res, err = ib.ProcessBatch(ctx, msgs, env.Apply)
			if err := expectResults(res, err, want); err != nil {
				return err
			}
			total, err := env.TotalEffects(ctx)
			if err != nil {
				return err
			}
			if total != n {
				return fmt.Errorf("%d effects in all, want %d", total, n)
			}
			return nil
		}},
}
