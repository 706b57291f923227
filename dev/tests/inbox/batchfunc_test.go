package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/faulttest"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/batchopt"
)

// setEffect is a set-based batch handler: one statement for all messages.
func setEffect(ctx context.Context, tx *gorm.DB, msgs []inbox.Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	q := "INSERT INTO effects (id) VALUES " + strings.TrimSuffix(strings.Repeat("(?),", len(ids)), ",")
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return tx.WithContext(ctx).Exec(q, args...).Error
}

func TestProcessBatchFuncCallsOnceWithTheNewMessages(t *testing.T) {
	ib, db := newFaultInbox(t, inbox.Config{}, faulttest.PostgresLike, nil)
	if _, err := ib.Process(t.Context(), msg("seen"), writeEffect); err != nil {
		t.Fatal(err)
	}
	var calls [][]string
	h := func(ctx context.Context, tx *gorm.DB, msgs []inbox.Message) error {
		var ids []string
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
		calls = append(calls, ids)
		return setEffect(ctx, tx, msgs)
	}
	msgs := []inbox.Message{msg("a"), msg("seen"), msg("b"), msg("a"), msg("c")}
	results, err := ib.ProcessBatchFunc(t.Context(), msgs, h)
	if err != nil {
		t.Fatal(err)
	}
	want := []inbox.Outcome{inbox.Processed, inbox.Duplicate, inbox.Processed, inbox.Duplicate, inbox.Processed}
	for i, r := range results {
		if r.Outcome != want[i] {
			t.Errorf("%s: %v, want %v", msgs[i].ID, r.Outcome, want[i])
		}
	}
	if len(calls) != 1 || !slices.Equal(calls[0], []string{"a", "b", "c"}) {
		t.Errorf("handler calls %v, want one with [a b c]", calls)
	}
	if got := countRows(t, db, "effects"); got != 4 {
		t.Errorf("%d effects, want 4", got)
	}
	calls = nil
	if _, err := ib.ProcessBatchFunc(t.Context(), msgs, h); err != nil || len(calls) != 0 {
		t.Errorf("replay: %v, %d handler calls; want none", err, len(calls))
	}
}

// TestProcessBatchFuncIsolatesPoisonBySplitting: the batch handler fails
// whenever its batch holds a poison message (or panics for another); the
// batch is split until the poisons are alone, and every other message
// commits, in a bounded number of transactions.
func TestProcessBatchFuncIsolatesPoisonBySplitting(t *testing.T) {
	ib, db := newFaultInbox(t, inbox.Config{MaxAttempts: 1}, faulttest.PostgresLike, nil)
	const n = 32
	var msgs []inbox.Message
	for i := range n {
		msgs = append(msgs, msg(fmt.Sprintf("m%02d", i)))
	}
	poisonous := map[string]bool{"m05": true, "m06": true, "m27": true}
	errPoison := errors.New("poison")
	calls := 0
	var seen [][]inbox.Outcome
	h := func(ctx context.Context, tx *gorm.DB, batch []inbox.Message) error {
		calls++
		for _, m := range batch {
			if m.ID == "m27" {
				panic("m27 breaks the handler")
			}
			if poisonous[m.ID] {
				return fmt.Errorf("%s: %w", m.ID, errPoison)
			}
		}
		return setEffect(ctx, tx, batch)
	}
	results, err := runEngine(t.Context(), ib, msgs, nil, h, batchopt.Options[inbox.Outcome]{BeforeCommit: func(_ context.Context, _ *gorm.DB, o []inbox.Outcome) error {
		seen = append(seen, slices.Clone(o))
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		switch id := msgs[i].ID; {
		case id == "m27":
			var pe *inbox.PanicError
			if r.Outcome != inbox.Failed || !errors.As(r.Err, &pe) {
				t.Errorf("%s: %v %v, want a PanicError", id, r.Outcome, r.Err)
			}
		case poisonous[id]:
			if r.Outcome != inbox.Failed || !errors.Is(r.Err, errPoison) {
				t.Errorf("%s: %v %v, want the poison", id, r.Outcome, r.Err)
			}
		case r.Outcome != inbox.Processed:
			t.Errorf("%s: %v %v, want Processed", id, r.Outcome, r.Err)
		}
	}
	if got := countRows(t, db, "effects"); got != n-3 {
		t.Errorf("%d effects, want %d", got, n-3)
	}
	if calls > 1+3*2*5 {
		t.Errorf("%d handler calls to isolate 3 poisons among %d, want at most %d", calls, n, 1+3*2*5)
	}
	// Each commit saw the messages committed before it as done, in order.
	last := seen[len(seen)-1]
	for i, o := range last {
		if want := results[i].Outcome; o != want {
			t.Errorf("the last commit saw %s as %v, want %v", msgs[i].ID, o, want)
		}
	}
	t.Logf("%d handler calls, %d commits", calls, len(seen))
}
