package postgres

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
)

// partitionName returns the name of day's partition of table:
// <table>_pYYYYMMDD.
func partitionName(table string, day time.Time) string {
	return table + "_p" + day.UTC().Format("20060102")
}

// parsePartitionName returns the day of a partition named by partitionName
// for table, and false for any other name.
func parsePartitionName(table, name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, table+"_p")
	if !ok || len(rest) != len("20060102") {
		return time.Time{}, false
	}
	d, err := time.Parse("20060102", rest)
	if err != nil || d.Format("20060102") != rest {
		return time.Time{}, false
	}
	return d, true
}

// bounds returns the FOR VALUES clause of day's partition.
func bounds(day time.Time) string {
	return fmt.Sprintf(`FOR VALUES FROM ('%s') TO ('%s')`, dayText(day), dayText(day.AddDate(0, 0, 1)))
}

// maintenanceOps is what one Maintain call has to do, derived from the plan
// and the partitions that exist.
type maintenanceOps struct {
	create   []time.Time // days to give a partition, ascending
	drop     []time.Time // day partitions to detach and drop, ascending
	leftover []time.Time // expired days whose detached table is left to drop, ascending
}

// planOps decides which day partitions to create (the plan's days from Today
// through PrepareThrough that have none and are not expired) and which to
// drop (those of days before ExpireBefore). detached are the days of tables
// named like day partitions that are not attached (an interrupted expiry
// left them); those of expired days are dropped too.
func planOps(plan storage.MaintenancePlan, existing, detached []time.Time) maintenanceOps {
	var ops maintenanceOps
	expireBefore := storage.DayOf(plan.ExpireBefore)
	have := make(map[time.Time]bool, len(existing))
	for _, d := range existing {
		d = storage.DayOf(d)
		have[d] = true
		if d.Before(expireBefore) {
			ops.drop = append(ops.drop, d)
		}
	}
	last := storage.DayOf(plan.PrepareThrough)
	for d := storage.DayOf(plan.Today); !d.After(last); d = d.AddDate(0, 0, 1) {
		if !have[d] && !d.Before(expireBefore) {
			ops.create = append(ops.create, d)
		}
	}
	for _, d := range detached {
		if d = storage.DayOf(d); d.Before(expireBefore) && !have[d] {
			ops.leftover = append(ops.leftover, d)
		}
	}
	for _, s := range [][]time.Time{ops.create, ops.drop, ops.leftover} {
		slices.SortFunc(s, time.Time.Compare)
	}
	return ops
}

// expiredDays is the sorted union of the days whose rows ops removes.
func (ops maintenanceOps) expiredDays() []time.Time {
	days := slices.Concat(ops.drop, ops.leftover)
	slices.SortFunc(days, time.Time.Compare)
	return slices.CompactFunc(days, time.Time.Equal)
}
