//go:build cgo

package main

import (
	"strings"
	"testing"
)

func TestOutboxSQLite(t *testing.T) {
	dsn := sqliteFile(t)
	expectCode(t, runArgs(t, "outbox", "stats", "--dsn", dsn), exitFailed) // no database yet
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "8"), exitOK)
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "16"), exitFailed) // another shard count
	stats := decodeJSON[outboxResult](t, runArgs(t, "outbox", "stats", "--dsn", dsn, "--shards", "8", "--json"))
	if stats.TotalRows != 0 || stats.Action != "stats" {
		t.Fatalf("stats of an empty outbox: %+v", stats)
	}
	m := decodeJSON[outboxResult](t, runArgs(t, "outbox", "maintain", "--dsn", dsn, "--shards", "8", "--dry-run", "--json"))
	if !m.DryRun || len(m.Held) != 0 {
		t.Fatalf("dry run: %+v", m)
	}
	expectCode(t, runArgs(t, "outbox", "--dsn", dsn), exitUsage)
	expectCode(t, runArgs(t, "outbox", "publish", "--dsn", dsn), exitUsage)
	expectCode(t, runArgs(t, "outbox", "-h"), exitOK)
}

func TestOutboxPrintSQLThenUse(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql", "sqlite"} {
		r := runArgs(t, "outbox", "migrate", "--print-sql", "--dialect", dialect, "--shards", "4")
		expectCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "CREATE TABLE") || !strings.Contains(r.stdout, "_shards") {
			t.Errorf("%s: DDL lacks the tables:\n%s", dialect, r.stdout)
		}
	}
	// The SQLite DDL, applied as a migration tool would, is accepted by
	// migrate with the same shard count.
	dsn := sqliteFile(t)
	r := runArgs(t, "outbox", "migrate", "--print-sql", "--dialect", "sqlite", "--shards", "4")
	db := openGorm(t, "sqlite", dsn)
	for _, stmt := range strings.Split(r.stdout, ";\n") {
		if q := strings.TrimSpace(stripComments(stmt)); q != "" {
			if err := db.Exec(q).Error; err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	expectCode(t, runArgs(t, "outbox", "migrate", "--dsn", dsn, "--shards", "4"), exitOK)
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
