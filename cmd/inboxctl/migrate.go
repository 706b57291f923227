package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
)

var migrateSpec = cmdSpec{
	name: "migrate",
	synopsis: `Create the inbox table, or upgrade it to the adapter's current schema; the
table accepts rows at once. It is idempotent and safe to run from several
processes at once. Run "inboxctl maintain" afterwards (and daily) to prepare
the coming days' partitions and expire old days. On SQLite, migrate is the
only command that creates the database file.

It also creates (or checks) the watermark table of sequenced dedup,
<table>_watermarks in the same schema (see inboxctl watermarks), which a
consumer with Config.Sequenced.Sources needs. An inbox table whose name is
too long to add the suffix has none: migrate warns and succeeds, since only
such consumers need it. --print-sql prints the watermark table's DDL after
the inbox table's (and, for such a name, says that it has none).`,
	examples: `  inboxctl migrate --dsn 'postgres://app@db:5432/app' --schema inbox
  inboxctl migrate --dialect mysql --dsn 'app:secret@tcp(db:3306)/app?parseTime=true'
  INBOX_DSN='file:/var/lib/app/app.db?_journal_mode=WAL&_busy_timeout=5000&_txlock=immediate&_synchronous=FULL' inboxctl migrate --table orders_inbox
  inboxctl migrate --print-sql --dialect postgres --schema inbox > migrations/0001_inbox.sql
`,
}

type migrateResult struct {
	Dialect string `json:"dialect"`
	Table   string `json:"table"`
	Schema  string `json:"schema,omitempty"`
	OK      bool   `json:"ok"`
	// WatermarkTable is the watermark table made or checked with the
	// inbox table; WatermarkError says why the inbox table has none.
	WatermarkTable string `json:"watermark_table,omitempty"`
	WatermarkError string `json:"watermark_error,omitempty"`
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(migrateSpec)
	printSQL := fs.Bool("print-sql", false, "print the DDL for --dialect instead of running it; connects to nothing")
	prepareDays := fs.Int("prepare-days", 7, "with --print-sql: `days` after today whose partitions to include (the applications' Config.PrepareDays)")
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "migrate", err)
	}
	if *printSQL {
		return printMigrationSQL(o, *prepareDays, stdout, stderr)
	}
	if err := o.resolve(false); err != nil {
		return fail(stderr, "migrate", err)
	}
	o.create = true
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	c, err := connect(ctx, o)
	if err != nil {
		return fail(stderr, "migrate", err)
	}
	defer c.close()
	ib, err := c.newInbox(&options{verbose: o.verbose}, stderr)
	if err != nil {
		return fail(stderr, "migrate", err)
	}
	if err := ib.Migrate(ctx); err != nil {
		return fail(stderr, "migrate", err)
	}
	res := migrateResult{Dialect: c.b.name, Table: c.table, Schema: c.schema, OK: true}
	if ws, ok := c.store.(storage.WatermarkStore); ok {
		switch err := ws.MigrateWatermarks(ctx, c.db); {
		case err == nil:
			res.WatermarkTable = c.table + c.b.watermarkSuffix
		case errors.Is(err, storage.ErrInvalidConfig):
			// The table's name leaves no room for the suffix. Failing
			// here would fail every migrate of a table that served its
			// consumers well before watermarks existed.
			res.WatermarkError = err.Error()
			fmt.Fprintf(stderr, "inboxctl migrate: warning: %v; consumers on this inbox table cannot use sequenced dedup (Config.Sequenced.Sources)\n", err)
		default:
			return fail(stderr, "migrate", err)
		}
	}
	if o.json {
		return writeJSON(stdout, stderr, "migrate", res)
	}
	fmt.Fprintf(stdout, "migrated %s table %s\n", c.b.name, qualified(c.schema, c.table))
	if res.WatermarkTable != "" {
		fmt.Fprintf(stdout, "migrated %s watermark table %s\n", c.b.name, qualified(c.schema, res.WatermarkTable))
	}
	return exitOK
}

func qualified(schema, table string) string {
	if schema == "" {
		return table
	}
	return schema + "." + table
}

func writeJSON(stdout, stderr io.Writer, cmd string, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(stderr, cmd, err)
	}
	return exitOK
}

// printMigrationSQL prints the DDL of the Store for o's dialect, table and
// schema, without a database.
func printMigrationSQL(o *options, prepareDays int, stdout, stderr io.Writer) int {
	return printDDL(o, prepareDays, stdout, stderr, ddlTarget{
		cmd: "migrate", what: "inbox table", then: "inboxctl maintain (or the consumer's maintenance)",
		defaultTable: func(b *backend) string { return b.defaultTable },
		newStore:     func(b *backend, table string) (any, error) { return b.newStore(table, o.schema) },
		omitted: func(b *backend, store any, table string) string {
			if _, ok := store.(storage.WatermarkStore); !ok {
				return ""
			}
			wm := table + b.watermarkSuffix
			if storage.ValidateIdentifier("watermark table name", wm) != nil {
				return fmt.Sprintf("no watermark table: the inbox table's name is too long for %s, so consumers on it cannot use sequenced dedup", wm)
			}
			return ""
		},
	})
}

// ddlTarget is a table whose DDL printDDL prints.
type ddlTarget struct {
	cmd, what, then string
	defaultTable    func(b *backend) string
	newStore        func(b *backend, table string) (any, error)
	// omitted, if set, names what Migrate would create that the DDL
	// lacks, and why; "" if nothing.
	omitted func(b *backend, store any, table string) string
}

// printDDL prints the statements of the target's Store (an
// storage.SchemaPrinter) for o's dialect, table and schema, without a
// database.
func printDDL(o *options, prepareDays int, stdout, stderr io.Writer, t ddlTarget) int {
	if o.dialect == "" {
		return fail(stderr, t.cmd, usageErrorf("--print-sql needs --dialect (postgres, mysql or sqlite)"))
	}
	if err := o.normalizeDialect(); err != nil {
		return fail(stderr, t.cmd, err)
	}
	if prepareDays < 0 {
		return fail(stderr, t.cmd, usageErrorf("--prepare-days must not be negative, got %d", prepareDays))
	}
	b, err := lookupBackend(o.dialect)
	if err != nil {
		return fail(stderr, t.cmd, err)
	}
	table := o.table
	if table == "" {
		table = t.defaultTable(b)
	}
	store, err := t.newStore(b, table)
	if err != nil {
		return fail(stderr, t.cmd, err)
	}
	printer, ok := store.(storage.SchemaPrinter)
	if !ok {
		return fail(stderr, t.cmd, fmt.Errorf("the %s adapter cannot print its DDL", b.name))
	}
	today := storage.DayOf(time.Now())
	stmts, err := printer.MigrationSQL(storage.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, prepareDays)})
	if err != nil {
		return fail(stderr, t.cmd, err)
	}
	fmt.Fprintf(stdout, "-- %s %s for %s, generated by inboxctl on %s; partitions through %s.\n",
		t.what, qualified(o.schema, table), b.name, today.Format(time.DateOnly), today.AddDate(0, 0, prepareDays).Format(time.DateOnly))
	fmt.Fprintf(stdout, "-- Run %s afterwards: it prepares the following days and expires old ones.\n", t.then)
	if t.omitted != nil {
		if what := t.omitted(b, store, table); what != "" {
			// The DDL usually goes to a file: stderr makes sure the
			// operator reads it too.
			writeComment(stdout, "Not included: "+what+".")
			fmt.Fprintf(stderr, "inboxctl %s: note: not included in the DDL: %s\n", t.cmd, what)
		}
	}
	for _, q := range stmts {
		fmt.Fprintf(stdout, "\n%s;\n", q)
	}
	return exitOK
}

// writeComment writes text as SQL comment lines of at most about 80
// columns, broken at spaces.
func writeComment(w io.Writer, text string) {
	line := "--"
	for _, word := range strings.Fields(text) {
		if len(line) > 2 && len(line)+1+len(word) > 80 {
			fmt.Fprintln(w, line)
			line = "--"
		}
		line += " " + word
	}
	fmt.Fprintln(w, line)
}
