package adapterkit

import (
	"slices"
	"strings"

	"github.com/inboxgo/inbox/storage"
)

// CompareKeys compares the keys of a and b as the adapters' key indexes
// order them: consumer, then event id, both bytewise (VARBINARY on MySQL,
// COLLATE "C" on PostgreSQL), then day.
func CompareKeys(a, b storage.InboxRow) int {
	if c := strings.Compare(a.Consumer, b.Consumer); c != 0 {
		return c
	}
	if c := strings.Compare(a.EventID, b.EventID); c != 0 {
		return c
	}
	return a.Day.Compare(b.Day)
}

// SortRows puts the rows of a claim in key order (CompareKeys), so that
// every claim takes its row locks in one global order: two claims that
// reach shared keys in different orders deadlock. It returns the sorted
// rows, and order, where order[k] is the index in rows of the k-th sorted
// row; order is nil when rows are in key order already, and then sorted is
// rows itself. rows is not changed.
func SortRows(rows []storage.InboxRow) (sorted []storage.InboxRow, order []int) {
	if slices.IsSortedFunc(rows, CompareKeys) {
		return rows, nil
	}
	order = make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return CompareKeys(rows[a], rows[b]) })
	sorted = make([]storage.InboxRow, len(rows))
	for k, i := range order {
		sorted[k] = rows[i]
	}
	return sorted, order
}

// Unsort returns got, which holds one result per sorted row, in the order of
// the rows given to SortRows: Unsort(order, got)[i] belongs to rows[i].
func Unsort(order []int, got []bool) []bool {
	if order == nil {
		return got
	}
	out := make([]bool, len(got))
	for k, i := range order {
		out[i] = got[k]
	}
	return out
}
