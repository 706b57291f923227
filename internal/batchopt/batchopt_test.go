package batchopt

import (
	"context"
	"testing"
)

// Lookup hands back the engine Register recorded, with its options, and
// refuses types other than those registered.
func TestLookupFindsTheRegisteredEngine(t *testing.T) {
	type outcome int
	saved := registered
	t.Cleanup(func() { registered = saved })
	var got Options[outcome]
	Register(func(_ context.Context, ib *int, msgs []string, _, _ func(), opts Options[outcome]) ([]bool, error) {
		got = opts
		return make([]bool, len(msgs)+*ib), nil
	})
	run := Lookup[*int, string, func(), func(), bool, outcome]()
	two := 2
	rs, err := run(t.Context(), &two, []string{"a"}, nil, nil, Options[outcome]{CallerRetries: true})
	if err != nil || len(rs) != 3 || !got.CallerRetries {
		t.Fatalf("engine call = %d results, %v, options %+v; want 3 results and the options passed", len(rs), err, got)
	}
	defer func() {
		if recover() == nil {
			t.Error("Lookup with other types than registered did not panic")
		}
	}()
	Lookup[*int, string, func(), func(), bool, int]()
}
