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

// timeClaim runs claim and notes how long it took when it found rows.
func (t *relayTimes) timeClaim(claim func() ([]storage.OutboxRow, error)) ([]storage.OutboxRow, error) {
	start := time.Now()
	rows, err := claim()
	if err == nil && len(rows) > 0 {
		t.claim.add(time.Since(start))
	}
	return rows, err
}

// timeClaimSource is timeClaim for a storage.SourceClaimer's claim.
func (t *relayTimes) timeClaimSource(claim func() ([]storage.OutboxRow, string, int64, error)) ([]storage.OutboxRow, string, int64, error) {
	var id string
	var epoch int64
	rows, err := t.timeClaim(func() (rows []storage.OutboxRow, err error) {
		rows, id, epoch, err = claim()
		return rows, err
	})
	return rows, id, epoch, err
}

// timeMark runs mark and notes how long it took when it succeeded.
func (t *relayTimes) timeMark(mark func() error) error {
	start := time.Now()
	err := mark()
	if err == nil {
		t.mark.add(time.Since(start))
	}
	return err
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
	return s.t.timeClaim(func() ([]storage.OutboxRow, error) { return s.OutboxStore.Claim(ctx, db, req) })
}

func (s timedPostgresOutbox) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	return s.t.timeClaimSource(func() ([]storage.OutboxRow, string, int64, error) { return s.OutboxStore.ClaimSource(ctx, db, req) })
}

func (s timedPostgresOutbox) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	return s.t.timeMark(func() error { return s.OutboxStore.Ack(ctx, db, relay, marks) })
}

type timedMySQLOutbox struct {
	*inboxmysql.OutboxStore
	t *relayTimes
}

func (s timedMySQLOutbox) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	return s.t.timeClaim(func() ([]storage.OutboxRow, error) { return s.OutboxStore.Claim(ctx, db, req) })
}

func (s timedMySQLOutbox) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	return s.t.timeClaimSource(func() ([]storage.OutboxRow, string, int64, error) { return s.OutboxStore.ClaimSource(ctx, db, req) })
}

func (s timedMySQLOutbox) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	return s.t.timeMark(func() error { return s.OutboxStore.Ack(ctx, db, relay, marks) })
}

type timedSQLiteOutbox struct {
	*inboxsqlite.OutboxStore
	t *relayTimes
}

func (s timedSQLiteOutbox) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	return s.t.timeClaim(func() ([]storage.OutboxRow, error) { return s.OutboxStore.Claim(ctx, db, req) })
}

func (s timedSQLiteOutbox) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	return s.t.timeClaimSource(func() ([]storage.OutboxRow, string, int64, error) { return s.OutboxStore.ClaimSource(ctx, db, req) })
}

func (s timedSQLiteOutbox) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	return s.t.timeMark(func() error { return s.OutboxStore.Ack(ctx, db, relay, marks) })
}
