package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// mysqlDSN returns the test server's DSN with driver parameters set; a
// parameter the driver does not know becomes a session variable (SET k=v).
func mysqlDSN(t *testing.T, params map[string]string) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		switch k {
		case "clientFoundRows":
			cfg.ClientFoundRows = v == "true"
		default:
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params[k] = v
		}
	}
	return cfg.FormatDSN()
}

func TestCheckMySQL(t *testing.T) {
	dsn := mysqlDSN(t, nil)
	r := runArgs(t, "check", "--dsn", dsn)
	expectCode(t, r, exitOK)
	n := len(selectChecks(false, nil)) + 1
	for _, want := range []string{"PASS  settings/verify", "PASS  atomicity/handler-error-rolls-back",
		"PASS  outbox-order/commit-gap", "PASS  outbox-relay/several-relays", "PASS  outbox-sequence/relay-headers", "PASS  outbox-expiry/never-unpublished",
		"PASS  watermark/begin-and-save", // the watermark's write opens the transaction on the Store's connection
		fmt.Sprintf("PASS: %d of %d checks passed against mysql", n, n)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q:\n%v", want, r)
		}
	}
	expectNoTables(t, dialectMySQL, openGorm(t, dialectMySQL, dsn), "", scratchPrefix)
}

// TestCheckMySQLClientFoundRows: clientFoundRows changes what the server
// reports as affected rows for an unchanged duplicate; the adapter's claim
// must still tell new rows from duplicates.
func TestCheckMySQLClientFoundRows(t *testing.T) {
	dsn := mysqlDSN(t, map[string]string{"clientFoundRows": "true"})
	r := runArgs(t, "check", "--dsn", dsn, "--run", "^(schema|atomicity|batch|concurrency)/")
	expectCode(t, r, exitOK)
	expectNoTables(t, dialectMySQL, openGorm(t, dialectMySQL, dsn), "", scratchPrefix)
}

// TestCheckMySQLUnsafeSettings: settings of the DSN that break the inbox's
// guarantees fail the check with the reason.
func TestCheckMySQLUnsafeSettings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		run    string
		want   []string
	}{
		{
			name:   "non-strict sql_mode",
			params: map[string]string{"sql_mode": "'NO_ENGINE_SUBSTITUTION'"},
			run:    "^schema/",
			want:   []string{"FAIL  settings/verify", `sql_mode "NO_ENGINE_SUBSTITUTION" has neither STRICT_TRANS_TABLES nor STRICT_ALL_TABLES`, "FAIL  schema/table-is-transactional"},
		},
		{
			// Business tables created on this connection are MyISAM, which
			// ignores ROLLBACK: the effect survives a rolled-back delivery.
			name:   "MyISAM default engine",
			params: map[string]string{"default_storage_engine": "MyISAM"},
			run:    "^atomicity/",
			want: []string{"FAIL  settings/verify", "default_storage_engine is MyISAM, not InnoDB",
				"FAIL  atomicity/handler-error-rolls-back", "effect applied 1 times, want 0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := mysqlDSN(t, tc.params)
			r := runArgs(t, "check", "--dsn", dsn, "--run", tc.run)
			expectCode(t, r, exitFailed)
			t.Logf("%s:\n%s", tc.name, r.stdout)
			for _, want := range append(tc.want, "checks failed") {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("check output lacks %q:\n%v", want, r)
				}
			}
			expectNoTables(t, dialectMySQL, openGorm(t, dialectMySQL, dsn), "", scratchPrefix)
		})
	}
}

func TestMySQLMigrateMaintainStats(t *testing.T) {
	dsn := mysqlDSN(t, nil)
	table := "inboxctl_t_" + conformance.RandomSuffix()
	db := openGorm(t, dialectMySQL, dsn)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_watermarks`") })
	common := []string{"--dsn", dsn, "--table", table}
	args := func(cmd string, extra ...string) []string {
		return append(append([]string{cmd}, common...), extra...)
	}
	r := runArgs(t, args("migrate")...)
	expectCode(t, r, exitOK)
	if r.stdout != "migrated mysql table "+table+"\nmigrated mysql watermark table "+table+"_watermarks\n" {
		t.Errorf("migrate:\n%v", r)
	}
	today := storage.DayOf(time.Now())
	day := func(days int) string { return today.AddDate(0, 0, days).Format(time.DateOnly) }
	r = runArgs(t, args("maintain", "--prepare-days", "3")...)
	expectCode(t, r, exitOK)

	store, err := inboxmysql.New(inboxmysql.Options{Table: table})
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
	if st.Size == nil || st.Size.Bytes <= 0 || len(st.Size.Partitions) == 0 {
		t.Errorf("stats --json size: %+v (%s)", st.Size, st.SizeError)
	}
	r = runArgs(t, args("stats")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "PARTITION") || !strings.Contains(r.stdout, "information_schema") {
		t.Errorf("stats:\n%v", r)
	}
	r = runArgs(t, args("maintain", "--dry-run", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "dry run: nothing was changed") {
		t.Errorf("maintain --dry-run:\n%v", r)
	}
	if st := decodeJSON[statsResult](t, runArgs(t, args("stats", "--json")...)); st.TotalRows != 4 {
		t.Fatalf("the dry run removed rows: %+v", st)
	}
	r = runArgs(t, args("maintain", "--retention-days", "30")...)
	expectCode(t, r, exitOK)
	st = decodeJSON[statsResult](t, runArgs(t, args("stats", "--json", "--retention-days", "30")...))
	if st.TotalRows != 2 || st.ExpiredRows != 0 {
		t.Errorf("stats after maintain: %+v\n%v", st, r)
	}
}

// TestMySQLOutboxEpoch: the outbox's source id, made by the printed DDL,
// kept by migrate; the epoch shown and bumped.
func TestMySQLOutboxEpoch(t *testing.T) {
	dsn := mysqlDSN(t, nil)
	table := "inboxctl_t_" + conformance.RandomSuffix()
	db := openGorm(t, dialectMySQL, dsn)
	t.Cleanup(func() {
		for _, suffix := range []string{"", "_shards", "_relay", "_source"} {
			db.Exec("DROP TABLE IF EXISTS `" + table + suffix + "`")
		}
	})
	expectOutboxEpoch(t, dialectMySQL, db, "--dsn", dsn, "--table", table)
}

// TestMySQLWatermarks: migrate makes the watermark table next to the inbox
// table, and watermarks lists what SaveWatermarks wrote.
func TestMySQLWatermarks(t *testing.T) {
	dsn := mysqlDSN(t, nil)
	table := "inboxctl_t_" + conformance.RandomSuffix()
	db := openGorm(t, dialectMySQL, dsn)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_watermarks`") })
	store, err := inboxmysql.New(inboxmysql.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	expectWatermarks(t, db, store, "`"+table+"_watermarks`", "--dsn", dsn, "--table", table)
}
