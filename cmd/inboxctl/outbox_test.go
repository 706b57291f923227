//go:build cgo

package main

import (
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
