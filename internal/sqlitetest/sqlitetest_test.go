package sqlitetest_test

import (
	"context"
	"path/filepath"
	"testing"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/internal/sqlitetest"
)

// The store the package's tests use keeps the storage contract: it passes
// the adapters' conformance suite (its inbox, watermark and offsets checks).
func TestConformance(t *testing.T) {
	conformance.Run(t, func(ctx context.Context) (*conformance.Harness, error) {
		path := filepath.Join(t.TempDir(), "inbox.db")
		db, err := sqlitetest.OpenPath(path)
		if err != nil {
			return nil, err
		}
		return &conformance.Harness{
			DB:       db,
			Store:    &sqlitetest.Store{},
			Open:     func(context.Context) (*gorm.DB, error) { return sqlitetest.OpenPath(path) },
			Features: conformance.Features{ExpiryCountsRows: true, Watermarks: true, Offsets: true},
			Close: func() error {
				sqlDB, err := db.DB()
				if err != nil {
					return err
				}
				return sqlDB.Close()
			},
		}, nil
	})
}
