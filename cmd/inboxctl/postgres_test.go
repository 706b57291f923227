package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// TestCheckPostgres runs check against the test server in a schema that does
// not exist yet: the checks pass, and neither scratch tables nor the schema
// are left behind.
func TestCheckPostgres(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	schema := "inboxctl_t_" + conformance.RandomSuffix()
	r := runArgs(t, "check", "--dsn", dsn, "--schema", schema)
	expectCode(t, r, exitOK)
	n := len(selectChecks(false, nil)) + 1
	for _, want := range []string{"PASS  settings/verify", "PASS  concurrency/concurrent-deliveries-first-rolls-back",
		"PASS  outbox-order/commit-gap", "PASS  outbox-relay/several-relays", "PASS  outbox-sequence/relay-headers", "PASS  outbox-expiry/never-unpublished",
		fmt.Sprintf("PASS: %d of %d checks passed against postgres", n, n)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q:\n%v", want, r)
		}
	}
	db := openGorm(t, dialectPostgres, dsn)
	expectNoTables(t, dialectPostgres, db, schema, scratchPrefix)
	var exists bool
	if err := db.Raw(`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = ?)`, schema).Scan(&exists).Error; err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("schema %s, created for the scratch tables, was left behind", schema)
	}
}

// TestCheckPostgresSerializable: applications that run their transactions
// at SERIALIZABLE get 40001 on a concurrent duplicate, which the inbox
// retries; check runs at their level.
func TestCheckPostgresSerializable(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	r := runArgs(t, "check", "--dsn", dsn, "--isolation", "serializable", "--run", "^(atomicity|concurrency|batch)/")
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "PASS  concurrency/concurrent-deliveries-of-one-id") {
		t.Errorf("check --isolation serializable:\n%v", r)
	}
}

// TestCheckPostgresRetention runs the retention checks (--all) on PostgreSQL,
// where expiry drops partitions.
func TestCheckPostgresRetention(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	r := runArgs(t, "check", "--dsn", dsn, "--all", "--run", "^retention/", "--schema", "inboxctl_t_"+conformance.RandomSuffix())
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "PASS  retention/maintain-removes-only-expired-days") {
		t.Errorf("retention checks:\n%v", r)
	}
}

// TestCheckPostgresUnsafeSettings: a session with synchronous_commit off can
// lose committed inbox rows whose offsets were committed; check fails with
// that reason.
func TestCheckPostgresUnsafeSettings(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	if strings.Contains(dsn, "://") {
		t.Skip("the test adds options to a key=value DSN")
	}
	unsafe := dsn + " options='-c synchronous_commit=off'"
	schema := "inboxctl_t_" + conformance.RandomSuffix()
	r := runArgs(t, "check", "--dsn", unsafe, "--schema", schema, "--run", "^schema/")
	expectCode(t, r, exitFailed)
	t.Logf("unsafe PostgreSQL:\n%s", r.stdout)
	for _, want := range []string{"FAIL  settings/verify", "synchronous_commit is off", "FAIL  schema/table-is-transactional", "checks failed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q:\n%v", want, r)
		}
	}
	expectNoTables(t, dialectPostgres, openGorm(t, dialectPostgres, dsn), schema, scratchPrefix)
}

// TestPostgresMigrateMaintainStats: partitions are prepared, listed with
// their sizes, and expired days are dropped.
func TestPostgresMigrateMaintainStats(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	schema := "inboxctl_t_" + conformance.RandomSuffix()
	db := openGorm(t, dialectPostgres, dsn)
	t.Cleanup(func() { db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
	common := []string{"--dsn", dsn, "--schema", schema}
	args := func(cmd string, extra ...string) []string {
		return append(append([]string{cmd}, common...), extra...)
	}
	r := runArgs(t, args("migrate")...)
	expectCode(t, r, exitOK)
	if r.stdout != "migrated postgres table "+schema+".inbox_messages\nmigrated postgres watermark table "+schema+".inbox_messages_watermarks\n" {
		t.Errorf("migrate:\n%v", r)
	}
	today := storage.DayOf(time.Now())
	day := func(days int) string { return today.AddDate(0, 0, days).Format(time.DateOnly) }

	// Migrate made yesterday through 7 days ahead.
	dry := decodeJSON[maintainResult](t, runArgs(t, args("maintain", "--dry-run", "--json", "--prepare-days", "10")...))
	if !dry.DryRun || len(dry.Prepared) != 3 || dry.Prepared[0] != day(8) || dry.Prepared[2] != day(10) {
		t.Errorf("maintain --dry-run --json: %+v", dry)
	}
	r = runArgs(t, args("maintain", "--prepare-days", "10", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "prepared: "+day(8)+" "+day(9)+" "+day(10)) {
		t.Errorf("maintain:\n%v", r)
	}

	store, err := inboxpg.New(inboxpg.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	at := func(days int) time.Time { return today.AddDate(0, 0, days).Add(12 * time.Hour) }
	seed(t, db, store, []inbox.Message{
		{Consumer: "billing", ID: "old-1", Time: at(-40)},
		{Consumer: "billing", ID: "old-2", Time: at(-40)},
		{Consumer: "billing", ID: "now-1", Time: at(0)},
		{Consumer: "shipping", ID: "now-1", Time: at(1)},
	})
	st := decodeJSON[statsResult](t, runArgs(t, args("stats", "--json", "--retention-days", "30")...))
	if st.TotalRows != 4 || st.ExpiredRows != 2 || st.OldestDay != day(-40) || st.NewestDay != day(1) || len(st.Consumers) != 2 {
		t.Errorf("stats --json: %+v", st)
	}
	if st.Size == nil || st.Size.Bytes <= 0 || len(st.Size.Partitions) < 4 {
		t.Errorf("stats --json size: %+v (%s)", st.Size, st.SizeError)
	}
	r = runArgs(t, args("stats")...)
	expectCode(t, r, exitOK)
	for _, want := range []string{"PARTITION", "inbox_messages_p" + strings.ReplaceAll(day(0), "-", ""), "pg_total_relation_size"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stats lacks %q:\n%v", want, r)
		}
	}
	r = runArgs(t, args("maintain", "--dry-run", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, day(-40)+"  2 rows") {
		t.Errorf("maintain --dry-run:\n%v", r)
	}
	r = runArgs(t, args("maintain", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "removed 1 expired day(s):") {
		t.Errorf("maintain:\n%v", r)
	}
	st = decodeJSON[statsResult](t, runArgs(t, args("stats", "--json", "--retention-days", "30")...))
	if st.TotalRows != 2 || st.ExpiredRows != 0 {
		t.Errorf("stats after maintain: %+v", st)
	}
}

// TestPostgresOutboxEpoch: the outbox's source id, made by the printed
// DDL, kept by migrate; the epoch shown and bumped.
func TestPostgresOutboxEpoch(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	schema := "inboxctl_t_" + conformance.RandomSuffix()
	db := openGorm(t, dialectPostgres, dsn)
	t.Cleanup(func() { db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
	expectOutboxEpoch(t, dialectPostgres, db, "--dsn", dsn, "--schema", schema)
}

// TestPostgresWatermarks: migrate makes the watermark table in the inbox
// table's schema, and watermarks lists what SaveWatermarks wrote.
func TestPostgresWatermarks(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	schema := "inboxctl_t_" + conformance.RandomSuffix()
	db := openGorm(t, dialectPostgres, dsn)
	t.Cleanup(func() { db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
	store, err := inboxpg.New(inboxpg.Options{Schema: schema, Table: "orders_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	expectWatermarks(t, db, store, `"`+schema+`"."orders_inbox_watermarks"`, "--dsn", dsn, "--schema", schema, "--table", "orders_inbox")
}
