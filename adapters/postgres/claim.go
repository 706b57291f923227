package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/keyorder"
)

// claimChunk rows per INSERT: 7 bind parameters each, far below PostgreSQL's
// limit of 65535 per statement.
const claimChunk = 1000

// Claim inserts rows with INSERT ... ON CONFLICT (consumer, event_id, day) DO
// NOTHING RETURNING the keys of the inserted rows, which come back in no
// particular order and are matched to rows by key. It never raises a unique
// violation, so the caller's transaction stays usable.
func (s *Store) Claim(ctx context.Context, tx *gorm.DB, rows []inbox.Row) ([]bool, error) {
	// Each row's insert waits for a concurrent uncommitted insert of the
	// same key; two claims that reach shared keys in different orders
	// deadlock (40P01, found only after deadlock_timeout). In key order,
	// the later one waits for the earlier one instead.
	sorted, order := keyorder.Sort(rows)
	inserted := make([]bool, len(rows))
	for lo := 0; lo < len(sorted); lo += claimChunk {
		hi := min(lo+claimChunk, len(sorted))
		if err := s.claimChunk(ctx, tx, sorted[lo:hi], inserted[lo:hi]); err != nil {
			return nil, err
		}
	}
	return keyorder.Unsort(order, inserted), nil
}

type returnedKey struct {
	Consumer string
	EventID  string
	Day      string
}

func (s *Store) claimSQL(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + s.parent() + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?::date, ?, ?, ?, ?)")
	}
	b.WriteString(` ON CONFLICT (consumer, event_id, day) DO NOTHING RETURNING consumer, event_id, to_char(day, 'YYYY-MM-DD') AS day`)
	return b.String()
}

func (s *Store) claimChunk(ctx context.Context, tx *gorm.DB, rows []inbox.Row, inserted []bool) error {
	args := make([]any, 0, 7*len(rows))
	index := make(map[returnedKey]int, len(rows))
	for i, r := range rows {
		day := dayText(r.Day)
		args = append(args, r.Consumer, r.EventID, day, r.EventTime.UTC(), r.Topic, r.Partition, r.Offset)
		index[returnedKey{r.Consumer, r.EventID, day}] = i
	}
	var got []returnedKey
	if err := tx.WithContext(ctx).Raw(s.claimSQL(len(rows)), args...).Scan(&got).Error; err != nil {
		return fmt.Errorf("postgres: claim in %s: %w", s.parent(), err)
	}
	for _, k := range got {
		i, ok := index[k]
		if !ok || inserted[i] {
			return fmt.Errorf("postgres: claim in %s returned a key that was not inserted: %q/%q/%s", s.parent(), k.Consumer, k.EventID, k.Day)
		}
		inserted[i] = true
	}
	return nil
}

// dayText formats the UTC calendar day of d as a date literal that
// PostgreSQL reads the same under every DateStyle.
func dayText(d time.Time) string { return d.UTC().Format(time.DateOnly) }
