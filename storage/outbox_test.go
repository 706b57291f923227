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
