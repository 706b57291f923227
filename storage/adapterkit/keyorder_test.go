package adapterkit

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/inboxgo/inbox/storage"
)

func TestSortAndUnsort(t *testing.T) {
	d := time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)
	want := []storage.InboxRow{ // in key order: bytewise, so "B" < "a" < "é" (0xC3) and "a" < "a "
		{Consumer: "A", EventID: "z", Day: d},
		{Consumer: "a", EventID: "B", Day: d},
		{Consumer: "a", EventID: "a", Day: d},
		{Consumer: "a", EventID: "a", Day: d.AddDate(0, 0, 1)},
		{Consumer: "a", EventID: "a ", Day: d},
		{Consumer: "a", EventID: "é", Day: d.AddDate(0, 0, -1)},
		{Consumer: "b", EventID: "a", Day: d},
	}
	if sorted, order := SortRows(want); order != nil || &sorted[0] != &want[0] {
		t.Errorf("rows in key order were copied: order %v", order)
	}
	for range 20 {
		rows := slices.Clone(want)
		rand.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
		given := slices.Clone(rows)
		sorted, order := SortRows(rows)
		if !slices.Equal(rows, given) {
			t.Fatal("Sort changed its argument")
		}
		if !slices.EqualFunc(sorted, want, func(a, b storage.InboxRow) bool { return a.Key() == b.Key() }) {
			t.Fatalf("SortRows(%v) = %v, want %v", rows, sorted, want)
		}
		// A result per sorted row: true for the rows of consumer "a".
		got := make([]bool, len(sorted))
		for k, r := range sorted {
			got[k] = r.Consumer == "a"
		}
		back := Unsort(order, got)
		for i, r := range rows {
			if back[i] != (r.Consumer == "a") {
				t.Fatalf("Unsort: result %d belongs to %v, got %v", i, r, back[i])
			}
		}
	}
}
