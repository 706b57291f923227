package bench

import (
	"context"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// relayTimes are how long the relay's claims that found rows and its marks
// took, each call whole (on MariaDB and SQLite its transaction, the wait
// for the write lock included): with the broker's write they make up the
// relay's cycle.
type relayTimes struct {
	claim, mark durations
}

func (t *relayTimes) claimed(start time.Time, rows int, err error) {
	if err == nil && rows > 0 {
		t.claim.add(time.Since(start))
	}
}

func (t *relayTimes) marked(start time.Time, err error) {
	if err == nil {
		t.mark.add(time.Since(start))
	}
}

// timed returns s with its claims and marks timed into t. Each adapter's
// store is wrapped by a type that embeds it, so the optional interfaces the
// relay looks for (storage.SourceClaimer, storage.Notifier,
// storage.Sequenced, ...) are those of the store itself.
func (t *relayTimes) timed(s storage.OutboxStore) storage.OutboxStore {
	switch s := s.(type) {
	case *inboxpg.OutboxStore:
		return timedPostgresOutbox{s, t}
	case *inboxmysql.OutboxStore:
		return timedMySQLOutbox{s, t}
	case *inboxsqlite.OutboxStore:
		return timedSQLiteOutbox{s, t}
	}
	return s
}

type timedPostgresOutbox struct {
	*inboxpg.OutboxStore
	t *relayTimes
}

func (s timedPostgresOutbox) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	start := time.Now()
	rows, err := s.OutboxStore.Claim(ctx, db, req)
	s.t.claimed(start, len(rows), err)
	return rows, err
}

func (s timedPostgresOutbox) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	start := time.Now()
	rows, id, epoch, err := s.OutboxStore.ClaimSource(ctx, db, req)
	s.t.claimed(start, len(rows), err)
	return rows, id, epoch, err
}

func (s timedPostgresOutbox) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	start := time.Now()
	err := s.OutboxStore.Ack(ctx, db, relay, marks)
	s.t.marked(start, err)
	return err
}

type timedMySQLOutbox struct {
	*inboxmysql.OutboxStore
	t *relayTimes
}

func (s timedMySQLOutbox) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	start := time.Now()
	rows, err := s.OutboxStore.Claim(ctx, db, req)
	s.t.claimed(start, len(rows), err)
	return rows, err
}

func (s timedMySQLOutbox) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	start := time.Now()
	err := s.OutboxStore.Ack(ctx, db, relay, marks)
	s.t.marked(start, err)
	return err
}

type timedSQLiteOutbox struct {
	*inboxsqlite.OutboxStore
	t *relayTimes
}

func (s timedSQLiteOutbox) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	start := time.Now()
	rows, err := s.OutboxStore.Claim(ctx, db, req)
	s.t.claimed(start, len(rows), err)
	return rows, err
}

func (s timedSQLiteOutbox) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	start := time.Now()
	err := s.OutboxStore.Ack(ctx, db, relay, marks)
	s.t.marked(start, err)
	return err
}
