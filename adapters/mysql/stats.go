package mysql

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Stats counts rows per consumer and day (a full scan).
func (s *Store) Stats(ctx context.Context, db *gorm.DB) ([]storage.DayStats, error) {
	rows, err := db.WithContext(ctx).Raw("SELECT consumer, CAST(day AS CHAR), COUNT(*) FROM " + s.table + " GROUP BY consumer, day ORDER BY consumer, day").Rows()
	if err != nil {
		return nil, fmt.Errorf("mysql: stats of %s: %w", s.name, err)
	}
	defer rows.Close()
	var out []storage.DayStats
	for rows.Next() {
		var consumer []byte
		var day string
		var n int64
		if err := rows.Scan(&consumer, &day, &n); err != nil {
			return nil, fmt.Errorf("mysql: stats of %s: %w", s.name, err)
		}
		d, err := time.Parse(time.DateOnly, day)
		if err != nil {
			return nil, fmt.Errorf("mysql: %s holds a malformed day %q: %w", s.name, day, err)
		}
		out = append(out, storage.DayStats{Consumer: string(consumer), Day: d, Rows: n})
	}
	return out, rows.Err()
}
