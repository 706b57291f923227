package mysql

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// claimChunk bounds the rows of one INSERT: 8 placeholders a row, far below
// the protocol's 65,535, and well under the default max_allowed_packet.
const claimChunk = 1000

// Claim inserts rows with INSERT ... ON DUPLICATE KEY UPDATE deliveries =
// deliveries + 1 and tells new rows from duplicates by the affected-row
// count (1 per inserted row, 2 per duplicate, with or without
// clientFoundRows), reading back this statement's claim token by primary key
// only when one statement holds both kinds.
func (s *Store) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	if err := s.checkClaim(rows); err != nil {
		return nil, err
	}
	// The statements go straight to the transaction's connection: GORM
	// would rewrite the SQL (a []byte bound right after "(" becomes one
	// placeholder per byte; "@" starts a named parameter).
	conn := tx.Statement.ConnPool
	// Under gorm.Config{PrepareStmt: true} every distinct statement would be
	// prepared and cached per connection, one per batch size: a few thousand
	// per connection against the server's max_prepared_stmt_count.
	switch p := conn.(type) {
	case *gorm.PreparedStmtTX:
		conn = p.Tx
	case *gorm.PreparedStmtDB:
		conn = p.ConnPool
	}
	if conn == nil {
		return nil, fmt.Errorf("mysql: claim in %s: the *gorm.DB has no connection", s.name)
	}
	return s.claimOn(ctx, conn, rows)
}

// checkClaim refuses rows the table cannot hold exactly, and rows of a day
// the Store knows has no partition, before any statement runs.
func (s *Store) checkClaim(rows []storage.InboxRow) error {
	for i := range rows {
		if err := checkRow(rows[i]); err != nil {
			return fmt.Errorf("mysql: claim in %s, row %d: %w", s.name, i, err)
		}
	}
	return s.missingDay(rows)
}

// claimOn claims rows, checked by checkClaim, on conn.
func (s *Store) claimOn(ctx context.Context, conn gorm.ConnPool, rows []storage.InboxRow) ([]bool, error) {
	// InnoDB locks each row's key as the statement reaches it; two claims
	// that reach shared keys in different orders deadlock (1213). In key
	// order, the later one waits for the earlier one instead.
	sorted, order := adapterkit.SortRows(rows)
	inserted := make([]bool, len(rows))
	for lo := 0; lo < len(sorted); lo += claimChunk {
		hi := min(lo+claimChunk, len(sorted))
		if err := s.claimChunk(ctx, conn, sorted[lo:hi], inserted[lo:hi]); err != nil {
			return nil, err
		}
	}
	return adapterkit.Unsort(order, inserted), nil
}

// checkRow rejects what the table cannot hold exactly, so that no value is
// ever truncated or adjusted by the server, whatever its sql_mode.
func checkRow(r storage.InboxRow) error {
	switch {
	case r.Consumer == "" || len(r.Consumer) > storage.MaxConsumerBytes:
		return fmt.Errorf("%w: consumer of %d bytes (1..%d allowed)", inbox.ErrInvalidMessage, len(r.Consumer), storage.MaxConsumerBytes)
	case r.EventID == "" || len(r.EventID) > storage.MaxEventIDBytes:
		return fmt.Errorf("%w: event id of %d bytes (1..%d allowed)", inbox.ErrInvalidMessage, len(r.EventID), storage.MaxEventIDBytes)
	case len(r.Topic) > topicColumnBytes:
		return fmt.Errorf("%w: topic of %d bytes (at most %d allowed)", inbox.ErrInvalidMessage, len(r.Topic), topicColumnBytes)
	case !utf8.ValidString(r.Consumer) || !utf8.ValidString(r.EventID):
		return fmt.Errorf("%w: consumer or event id is not valid UTF-8", inbox.ErrInvalidMessage)
	case !inRange(r.Day) || !inRange(r.EventTime):
		return fmt.Errorf("%w: day %s or event time %s outside the years 1000..9999", inbox.ErrInvalidMessage,
			r.Day.UTC().Format(time.DateOnly), r.EventTime.UTC().Format(time.RFC3339Nano))
	case !storage.DayOf(r.Day).Equal(r.Day):
		return fmt.Errorf("%w: day %s is not midnight UTC", inbox.ErrInvalidMessage, r.Day.Format(time.RFC3339Nano))
	}
	return nil
}

func inRange(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1000 && y <= 9999
}

func dayText(d time.Time) string { return d.UTC().Format(time.DateOnly) }

// datetimeText formats t for a DATETIME(6) column, in UTC whatever the
// DSN's loc: the driver would convert a time.Time to loc.
func datetimeText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.999999") }

func (s *Store) claimChunk(ctx context.Context, conn gorm.ConnPool, rows []storage.InboxRow, inserted []bool) error {
	// The token tells this statement's rows from rows that were there
	// before; it only has to differ from the token of the one stored row
	// with the same key.
	token := rand.Int64()
	args := make([]any, 0, 8*len(rows))
	for _, r := range rows {
		// Byte slices go to the server as binary strings (with
		// interpolateParams as _binary'...'): no charset conversion.
		args = append(args, []byte(r.Consumer), []byte(r.EventID), dayText(r.Day), datetimeText(r.EventTime),
			[]byte(r.Topic), r.Partition, r.Offset, token)
	}
	res, err := conn.ExecContext(ctx, s.claimSQL(len(rows)), args...)
	if err != nil {
		if s.IsMissingDay(err) {
			s.forgetDays(rows)
		}
		return fmt.Errorf("mysql: claim in %s: %w", s.name, err)
	}
	affected, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("mysql: claim in %s: %w", s.name, err)
	}
	n := int64(len(rows))
	// Every row is either inserted (1) or updated (2): deliveries always
	// changes, so clientFoundRows makes no difference.
	fresh := 2*n - affected
	if fresh < 0 || fresh > n {
		return fmt.Errorf("mysql: claim in %s: %d rows affected for %d rows, want %d..%d", s.name, affected, n, n, 2*n)
	}
	switch fresh {
	case n:
		for i := range inserted {
			inserted[i] = true
		}
		return nil
	case 0:
		return nil
	}
	return s.readBack(ctx, conn, rows, inserted, token, fresh)
}

// claimSQL is the claim of n rows. The one-row statement, Process's, is
// built once.
func (s *Store) claimSQL(n int) string {
	if n == 1 && s.claimOne != "" {
		return s.claimOne
	}
	return s.buildClaimSQL(n)
}

func (s *Store) buildClaimSQL(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.table + " (consumer, event_id, day, event_time, topic, partition_no, offset_no, claim_token, processed_at) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))")
	}
	b.WriteString(" ON DUPLICATE KEY UPDATE deliveries = deliveries + 1")
	return b.String()
}

type rowKey struct{ consumer, eventID, day string }

// readBack marks the rows that hold this statement's token.
func (s *Store) readBack(ctx context.Context, conn gorm.ConnPool, rows []storage.InboxRow, inserted []bool, token, fresh int64) error {
	var b strings.Builder
	b.WriteString("SELECT consumer, event_id, CAST(day AS CHAR) FROM " + s.table + " WHERE claim_token = ? AND (consumer, event_id, day) IN (")
	args := make([]any, 0, 1+3*len(rows))
	args = append(args, token)
	index := make(map[rowKey]int, len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?)")
		args = append(args, []byte(r.Consumer), []byte(r.EventID), dayText(r.Day))
		index[rowKey{r.Consumer, r.EventID, dayText(r.Day)}] = i
	}
	b.WriteString(")")
	found, err := conn.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return fmt.Errorf("mysql: claim in %s: read back inserted rows: %w", s.name, err)
	}
	defer found.Close()
	var seen int64
	for found.Next() {
		var consumer, id []byte
		var day string
		if err := found.Scan(&consumer, &id, &day); err != nil {
			return fmt.Errorf("mysql: claim in %s: read back inserted rows: %w", s.name, err)
		}
		i, ok := index[rowKey{string(consumer), string(id), day}]
		if !ok || inserted[i] {
			return fmt.Errorf("mysql: claim in %s: read back a key this claim did not send: %q/%q/%s", s.name, consumer, id, day)
		}
		inserted[i] = true
		seen++
	}
	if err := found.Err(); err != nil {
		return fmt.Errorf("mysql: claim in %s: read back inserted rows: %w", s.name, err)
	}
	if seen != fresh {
		return fmt.Errorf("mysql: claim in %s: the server counted %d inserted rows, %d hold the claim token", s.name, fresh, seen)
	}
	return nil
}
