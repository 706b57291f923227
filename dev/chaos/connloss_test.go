package chaos_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/inbox"
)

// TestConnectionLossClassification kills the connection of an inbox
// transaction from the server side (PostgreSQL: pg_terminate_backend;
// MariaDB: KILL CONNECTION), in the middle of the handler and just before
// COMMIT, and reports how the error is classified: retried by the inbox
// (Store.IsRetryable) and treated by the consumer as a database failure
// (retried without limit) or as the message's failure (counted against
// MaxAttempts, then the failure policy). It asserts that nothing commits
// twice, and that the inbox retried the transaction on a fresh connection
// (docs/RELIABILITY.md, finding 1: PostgreSQL's 57P01 used not to be
// retried).
func TestConnectionLossClassification(t *testing.T) {
	for _, db := range []struct {
		dialect string
		dsn     func(testing.TB) string
		self    string // the session's id
		kill    string // %d: that id
	}{
		{"postgres", testservers.PostgresDSN, "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(%d)"},
		{"mysql", testservers.MySQLDSN, "SELECT CONNECTION_ID()", "KILL CONNECTION %d"},
	} {
		t.Run(db.dialect, func(t *testing.T) {
			b := inventory.Backend{Dialect: db.dialect, DSN: db.dsn(t), RunID: fmt.Sprintf("cl%d", time.Now().UnixNano()%1e9)}
			gdb, store, err := b.Open()
			if err != nil {
				t.Fatal(err)
			}
			admin, _, err := b.Open()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ib, err := inbox.New(gdb, store, inbox.Config{MaxAttempts: 3, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = gdb.Migrator().DropTable(b.InboxTable()) })

			for i, moment := range []string{"mid-handler", "before-commit"} {
				calls := 0
				h := func(ctx context.Context, tx *gorm.DB, _ inbox.Message) error {
					calls++
					if calls > 1 {
						return nil
					}
					var id int64
					if err := tx.Raw(db.self).Scan(&id).Error; err != nil {
						return err
					}
					if err := admin.WithContext(ctx).Exec(fmt.Sprintf(db.kill, id)).Error; err != nil {
						return fmt.Errorf("kill: %w", err)
					}
					time.Sleep(200 * time.Millisecond)
					if moment == "mid-handler" {
						return tx.Exec("SELECT 1").Error
					}
					return nil
				}
				msg := inbox.Message{Consumer: "c", ID: fmt.Sprintf("conn-loss-%d", i), Time: time.Now()}
				out, err := ib.Process(ctx, msg, h)
				t.Logf("%s, connection killed %s: outcome %v after %d handler calls; error %v", db.dialect, moment, out, calls, err)
				if err != nil {
					// A lost connection is the database's failure: the
					// inbox must retry it on a fresh connection.
					t.Errorf("    %s: the inbox gave up (Store.IsRetryable = %v; consumer treats as database failure = %v; %s)",
						db.dialect, ib.IsRetryable(err), consumerInfrastructure(err), describe(err))
				}
				again, err2 := ib.Process(ctx, msg, func(context.Context, *gorm.DB, inbox.Message) error { return nil })
				if err2 != nil {
					t.Fatalf("second delivery: %v", err2)
				}
				if (err == nil) == (again == inbox.Processed) {
					t.Fatalf("first delivery: %v, %v; second delivery %v: the message was applied twice or never", out, err, again)
				}
			}
		})
	}
}

// consumerInfrastructure is the consumer's rule (consumer/failure.go,
// worker.infrastructure) for errors that do not use up a message's
// attempts.
func consumerInfrastructure(err error) bool { return inbox.IsDatabaseFailure(err) }

func describe(err error) string {
	var pe *pgconn.PgError
	var me *gomysql.MySQLError
	var ne net.Error
	switch {
	case errors.As(err, &pe):
		return fmt.Sprintf("*pgconn.PgError SQLSTATE %s (%s)", pe.Code, pe.Message)
	case errors.As(err, &me):
		return fmt.Sprintf("*mysql.MySQLError %d (%s)", me.Number, me.Message)
	case errors.Is(err, gomysql.ErrInvalidConn):
		return "mysql.ErrInvalidConn"
	case errors.Is(err, driver.ErrBadConn):
		return "driver.ErrBadConn"
	case errors.As(err, &ne):
		return fmt.Sprintf("net.Error %T", ne)
	}
	chain := ""
	for e := err; e != nil; e = errors.Unwrap(e) {
		chain += fmt.Sprintf(" %T", e)
	}
	return "error chain:" + chain
}
