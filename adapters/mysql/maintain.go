package mysql

import (
	"context"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Maintain prepares one partition per day from plan.Today through
// plan.PrepareThrough and removes the days before plan.ExpireBefore: one
// ADD PARTITION for the missing days and, per expired day, CONVERT
// PARTITION ... TO TABLE and DROP TABLE (see maintainList); each holds the
// table's metadata lock for a fixed time, whatever the days hold.
// RowsRemoved is -1 when a partition was removed. A run with nothing to do
// issues no DDL.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	if plan.DryRun {
		return s.maintain(db.WithContext(ctx), plan)
	}
	var report storage.MaintenanceReport
	err := s.withLock(ctx, db, func(conn *gorm.DB) error {
		var err error
		report, err = s.maintain(conn, plan)
		return err
	})
	return report, err
}

func (s *Store) maintain(db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	have, err := s.listLayout(db)
	if err != nil {
		return storage.MaintenanceReport{DryRun: plan.DryRun}, err
	}
	return s.maintainList(db, plan, have)
}
