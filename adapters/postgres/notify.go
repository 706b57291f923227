package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// Channel returns the name of the channel on which Append notifies the
// relays (storage.Notifier): one per outbox table, derived from its schema
// and name.
func (s *OutboxStore) Channel() string {
	return "inbox_outbox_" + strconv.FormatUint(uint64(s.tbl.lockKey), 16)
}

// Listen opens a pgx connection with the settings of a connection of db's
// pool (it needs pgx's database/sql driver, as gorm.io/driver/postgres
// uses), outside the pool, and LISTENs on Channel.
func (s *OutboxStore) Listen(ctx context.Context, db *gorm.DB) (storage.Listener, error) {
	pool, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("postgres: listen for %s: %w", s.parent(), err)
	}
	if _, ok := pool.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("postgres: listen for %s: needs pgx's database/sql driver, got %T", s.parent(), pool.Driver())
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("postgres: listen for %s: take a connection for its settings: %w", s.parent(), err)
	}
	var cfg *pgx.ConnConfig
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("not a pgx connection: %T", dc)
		}
		cfg = c.Conn().Config().Copy()
		return nil
	})
	_ = conn.Close()
	if err != nil {
		return nil, fmt.Errorf("postgres: listen for %s: %w", s.parent(), err)
	}
	pc, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: listen for %s: connect: %w", s.parent(), err)
	}
	if _, err := pc.Exec(ctx, "LISTEN "+quoteIdent(s.Channel())); err != nil {
		closeConn(pc)
		return nil, fmt.Errorf("postgres: listen for %s: %w", s.parent(), err)
	}
	return &listener{c: pc, table: s.parent()}, nil
}

type listener struct {
	c     *pgx.Conn
	table string
}

func (l *listener) Wait(ctx context.Context) error {
	if l.c.IsClosed() {
		return fmt.Errorf("postgres: the listening connection for %s is closed", l.table)
	}
	if _, err := l.c.WaitForNotification(ctx); err != nil {
		closeConn(l.c)
		if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		return fmt.Errorf("postgres: the listening connection for %s: %w", l.table, err)
	}
	return nil
}

func (l *listener) Close() error {
	closeConn(l.c)
	return nil
}

// closeConn closes c, giving up on a goodbye the server does not take.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

var _ storage.Notifier = (*OutboxStore)(nil)
