package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// claimChunk rows per INSERT: 7 bind parameters each, far below PostgreSQL's
// limit of 65535 per statement.
const claimChunk = 1000

// Claim inserts rows with INSERT ... ON CONFLICT (consumer, event_id, day) DO
// NOTHING RETURNING the keys of the inserted rows, which come back in no
// particular order and are matched to rows by key. It never raises a unique
// violation, so the caller's transaction stays usable.
func (s *Store) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	inserted, err := s.claim(ctx, tx, rows)
	return inserted, claimError(err)
}

func (s *Store) claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	if len(rows) == 1 {
		return s.claimOne(ctx, tx, rows[0])
	}
	// Each row's insert waits for a concurrent uncommitted insert of the
	// same key; two claims that reach shared keys in different orders
	// deadlock (40P01, found only after deadlock_timeout). In key order,
	// the later one waits for the earlier one instead.
	sorted, order := adapterkit.SortRows(rows)
	inserted := make([]bool, len(rows))
	arrays := pgxArrays(tx)
	for lo := 0; lo < len(sorted); lo += claimChunk {
		hi := min(lo+claimChunk, len(sorted))
		claim := s.claimChunk
		if arrays {
			claim = s.claimArrays
		}
		if err := claim(ctx, tx, sorted[lo:hi], inserted[lo:hi]); err != nil {
			return nil, err
		}
	}
	return adapterkit.Unsort(order, inserted), nil
}

// claimOne claims a single row with one statement sent on the transaction's
// connection as it is, bypassing GORM's statement building and result
// scanning (their cost is of the order of the statement's own on a fast
// server): an INSERT whose affected-row count says whether the row was new.
// ON CONFLICT DO NOTHING affects 0 rows only on a conflict; any other
// reason not to store the row is an error.
func (s *Store) claimOne(ctx context.Context, tx *gorm.DB, r storage.InboxRow) ([]bool, error) {
	res, err := tx.Statement.ConnPool.ExecContext(ctx, s.claimOneSQL,
		r.Consumer, r.EventID, dayText(r.Day), r.EventTime.UTC(), r.Topic, r.Partition, r.Offset)
	if err != nil {
		return nil, fmt.Errorf("postgres: claim in %s: %w", s.parent(), err)
	}
	n, err := res.RowsAffected()
	if err != nil || n > 1 {
		return nil, fmt.Errorf("postgres: claim in %s: %d rows affected (%v)", s.parent(), n, err)
	}
	return []bool{n == 1}, nil
}

// pgxArrays reports whether tx runs on pgx's database/sql driver (the
// default of gorm.io/driver/postgres), which binds Go slices as PostgreSQL
// arrays. Other drivers (lib/pq) take the generic multi-row VALUES path.
func pgxArrays(tx *gorm.DB) bool {
	d, ok := tx.Dialector.(*gormpg.Dialector)
	if !ok || d.Config == nil {
		return false
	}
	switch conn := d.Conn.(type) {
	case nil:
		return d.DriverName == "" || d.DriverName == "pgx"
	case *sql.DB:
		_, isPgx := conn.Driver().(*stdlib.Driver)
		return isPgx
	}
	return false
}

// claimArrays claims rows (in key order) with one statement whose text does
// not depend on the number of rows: each column travels as one array
// parameter and is unnested on the server. Sent on the transaction's
// connection as it is, and scanned without GORM.
func (s *Store) claimArrays(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow, inserted []bool) error {
	got, err := tx.Statement.ConnPool.QueryContext(ctx, s.claimArraysSQL, arrayArgs(rows)...)
	if err != nil {
		return fmt.Errorf("postgres: claim in %s: %w", s.parent(), err)
	}
	defer got.Close()
	if err := markReturned(got, rows, inserted); err != nil {
		return fmt.Errorf("postgres: claim in %s: %w", s.parent(), err)
	}
	return nil
}

// arrayArgs are the seven array parameters of claimArraysSQL for rows, in
// their order (the caller puts them in key order).
func arrayArgs(rows []storage.InboxRow) []any {
	n := len(rows)
	consumers, ids, days, topics := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	times, partitions, offsets := make([]time.Time, n), make([]int32, n), make([]int64, n)
	for i, r := range rows {
		consumers[i], ids[i], days[i], topics[i] = r.Consumer, r.EventID, dayText(r.Day), r.Topic
		times[i], partitions[i], offsets[i] = r.EventTime.UTC(), r.Partition, r.Offset
	}
	return []any{consumers, ids, days, times, topics, partitions, offsets}
}

// keyRows are the rows RETURNING gives back, from database/sql or from pgx.
type keyRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// markReturned sets inserted[i] for each row of rows whose key got
// returns, and fails on a key that was not sent or comes twice.
func markReturned(got keyRows, rows []storage.InboxRow, inserted []bool) error {
	index := make(map[returnedKey]int, len(rows))
	for i, r := range rows {
		index[returnedKey{r.Consumer, r.EventID, dayText(r.Day)}] = i
	}
	for got.Next() {
		var k returnedKey
		if err := got.Scan(&k.Consumer, &k.EventID, &k.Day); err != nil {
			return err
		}
		i, ok := index[k]
		if !ok || inserted[i] {
			return fmt.Errorf("returned a key that was not inserted: %q/%q/%s", k.Consumer, k.EventID, k.Day)
		}
		inserted[i] = true
	}
	return got.Err()
}

type returnedKey struct {
	Consumer string
	EventID  string
	Day      string
}

func (s *Store) buildClaimSQL() {
	insert := `INSERT INTO ` + s.parent() + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) `
	onConflict := ` ON CONFLICT (consumer, event_id, day) DO NOTHING`
	s.claimOneSQL = insert + `VALUES ($1, $2, $3::date, $4, $5, $6, $7)` + onConflict
	s.claimArraysSQL = insert + `SELECT * FROM unnest($1::text[], $2::text[], $3::date[], $4::timestamptz[], $5::text[], $6::integer[], $7::bigint[])` +
		onConflict + ` RETURNING consumer, event_id, to_char(day, 'YYYY-MM-DD')`
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

func (s *Store) claimChunk(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow, inserted []bool) error {
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
