package storage

import "testing"

func TestShareRows(t *testing.T) {
	got := ShareRows([]ShardCount{{Shard: 1, Rows: 1000}, {Shard: 2, Rows: 3}, {Shard: 3, Rows: 0}, {Shard: 4, Rows: 50}}, 100)
	want := []ShardCount{{Shard: 1, Rows: 49}, {Shard: 2, Rows: 3}, {Shard: 4, Rows: 48}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if got := ShareRows([]ShardCount{{Shard: 1, Rows: 5}, {Shard: 2, Rows: 5}, {Shard: 3, Rows: 5}}, 2); len(got) != 2 || got[0] != (ShardCount{Shard: 1, Rows: 1}) || got[1] != (ShardCount{Shard: 2, Rows: 1}) {
		t.Fatalf("fewer rows than shards: %v", got)
	}
}

func TestSourceIDs(t *testing.T) {
	a, b := NewSourceID(), NewSourceID()
	if a == b || len(a) != 32 {
		t.Fatalf("source ids %q and %q", a, b)
	}
	for _, id := range []string{a, "3f2b8c1e-9d4a-4e7b-8c2d-1a2b3c4d5e6f", "orders.eu-1:blue_2", "x"} {
		if err := ValidSource(id); err != nil {
			t.Errorf("ValidSource(%q): %v", id, err)
		}
	}
	long := make([]byte, MaxSourceBytes+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, id := range []string{"", string(long), "a b", "ü", "a\x00", "a/b"} {
		if err := ValidSource(id); err == nil {
			t.Errorf("ValidSource(%q) accepted it", id)
		}
	}
}
