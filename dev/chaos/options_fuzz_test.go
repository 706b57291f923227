package chaos_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/inbox"
)

var plainName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// FuzzAdapterOptions: the adapters' constructors never panic, accept a table
// or schema name only if it is a plain identifier (so a configured name can
// never carry SQL into the statements they build), keep the name as given,
// and report every refusal as inbox.ErrInvalidConfig.
func FuzzAdapterOptions(f *testing.F) {
	for _, s := range []string{"", "inbox_messages", "a;DROP TABLE x", "`x`", `"x"`, "x.y", "1a", "ä", "a b", "a\x00", strings.Repeat("t", 53), strings.Repeat("t", 54), strings.Repeat("t", 64)} {
		f.Add(s, "", int64(0))
		f.Add("inbox", s, int64(-1))
	}
	f.Fuzz(func(t *testing.T, table, schema string, n int64) {
		plain := func(s string) bool { return s == "" || plainName.MatchString(s) }
		check := func(adapter string, err error, want bool, gotTable string) {
			t.Helper()
			if want != (err == nil) {
				t.Fatalf("%s: table %q schema %q n %d: err %v, want accepted=%v", adapter, table, schema, n, err, want)
			}
			if err != nil {
				if !errors.Is(err, inbox.ErrInvalidConfig) {
					t.Fatalf("%s: error %v does not wrap ErrInvalidConfig", adapter, err)
				}
				_ = err.Error()
				return
			}
			if table != "" && gotTable != table {
				t.Fatalf("%s: table %q became %q", adapter, table, gotTable)
			}
		}

		s, err := inboxsqlite.New(inboxsqlite.Options{Table: table, DeleteBatch: int(n)})
		var got string
		if err == nil {
			got = s.Table()
		}
		check("sqlite", err, plain(table) && n >= 0, got)

		p, err := inboxpg.New(inboxpg.Options{Table: table, Schema: schema})
		got = ""
		if err == nil {
			got = p.Table()
			if schema != "" && p.Schema() != schema {
				t.Fatalf("postgres: schema %q became %q", schema, p.Schema())
			}
		}
		check("postgres", err, plain(table) && plain(schema) && len(table) <= inboxpg.MaxTableBytes, got)

		m, err := inboxmysql.New(inboxmysql.Options{Table: table, Schema: schema, InitialDays: int(n)})
		got = ""
		if err == nil {
			got = m.Table()
		}
		check("mysql", err, plain(table) && plain(schema) && n >= 0, got)
	})
}

// FuzzMySQLStrictDSN: StrictDSN never panics; what it accepts it returns as
// a DSN that parses again and turns on strict mode unless sql_mode was
// given; what it refuses is inbox.ErrInvalidConfig.
func FuzzMySQLStrictDSN(f *testing.F) {
	for _, s := range []string{"inbox:inbox@tcp(127.0.0.1:3306)/inbox_test?parseTime=true&loc=UTC", "", "/", "u@/db?sql_mode=ANSI", "u:p@unix(/tmp/s)/d", "@tcp(", "u@tcp(h)/d?x=%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		strict, err := inboxmysql.StrictDSN(dsn)
		if err != nil {
			if !errors.Is(err, inbox.ErrInvalidConfig) {
				t.Fatalf("StrictDSN(%q): error %v does not wrap ErrInvalidConfig", dsn, err)
			}
			return
		}
		again, err := inboxmysql.StrictDSN(strict)
		if err != nil {
			t.Fatalf("StrictDSN(%q) = %q, which does not parse again: %v", dsn, strict, err)
		}
		if again != strict {
			t.Fatalf("StrictDSN is not idempotent: %q -> %q -> %q", dsn, strict, again)
		}
		if !strings.Contains(strict, "sql_mode=") {
			t.Fatalf("StrictDSN(%q) = %q sets no sql_mode", dsn, strict)
		}
	})
}
