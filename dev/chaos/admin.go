package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/inventory"
)

// admin terminates the consumers' database connections from the server
// side. The consumers connect under a name of their own (PostgreSQL: an
// application_name; MariaDB: a user created for the run), so only their
// connections are hit, never those of other tests sharing the server, nor
// the driver's own.
type admin interface {
	terminate(ctx context.Context) (int, error)
	// openTransactions counts the transactions open on the server in the
	// sessions of the run's processes whose client ports are ports
	// (opentx.go).
	openTransactions(ctx context.Context, db *gorm.DB, ports []int) (int, error)
	close()
}

type noAdmin struct{}

func (noAdmin) terminate(context.Context) (int, error) { return 0, nil }
func (noAdmin) close()                                 {}

// backendFor returns the backend of a run on cfg's database: the given DSN,
// or for SQLite a database file of the run in WorkDir.
func backendFor(cfg Config, runID string) inventory.Backend {
	b := inventory.Backend{Dialect: cfg.Dialect, DSN: cfg.DSN, RunID: runID}
	if cfg.Dialect == "sqlite" {
		b.DSN = filepath.Join(cfg.WorkDir, "inventory-"+runID+".db")
	}
	return b
}

// newAdmin returns the admin for cfg and the backend the consumers use.
func newAdmin(ctx context.Context, cfg Config, runID string) (admin, inventory.Backend, error) {
	b := backendFor(cfg, runID)
	switch cfg.Dialect {
	case "sqlite":
		return noAdmin{}, b, nil
	case "postgres":
		app := "inbox-chaos-" + runID
		b.DSN = withPostgresParam(cfg.DSN, "application_name", app)
		a := &pgAdmin{app: app, dsn: cfg.DSN}
		return a, b, nil
	case "mysql":
		return newMySQLAdmin(ctx, cfg, b)
	}
	return nil, b, fmt.Errorf("chaos: unknown database %q", cfg.Dialect)
}

// withPostgresParam adds a connection parameter to a libpq key=value or URL
// DSN.
func withPostgresParam(dsn, key, value string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err == nil {
			q := u.Query()
			q.Set(key, value)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return strings.TrimSpace(dsn) + " " + key + "=" + value
}

type pgAdmin struct {
	app string
	dsn string
}

// terminate runs pg_terminate_backend over the connections of the run's
// consumers in the current database, from a fresh connection (the server
// may have restarted since the last round).
func (a *pgAdmin) terminate(ctx context.Context) (int, error) {
	db, _, err := inventory.Backend{Dialect: "postgres", DSN: a.dsn, RunID: "x"}.Open()
	if err != nil {
		return 0, err
	}
	defer closeDB(db)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var n int
	err = db.WithContext(ctx).Raw(`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = ? AND pid <> pg_backend_pid()) t WHERE ok`, a.app).Scan(&n).Error
	return n, err
}

func (a *pgAdmin) close() {}

type mysqlAdmin struct {
	dsn  string // the driver's, with the privilege to create users
	user string

	// InnoDB refreshes what information_schema.INNODB_TRX shows at most
	// every 100 ms, on a read at least that long after the previous one:
	// reads spaced by less see transactions as they were, ended ones
	// included (openTransactions).
	trxMu   sync.Mutex
	trxRead time.Time
}

// newMySQLAdmin creates a user for the run's consumers, with the rights of
// the given one on its database.
func newMySQLAdmin(ctx context.Context, cfg Config, b inventory.Backend) (admin, inventory.Backend, error) {
	mc, err := gomysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, b, fmt.Errorf("chaos: mysql DSN: %w", err)
	}
	if mc.DBName == "" {
		return nil, b, fmt.Errorf("chaos: the mysql DSN names no database")
	}
	raw := make([]byte, 8)
	_, _ = rand.Read(raw)
	a := &mysqlAdmin{dsn: cfg.DSN, user: "chaos_" + b.RunID}
	password := hex.EncodeToString(raw)
	db, _, err := inventory.Backend{Dialect: "mysql", DSN: cfg.DSN, RunID: "x"}.Open()
	if err != nil {
		return nil, b, err
	}
	defer closeDB(db)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		for _, stmt := range []string{
			fmt.Sprintf("CREATE USER '%s'@'%s' IDENTIFIED BY '%s'", a.user, host, password),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'%s'", mc.DBName, a.user, host),
		} {
			if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
				return nil, b, fmt.Errorf("chaos: create the consumers' user: %w", err)
			}
		}
	}
	mc.User, mc.Passwd = a.user, password
	b.DSN = mc.FormatDSN()
	return a, b, nil
}

// terminate kills every connection of the consumers' user (KILL CONNECTION
// over the processlist), from a fresh connection of the driver's user.
func (a *mysqlAdmin) terminate(ctx context.Context) (int, error) {
	db, _, err := inventory.Backend{Dialect: "mysql", DSN: a.dsn, RunID: "x"}.Open()
	if err != nil {
		return 0, err
	}
	defer closeDB(db)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var ids []int64
	if err := db.WithContext(ctx).Raw(`SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? AND ID <> CONNECTION_ID()`, a.user).Scan(&ids).Error; err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		// A connection may have ended meanwhile (1094: unknown thread id).
		if err := db.WithContext(ctx).Exec(fmt.Sprintf("KILL CONNECTION %d", id)).Error; err == nil {
			n++
		}
	}
	return n, nil
}

func (a *mysqlAdmin) close() {
	db, _, err := inventory.Backend{Dialect: "mysql", DSN: a.dsn, RunID: "x"}.Open()
	if err != nil {
		return
	}
	defer closeDB(db)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, host := range []string{"127.0.0.1", "localhost"} {
		_ = db.WithContext(ctx).Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%s'", a.user, host)).Error
	}
}

func closeDB(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		_ = s.Close()
	}
}

// script runs scripts/<name> with args, bounded in time, its output
// appended to a log file of the run.
func (r *run) script(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	logPath := filepath.Join(r.cfg.WorkDir, "scripts.log")
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(r.cfg.Scripts, name)}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("chaos: %s %s: %w\n%s", name, strings.Join(args, " "), err, tail)
	}
	return nil
}
