package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// result is one in-process run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

func runArgs(t *testing.T, args ...string) result {
	t.Helper()
	return runArgsContext(t, t.Context(), args...)
}

func runArgsContext(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runContext(ctx, args, &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func expectCode(t *testing.T, r result, want int) {
	t.Helper()
	if r.code != want {
		t.Fatalf("want exit %d, got %v", want, r)
	}
}

func decodeJSON[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%v", err, r)
	}
	return v
}

// sqliteFile returns a path for a database file that does not exist yet.
func sqliteFile(t *testing.T) string { return filepath.Join(t.TempDir(), "app.db") }

// emptySQLite returns the path of a new, empty database file (SQLite takes
// an empty file for an empty database).
func emptySQLite(t *testing.T) string {
	t.Helper()
	path := sqliteFile(t)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// openGorm opens dsn of dialect for a test's own use.
func openGorm(t *testing.T, dialect, dsn string) *gorm.DB {
	t.Helper()
	b, err := lookupBackend(dialect)
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(b.open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	return db
}

// expectNoTables fails if tables starting with any of the prefixes exist.
func expectNoTables(t *testing.T, dialect string, db *gorm.DB, schema string, prefixes ...string) {
	t.Helper()
	b, err := lookupBackend(dialect)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prefixes {
		names, err := b.tables(context.Background(), db, schema, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) > 0 {
			t.Errorf("left behind in %s: %v", dialect, names)
		}
	}
}

// seed processes messages into the inbox table through the library, old
// ones included.
func seed(t *testing.T, db *gorm.DB, store storage.InboxStore, msgs []inbox.Message) {
	t.Helper()
	ib, err := inbox.New(db, store, inbox.Config{Expired: inbox.ProcessExpired, RetentionDays: 365})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		out, err := ib.Process(t.Context(), m, func(context.Context, *gorm.DB, inbox.Message) error { return nil })
		if err != nil || out != inbox.Processed {
			t.Fatalf("seeding %s/%s: %v %v", m.Consumer, m.ID, out, err)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Setenv(dsnEnv, "")
	dsn := inboxsqlite.DSN(sqliteFile(t))
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "Usage:"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"migrate", "--dsn", dsn, "--nope"}, "flag provided but not defined: -nope"},
		{"bad flag value", []string{"maintain", "--dsn", dsn, "--retention-days", "many"}, "invalid value"},
		{"positional argument", []string{"stats", "--dsn", dsn, "extra"}, `unexpected argument "extra"`},
		{"no dsn", []string{"migrate"}, "no database: pass --dsn or set $INBOX_DSN"},
		{"unknown dialect", []string{"migrate", "--dsn", dsn, "--dialect", "oracle"}, `unknown --dialect "oracle"`},
		{"ambiguous dsn", []string{"stats", "--dsn", "somewhere"}, "cannot tell the dialect from the DSN"},
		{"mysql url", []string{"stats", "--dsn", "mysql://u:p@db/app"}, "go-sql-driver/mysql form"},
		{"schema on sqlite", []string{"migrate", "--dsn", dsn, "--schema", "x"}, "--schema is for PostgreSQL and MySQL only"},
		{"zero retention", []string{"maintain", "--dsn", dsn, "--retention-days", "0"}, "--retention-days must be at least 1"},
		{"negative prepare", []string{"maintain", "--dsn", dsn, "--prepare-days", "-1"}, "--prepare-days must not be negative"},
		{"zero timeout", []string{"stats", "--dsn", dsn, "--timeout", "0s"}, "--timeout must be positive"},
		{"dry-run on migrate", []string{"migrate", "--dsn", dsn, "--dry-run"}, "flag provided but not defined: -dry-run"},
		{"bad check pattern", []string{"check", "--dsn", dsn, "--run", "("}, "--run: error parsing regexp"},
		{"check pattern matches nothing", []string{"check", "--dsn", dsn, "--run", "no-such-check"}, "matches no check"},
		{"bad isolation", []string{"check", "--dsn", dsn, "--isolation", "snapshot"}, `unknown --isolation "snapshot"`},
		{"in-memory sqlite", []string{"check", "--dialect", "sqlite", "--dsn", "file::memory:?cache=shared"}, "in-memory SQLite"},
		{"watermarks without consumer", []string{"watermarks", "--dsn", dsn}, "--consumer is required"},
		{"negative partition", []string{"watermarks", "--dsn", dsn, "--consumer", "c", "--partition", "-1"}, "want a partition number, 0 or more"},
		{"partition not a number", []string{"watermarks", "--dsn", dsn, "--consumer", "c", "--partition", "one"}, `invalid value "one" for flag -partition`},
		{"partition out of range", []string{"watermarks", "--dsn", dsn, "--consumer", "c", "--partition", "4294967296"}, "want a partition number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runArgs(t, tc.args...)
			expectCode(t, r, exitUsage)
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr does not say %q:\n%v", tc.want, r)
			}
			if r.stdout != "" {
				t.Errorf("usage error wrote to stdout:\n%v", r)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		r := runArgs(t, args...)
		expectCode(t, r, exitOK)
		for _, c := range commands() {
			if !strings.Contains(r.stdout, c.name) {
				t.Errorf("%v: help does not list %s:\n%v", args, c.name, r)
			}
		}
	}
	for _, c := range commands() {
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {"help", c.name}} {
			r := runArgs(t, args...)
			expectCode(t, r, exitOK)
			wants := []string{"Usage: inboxctl " + c.name, "--dsn", "--dialect", "--timeout", "Examples:\n  inboxctl " + c.name, "Exit status"}
			if c.name == "deadletters" { // Kafka only: no database
				wants = []string{"Usage: inboxctl " + c.name, "--brokers", "--timeout", "Examples:\n  inboxctl " + c.name, "Exit status"}
			}
			for _, want := range wants {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("%v: help lacks %q:\n%v", args, want, r)
				}
			}
		}
	}
	r := runArgs(t, "maintain", "-h")
	if !strings.Contains(r.stdout, "--dry-run") || !strings.Contains(r.stdout, "--retention-days days") {
		t.Errorf("maintain help lacks its own flags:\n%v", r)
	}
}

func TestInferDialect(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://app:secret@db:5432/app?sslmode=disable": dialectPostgres,
		"postgresql://db/app":                               dialectPostgres,
		"host=127.0.0.1 port=5432 user=postgres dbname=app": dialectPostgres,
		"dbname=app": dialectPostgres,
		"app:secret@tcp(db:3306)/app?parseTime=true":                     dialectMySQL,
		"app@unix(/run/mysqld/mysqld.sock)/app":                          dialectMySQL,
		"tcp(127.0.0.1:3306)/app":                                        dialectMySQL,
		"root@/app":                                                      dialectMySQL,
		"file:/var/lib/app.db?_journal_mode=WAL":                         dialectSQLite,
		"/var/lib/app/inbox.sqlite3":                                     dialectSQLite,
		"app.db?_busy_timeout=5000":                                      dialectSQLite,
		"file:test.db?_journal_mode=WAL&_txlock=immediate&_foreign_keys": dialectSQLite,
	} {
		got, err := inferDialect(dsn)
		if err != nil || got != want {
			t.Errorf("inferDialect(%q) = %q, %v; want %q", dsn, got, err, want)
		}
	}
	for _, dsn := range []string{"somewhere", "app", "mysql://u:p@db/app"} {
		if got, err := inferDialect(dsn); err == nil {
			t.Errorf("inferDialect(%q) = %q, want an error", dsn, got)
		}
	}
}

func TestDialectFromEnvironment(t *testing.T) {
	path := sqliteFile(t)
	t.Setenv(dsnEnv, inboxsqlite.DSN(path))
	r := runArgs(t, "migrate")
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "migrated sqlite table inbox_messages") {
		t.Errorf("unexpected output:\n%v", r)
	}
}

func TestUnavailableDialect(t *testing.T) {
	for _, d := range []string{dialectPostgres, dialectMySQL, dialectSQLite} {
		if _, err := lookupBackend(d); err != nil {
			t.Errorf("dialect %s: %v", d, err)
		}
	}
	// A build without an adapter says so.
	b := backends[dialectMySQL]
	delete(backends, dialectMySQL)
	unavailable[dialectMySQL] = "the MySQL adapter is not in this build"
	t.Cleanup(func() { backends[dialectMySQL] = b; delete(unavailable, dialectMySQL) })
	r := runArgs(t, "migrate", "--dsn", "app:secret@tcp(db:3306)/app")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "dialect mysql is not available: the MySQL adapter is not in this build") {
		t.Errorf("no clear error:\n%v", r)
	}
}

// TestSQLiteMigrateMaintainStats drives the operator's day on SQLite:
// migrate, look, preview maintenance, maintain, look again.
func TestSQLiteMigrateMaintainStats(t *testing.T) {
	path := sqliteFile(t)
	dsn := inboxsqlite.DSN(path)
	const table = "orders_inbox"
	common := []string{"--dsn", dsn, "--table", table}
	args := func(cmd string, extra ...string) []string {
		return append(append([]string{cmd}, common...), extra...)
	}

	r := runArgs(t, args("migrate")...)
	expectCode(t, r, exitOK)
	if r.stdout != "migrated sqlite table orders_inbox\nmigrated sqlite watermark table orders_inbox_watermarks\n" {
		t.Errorf("migrate output:\n%v", r)
	}
	expectCode(t, runArgs(t, args("migrate")...), exitOK) // idempotent
	mj := decodeJSON[migrateResult](t, runArgs(t, args("migrate", "--json")...))
	if !mj.OK || mj.Table != table || mj.Dialect != "sqlite" {
		t.Errorf("migrate --json: %+v", mj)
	}

	r = runArgs(t, args("stats")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "no rows") || !strings.Contains(r.stdout, "size on disk:") {
		t.Errorf("stats of an empty table:\n%v", r)
	}

	db := openGorm(t, dialectSQLite, dsn)
	store, err := inboxsqlite.New(inboxsqlite.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	today := storage.DayOf(time.Now())
	at := func(days int) time.Time { return today.AddDate(0, 0, days).Add(12 * time.Hour) }
	var msgs []inbox.Message
	for i, d := range []int{-40, -40, -35, -1, 0, 0, 0} {
		msgs = append(msgs, inbox.Message{Consumer: "billing", ID: fmt.Sprintf("b-%d", i), Time: at(d)})
	}
	msgs = append(msgs, inbox.Message{Consumer: "shipping", ID: "s-1", Time: at(-2)})
	seed(t, db, store, msgs)
	day := func(days int) string { return today.AddDate(0, 0, days).Format(time.DateOnly) }

	st := decodeJSON[statsResult](t, runArgs(t, args("stats", "--json", "--retention-days", "30")...))
	if st.TotalRows != 8 || st.OldestDay != day(-40) || st.NewestDay != day(0) || st.ExpiredRows != 3 || st.ExpireBefore != day(-31) {
		t.Errorf("stats --json totals: %+v", st)
	}
	if len(st.Consumers) != 2 || st.Consumers[0].Consumer != "billing" || st.Consumers[0].Rows != 7 || len(st.Consumers[0].Days) != 4 ||
		st.Consumers[0].OldestDay != day(-40) || st.Consumers[0].NewestDay != day(0) ||
		st.Consumers[1].Consumer != "shipping" || st.Consumers[1].Rows != 1 || st.Consumers[1].OldestDay != day(-2) {
		t.Errorf("stats --json consumers: %+v", st.Consumers)
	}
	if st.Size == nil || st.Size.Bytes <= 0 {
		t.Errorf("stats --json size: %+v (%s)", st.Size, st.SizeError)
	}
	r = runArgs(t, args("stats")...)
	expectCode(t, r, exitOK)
	for _, want := range []string{"sqlite table orders_inbox", "billing   " + day(-40) + "  2     expired", "shipping  1     1     " + day(-2) + "  " + day(-2),
		"(all 2)   8     5     " + day(-40), "3 rows of days before " + day(-31) + " would be removed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stats output lacks %q:\n%v", want, r)
		}
	}

	// The dry run says what would go, and changes nothing.
	r = runArgs(t, args("maintain", "--dry-run", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	for _, want := range []string{"dry run: nothing was changed", "expire before    " + day(-31), "would remove 2 expired day(s):",
		day(-40) + "  2 rows", day(-35) + "  1 rows", "rows would remove: 3"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("maintain --dry-run output lacks %q:\n%v", want, r)
		}
	}
	dry := decodeJSON[maintainResult](t, runArgs(t, args("maintain", "--dry-run", "--json", "--retention-days", "30", "--prepare-days", "2")...))
	if !dry.DryRun || dry.RowsRemoved != 3 || len(dry.Expired) != 2 || dry.Expired[0] != (expiredDay{day(-40), 2}) ||
		dry.PrepareThrough != day(2) || dry.Today != day(0) {
		t.Errorf("maintain --dry-run --json: %+v", dry)
	}
	if st := decodeJSON[statsResult](t, runArgs(t, args("stats", "--json")...)); st.TotalRows != 8 {
		t.Fatalf("the dry run removed rows: %+v", st)
	}

	// A shorter retention removes more: it is the operator's to choose.
	done := decodeJSON[maintainResult](t, runArgs(t, args("maintain", "--json", "--retention-days", "30")...))
	if done.DryRun || done.RowsRemoved != 3 || len(done.Expired) != 2 {
		t.Errorf("maintain --json: %+v", done)
	}
	st = decodeJSON[statsResult](t, runArgs(t, args("stats", "--json", "--retention-days", "30")...))
	if st.TotalRows != 5 || st.ExpiredRows != 0 || st.OldestDay != day(-2) {
		t.Errorf("stats after maintain: %+v", st)
	}
	r = runArgs(t, args("maintain", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "removed: no expired days") || strings.Contains(r.stdout, "dry run") {
		t.Errorf("second maintain:\n%v", r)
	}

	// A table that does not exist is a failure, not a usage error.
	r = runArgs(t, "stats", "--dsn", dsn, "--table", "missing_inbox")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "missing_inbox") {
		t.Errorf("stats of a missing table:\n%v", r)
	}
}

func TestCheckSQLite(t *testing.T) {
	path := emptySQLite(t)
	dsn := inboxsqlite.DSN(path)
	r := runArgs(t, "check", "--dsn", dsn)
	expectCode(t, r, exitOK)
	n := len(selectChecks(false, nil)) + 1
	for _, want := range []string{"PASS  settings/verify", "PASS  schema/table-is-transactional", "PASS  atomicity/handler-error-rolls-back",
		"PASS  outbox-order/commit-gap", "PASS  outbox-relay/several-relays", "PASS  outbox-sequence/relay-headers", "PASS  outbox-expiry/never-unpublished",
		// SQLite's store cannot open a transaction with its watermark
		// writes in one round trip: that capability's check is skipped.
		"SKIP  watermark/begin-and-save", "PASS  outbox-sequence/claim-source",
		"PASS  offsets/floor-refuses-a-moved-row", "PASS  offsets/migrate-concurrently",
		fmt.Sprintf("PASS: %d of %d checks passed, 1 skipped against sqlite", n-1, n)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q:\n%v", want, r)
		}
	}
	if strings.Contains(r.stdout, "retention/") {
		t.Errorf("retention checks ran without --all:\n%v", r)
	}
	expectNoTables(t, dialectSQLite, openGorm(t, dialectSQLite, dsn), "", scratchPrefix, effectsPrefix, "conformance_offsets_")
}

func TestCheckSQLiteAllJSON(t *testing.T) {
	dsn := inboxsqlite.DSN(emptySQLite(t))
	r := runArgs(t, "check", "--dsn", dsn, "--all", "--run", "^(retention|atomicity)/", "--json")
	expectCode(t, r, exitOK)
	rep := decodeJSON[checkReport](t, r)
	if rep.Failed != 0 || rep.Passed != len(rep.Results) || rep.Dialect != "sqlite" {
		t.Errorf("check --json: %+v", rep)
	}
	areas := map[string]int{}
	for _, res := range rep.Results {
		area, _, _ := strings.Cut(res.Check, "/")
		areas[area]++
	}
	if areas["retention"] == 0 || areas["atomicity"] == 0 || areas["settings"] != 1 || len(areas) != 3 {
		t.Errorf("checks run: %v", areas)
	}
	expectNoTables(t, dialectSQLite, openGorm(t, dialectSQLite, dsn), "", scratchPrefix, effectsPrefix)
}

func TestCheckList(t *testing.T) {
	r := runArgs(t, "check", "--list")
	expectCode(t, r, exitOK)
	if strings.Contains(r.stdout, "retention/") || !strings.Contains(r.stdout, "schema/claim-answers-each-row") ||
		!strings.Contains(r.stdout, "outbox-order/commit-gap") {
		t.Errorf("check --list:\n%v", r)
	}
	r = runArgs(t, "check", "--list", "--all")
	if !strings.Contains(r.stdout, "retention/maintain-removes-only-expired-days") {
		t.Errorf("check --list --all:\n%v", r)
	}
}

// TestCheckOutboxSQLite runs the outbox checks alone: every one of the
// conformance suite's outbox checks runs against the outbox Store in its own
// scratch tables, and none is left behind.
func TestCheckOutboxSQLite(t *testing.T) {
	dsn := inboxsqlite.DSN(emptySQLite(t))
	rep := decodeJSON[checkReport](t, runArgs(t, "check", "--dsn", dsn, "--run", "^outbox-", "--json"))
	want := map[string]bool{}
	for _, c := range conformance.Checks() {
		if c.Outbox {
			want[c.ID()] = true
		}
	}
	if rep.Failed != 0 || rep.Skipped != 0 || rep.Passed != len(want)+1 || len(rep.Results) != len(want)+1 {
		t.Errorf("check --run ^outbox-: %d passed, %d failed, %d skipped of %d results; want all %d outbox checks and settings/verify passed: %+v",
			rep.Passed, rep.Failed, rep.Skipped, len(rep.Results), len(want), rep)
	}
	for _, r := range rep.Results[1:] {
		if !want[r.Check] {
			t.Errorf("unexpected check %s", r.Check)
		}
		delete(want, r.Check)
	}
	if len(want) > 0 {
		t.Errorf("outbox checks not run: %v", want)
	}
	expectNoTables(t, dialectSQLite, openGorm(t, dialectSQLite, dsn), "", scratchPrefix, effectsPrefix)
}

// TestCheckSQLiteUnsafeSettings: a database opened without the settings
// the SQLite adapter needs (no WAL, no busy timeout) fails the check, with
// the reason.
func TestCheckSQLiteUnsafeSettings(t *testing.T) {
	dsn := "file:" + emptySQLite(t) + "?_busy_timeout=0"
	// The inbox checks only: without a busy timeout the outbox checks' own
	// concurrent connections fail as well, which is no news here.
	r := runArgs(t, "check", "--dsn", dsn, "--run", "^[a-z]+/")
	expectCode(t, r, exitFailed)
	t.Logf("unsafe SQLite:\n%s", r.stdout)
	for _, want := range []string{
		"FAIL  settings/verify",
		`journal_mode is "delete", want wal`,
		"busy_timeout is 0",
		"FAIL  schema/table-is-transactional",
		"checks failed",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q:\n%v", want, r)
		}
	}
	rep := decodeJSON[checkReport](t, runArgs(t, "check", "--dsn", dsn, "--run", "^schema/table-is-transactional$", "--json"))
	if rep.Failed != 2 || rep.Passed != 0 || len(rep.Results) != 2 || rep.Results[0].Status != statusFail ||
		!strings.Contains(rep.Results[0].Reason, "busy_timeout is 0") || !strings.Contains(rep.Results[1].Reason, "journal_mode") {
		t.Errorf("check --json of unsafe settings: %+v", rep)
	}
	expectNoTables(t, dialectSQLite, openGorm(t, dialectSQLite, dsn), "", scratchPrefix, effectsPrefix)
}

// TestCheckInterrupted: an interrupt in the middle of a check stops the run
// and leaves no scratch table behind.
func TestCheckInterrupted(t *testing.T) {
	dsn := inboxsqlite.DSN(emptySQLite(t))
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	// The check holds its first delivery open for 300ms; interrupt it then.
	out := &triggerWriter{on: "settings/verify", fire: func() {
		time.AfterFunc(100*time.Millisecond, func() { cancel(errors.New("test interrupt")) })
	}}
	var errOut bytes.Buffer
	code := runContext(ctx, []string{"check", "--dsn", dsn, "--all", "--run", "first-rolls-back|retention"}, out, &errOut)
	r := result{code: code, stdout: out.String(), stderr: errOut.String()}
	expectCode(t, r, exitFailed)
	for _, want := range []string{"FAIL  concurrency/concurrent-deliveries-first-rolls-back", "interrupted before it finished (test interrupt)", "not run"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("interrupted check lacks %q:\n%v", want, r)
		}
	}
	if !strings.Contains(r.stderr, "interrupted (test interrupt)") {
		t.Errorf("interrupted check:\n%v", r)
	}
	expectNoTables(t, dialectSQLite, openGorm(t, dialectSQLite, dsn), "", scratchPrefix, effectsPrefix)
}

// triggerWriter calls fire once, when what is written contains on.
type triggerWriter struct {
	bytes.Buffer
	on    string
	fire  func()
	fired bool
}

func (w *triggerWriter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if !w.fired && strings.Contains(w.String(), w.on) {
		w.fired = true
		w.fire()
	}
	return n, err
}

func TestSQLitePath(t *testing.T) {
	for dsn, want := range map[string]string{
		"app.db":                              "app.db",
		"/var/lib/app.db?_busy_timeout=5000":  "/var/lib/app.db",
		"file:app.db?_journal_mode=WAL":       "app.db",
		"file:/var/lib/my%20app.db?mode=rwc":  "/var/lib/my app.db",
		"file:///var/lib/app.db":              "/var/lib/app.db",
		"file://localhost/var/lib/app.db?x=1": "/var/lib/app.db",
	} {
		if got := sqlitePath(dsn); got != want {
			t.Errorf("sqlitePath(%q) = %q, want %q", dsn, got, want)
		}
	}
}

// TestSQLiteFileMustExist: only migrate creates an SQLite database; a
// mistyped path is an error, and no stray file is created.
func TestSQLiteFileMustExist(t *testing.T) {
	path := sqliteFile(t)
	for _, cmd := range []string{"stats", "maintain", "check"} {
		r := runArgs(t, cmd, "--dsn", inboxsqlite.DSN(path))
		expectCode(t, r, exitFailed)
		if !strings.Contains(r.stderr, "does not exist (inboxctl migrate creates it)") {
			t.Errorf("%s of a missing file:\n%v", cmd, r)
		}
		if _, err := os.Stat(path); err == nil {
			t.Fatalf("%s created %s", cmd, path)
		}
	}
	expectCode(t, runArgs(t, "migrate", "--dsn", inboxsqlite.DSN(path)), exitOK)
	expectCode(t, runArgs(t, "stats", "--dsn", inboxsqlite.DSN(path)), exitOK)
}

func TestCheckUnreachable(t *testing.T) {
	dir := t.TempDir()
	// A directory is no database file.
	r := runArgs(t, "check", "--dialect", "sqlite", "--dsn", dir)
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "inboxctl check:") {
		t.Errorf("unreachable database:\n%v", r)
	}
}

// TestCheckReportsLeftovers: a scratch table that cannot be dropped fails
// the check that made it, naming the table, so nothing is left behind
// unannounced.
func TestCheckReportsLeftovers(t *testing.T) {
	orig := backends[dialectSQLite]
	broken := *orig
	broken.dropTable = func(context.Context, *gorm.DB, string, string) error { return errors.New("drop refused") }
	backends[dialectSQLite] = &broken
	t.Cleanup(func() { backends[dialectSQLite] = orig })

	dsn := inboxsqlite.DSN(emptySQLite(t))
	r := runArgs(t, "check", "--dsn", dsn, "--run", "^schema/claim-answers-each-row$")
	expectCode(t, r, exitFailed)
	for _, want := range []string{"FAIL  settings/verify", "FAIL  schema/claim-answers-each-row", "drop refused", "scratch tables left behind: " + scratchPrefix} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q:\n%v", want, r)
		}
	}
}

// expectOutboxEpoch applies the outbox DDL that migrate --print-sql prints
// for dialect to db, as a migration tool would, then runs inboxctl outbox
// source, migrate and bump-epoch with the connection flags common (which
// name the table): the DDL made a source id, migrate keeps it, the epoch
// goes from 1 to 2.
func expectOutboxEpoch(t *testing.T, dialect string, db *gorm.DB, common ...string) {
	t.Helper()
	args := func(action string, extra ...string) []string {
		return append(append([]string{"outbox", action}, common...), extra...)
	}
	ddl := runArgs(t, args("migrate", "--print-sql", "--dialect", dialect, "--shards", "8")...)
	expectCode(t, ddl, exitOK)
	for _, stmt := range strings.Split(ddl.stdout, ";\n") {
		if q := strings.TrimSpace(stripComments(stmt)); q != "" {
			if err := db.Exec(q).Error; err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	made := decodeJSON[outboxResult](t, runArgs(t, args("source", "--json")...))
	if err := storage.ValidSource(made.Source); err != nil || made.Epoch != 1 {
		t.Fatalf("outbox source after the printed DDL: %+v (%v), want a source id and epoch 1", made, err)
	}
	migrated := decodeJSON[outboxResult](t, runArgs(t, args("migrate", "--shards", "8", "--json")...))
	if migrated.Source != made.Source || migrated.Epoch != 1 {
		t.Fatalf("outbox migrate: %+v, want the DDL's source %q and epoch 1", migrated, made.Source)
	}
	bumped := decodeJSON[outboxResult](t, runArgs(t, args("bump-epoch", "--json")...))
	if bumped.Source != made.Source || bumped.PreviousEpoch != 1 || bumped.Epoch != 2 {
		t.Fatalf("outbox bump-epoch: %+v, want source %q epoch 2, was 1", bumped, made.Source)
	}
	expectCode(t, runArgs(t, args("migrate", "--shards", "8")...), exitOK)
	if src := decodeJSON[outboxResult](t, runArgs(t, args("source", "--json")...)); src.Source != made.Source || src.Epoch != 2 {
		t.Fatalf("outbox source after migrating again: %+v, want source %q epoch 2", src, made.Source)
	}
}

func stripComments(s string) string {
	var keep []string
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
