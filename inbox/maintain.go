package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// Plan returns the maintenance plan for the current day: prepare today
// through PrepareDays ahead, and expire the days before the retention window
// less one day of grace. The grace day keeps rows a little longer than
// Process relies on them, so a clock that differs between the processes that
// Process and the one that Maintains (by less than a day) never removes a
// row that is still being checked.
func (ib *Inbox) Plan() storage.MaintenancePlan {
	today := storage.DayOf(ib.cfg.Now())
	return storage.MaintenancePlan{
		Today:          today,
		PrepareThrough: today.AddDate(0, 0, ib.cfg.PrepareDays),
		ExpireBefore:   ib.oldestCheckedDay(ib.cfg.Now()).AddDate(0, 0, -1),
	}
}

// Maintain prepares storage for the coming days and removes expired days,
// following [Inbox.Plan]. Run it once a day or more often (see
// [Inbox.RunMaintenance]); it is idempotent and safe while messages are
// processed.
func (ib *Inbox) Maintain(ctx context.Context) (storage.MaintenanceReport, error) {
	return ib.MaintainPlan(ctx, ib.Plan())
}

// MaintainPlan runs maintenance for an explicit plan; set plan.DryRun to see
// what would be done. A plan that would expire a day the inbox still checks
// duplicates on (ExpireBefore after the first day of the retention window,
// which is the day after [Inbox.Plan]'s ExpireBefore) is refused.
func (ib *Inbox) MaintainPlan(ctx context.Context, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	if plan.PrepareThrough.Before(plan.Today) {
		return storage.MaintenanceReport{}, fmt.Errorf("%w: maintenance plan prepares through %s, before today %s",
			ErrInvalidConfig, plan.PrepareThrough.Format(time.DateOnly), plan.Today.Format(time.DateOnly))
	}
	if oldest := ib.oldestCheckedDay(ib.cfg.Now()); plan.ExpireBefore.After(oldest) {
		return storage.MaintenanceReport{}, fmt.Errorf("%w: maintenance plan expires days before %s, but the inbox still checks duplicates from %s on",
			ErrInvalidConfig, plan.ExpireBefore.Format(time.DateOnly), oldest.Format(time.DateOnly))
	}
	var report storage.MaintenanceReport
	err := ib.retry(ctx, func(int) error {
		var err error
		report, err = ib.store.Maintain(ctx, ib.db.WithContext(ctx), plan)
		return txn.DatabaseFailure("maintain", err)
	})
	if err != nil {
		return report, fmt.Errorf("inbox: maintain: %w", err)
	}
	report.DryRun = plan.DryRun
	ib.log.Info("inbox maintenance done", "prepared", len(report.Prepared), "expired_days", len(report.Expired),
		"rows_removed", report.RowsRemoved, "dry_run", plan.DryRun)
	return report, nil
}

// RunMaintenance calls Maintain now and then every interval until ctx ends,
// logging failures; it returns ctx's error. Run it in one goroutine per
// process (running it in several processes is safe, only wasteful).
func (ib *Inbox) RunMaintenance(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: maintenance interval %v", ErrInvalidConfig, interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := ib.Maintain(ctx); err != nil && ctx.Err() == nil {
			ib.log.Error("inbox maintenance failed; will try again", "error", err, "next_in", interval)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
