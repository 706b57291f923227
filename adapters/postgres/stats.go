package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Stats counts rows per consumer and day. It scans the whole table.
func (s *Store) Stats(ctx context.Context, db *gorm.DB) ([]storage.DayStats, error) {
	var raw []struct {
		Consumer string
		Day      string
		N        int64
	}
	if err := db.WithContext(ctx).Raw(`SELECT consumer, to_char(day, 'YYYY-MM-DD') AS day, count(*) AS n FROM ` + s.parent() +
		` GROUP BY consumer, day ORDER BY consumer, day`).Scan(&raw).Error; err != nil {
		return nil, fmt.Errorf("postgres: stats of %s: %w", s.parent(), err)
	}
	out := make([]storage.DayStats, 0, len(raw))
	for _, r := range raw {
		d, err := time.Parse(time.DateOnly, r.Day)
		if err != nil {
			return nil, fmt.Errorf("postgres: malformed day %q: %w", r.Day, err)
		}
		out = append(out, storage.DayStats{Consumer: r.Consumer, Day: d, Rows: r.N})
	}
	return out, nil
}
