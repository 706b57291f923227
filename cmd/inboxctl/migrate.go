package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
)

var migrateSpec = cmdSpec{
	name: "migrate",
	synopsis: `Create the inbox table, or upgrade it to the adapter's current schema; the
table accepts rows at once. It is idempotent and safe to run from several
processes at once. Run "inboxctl maintain" afterwards (and daily) to prepare
the coming days' partitions and expire old days. On SQLite, migrate is the
only command that creates the database file.`,
	examples: `  inboxctl migrate --dsn 'postgres://app@db:5432/app' --schema inbox
  inboxctl migrate --dialect mysql --dsn 'app:secret@tcp(db:3306)/app?parseTime=true'
  INBOX_DSN='file:/var/lib/app/app.db?_journal_mode=WAL&_busy_timeout=5000&_txlock=immediate&_synchronous=FULL' inboxctl migrate --table orders_inbox
`,
}

type migrateResult struct {
	Dialect string `json:"dialect"`
	Table   string `json:"table"`
	Schema  string `json:"schema,omitempty"`
	OK      bool   `json:"ok"`
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(migrateSpec)
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "migrate", err)
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
	if o.json {
		return writeJSON(stdout, stderr, "migrate", res)
	}
	fmt.Fprintf(stdout, "migrated %s table %s\n", c.b.name, qualified(c.schema, c.table))
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
