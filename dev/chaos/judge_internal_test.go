package chaos

import (
	"strings"
	"testing"

	"github.com/inboxgo/inbox/consumer"
)

// TestFaultJudge checks the fault phase's verdicts without servers: a round
// in which everything went right passes, and each way of going wrong is
// caught in its class's row.
func TestFaultJudge(t *testing.T) {
	newRound := func() *faultRound {
		rr := &faultRound{cfg: Config{Dialect: "sqlite"}, fc: FaultConfig{MaxAttempts: 3}, batch: 4, rep: &FaultReport{},
			classOf: map[string]FaultClass{}, qty: map[string]int64{}, partOf: map[string]int{}}
		rr.parts = len(rr.classes())
		for p, class := range rr.classes() {
			id := "order-" + string(class)
			rr.classOf[id], rr.qty[id], rr.partOf[id] = class, 2, p
		}
		return rr
	}
	// good is the outcome of a round that went right.
	good := func(rr *faultRound) outcome {
		o := outcome{apps: map[string]int64{}, deadLetters: map[string][]deadLetterSeen{}, sent: map[string]int{}, done: true}
		for id, class := range rr.classOf {
			o.sent[id] = 1
			if class.poison() {
				o.deadLetters[id] = []deadLetterSeen{{attempts: 3, reason: consumer.ReasonHandlerError}}
			} else {
				o.apps[id] = 1
				o.reserved += rr.qty[id]
			}
		}
		return o
	}
	rr := newRound()
	rr.judge(good(rr))
	if ps := rr.rep.Problems(); len(ps) != 0 || len(rr.rep.Rows) != len(rr.classes()) {
		t.Fatalf("a good round: %d rows, problems %v", len(rr.rep.Rows), ps)
	}

	for _, tc := range []struct {
		name  string
		spoil func(o *outcome)
		class FaultClass
		want  string
	}{
		{"healthy applied twice", func(o *outcome) { o.apps["order-healthy"] = 2; o.reserved += 2 }, Healthy, "applied 2 times"},
		{"healthy dead-lettered", func(o *outcome) {
			o.deadLetters["order-healthy"] = []deadLetterSeen{{attempts: 1, reason: consumer.ReasonHandlerError}}
		}, Healthy, "(not poison) dead-lettered"},
		{"stock off", func(o *outcome) { o.reserved++ }, Healthy, "stock reserved"},
		{"transient never applied, group done", func(o *outcome) { delete(o.apps, "order-net-transient") }, NetTransient, "lost"},
		{"poison applied", func(o *outcome) { o.apps["order-poison-empty"] = 1 }, PoisonEmpty, "was applied"},
		{"poison stuck", func(o *outcome) { delete(o.deadLetters, "order-net-permanent"); o.done = false }, NetPermanent, "stuck"},
		{"too many attempts", func(o *outcome) {
			o.deadLetters["order-handler-deadline"] = []deadLetterSeen{{attempts: 4, reason: consumer.ReasonHandlerError}}
		}, HandlerDeadline, "after 4 attempts"},
		{"wrong reason", func(o *outcome) {
			o.deadLetters["order-deferred-constraint"] = []deadLetterSeen{{attempts: 3, reason: consumer.ReasonInvalid}}
		}, DeferredConstraint, "with reason"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rr := newRound()
			o := good(rr)
			tc.spoil(&o)
			rr.judge(o)
			for _, row := range rr.rep.Rows {
				got := strings.Join(row.Problems, "; ")
				if row.Class == tc.class && !strings.Contains(got, tc.want) {
					t.Errorf("%s: problems %q, want one with %q", row.Class, got, tc.want)
				}
				if row.Class != tc.class && got != "" {
					t.Errorf("%s: unexpected problems %q", row.Class, got)
				}
			}
		})
	}
}
