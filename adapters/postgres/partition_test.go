package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/storage"
	"github.com/jackc/pgx/v5/pgconn"
)

func day(s string) time.Time {
	d, err := time.Parse(time.DateOnly, s)
	if err != nil {
		panic(err)
	}
	return d
}

func days(ss ...string) []time.Time {
	var out []time.Time
	for _, s := range ss {
		out = append(out, day(s))
	}
	return out
}

func TestPartitionName(t *testing.T) {
	d := time.Date(2026, 3, 9, 23, 59, 0, 0, time.FixedZone("UTC+5", 5*3600)) // 18:59 UTC
	if got := partitionName("inbox_messages", d); got != "inbox_messages_p20260309" {
		t.Errorf("partitionName = %q", got)
	}
	for _, c := range []struct {
		name string
		ok   bool
		day  string
	}{
		{"inbox_messages_p20260309", true, "2026-03-09"},
		{"inbox_messages_default", false, ""},
		{"inbox_messages_p2026030", false, ""},
		{"inbox_messages_p202603090", false, ""},
		{"inbox_messages_p20261309", false, ""},
		{"inbox_messages_p2026-3-9", false, ""},
		{"other_p20260309", false, ""},
		{"inbox_messages_x_p20260309", false, ""},
	} {
		got, ok := parsePartitionName("inbox_messages", c.name)
		if ok != c.ok || (ok && !got.Equal(day(c.day))) {
			t.Errorf("parsePartitionName(%q) = %v, %v; want %s, %v", c.name, got, ok, c.day, c.ok)
		}
	}
	if got := bounds(day("2026-12-31")); got != `FOR VALUES FROM ('2026-12-31') TO ('2027-01-01')` {
		t.Errorf("bounds = %s", got)
	}
}

func TestNewValidatesNames(t *testing.T) {
	longest := strings.Repeat("t", MaxTableBytes)
	s, err := New(Options{Table: longest})
	if err != nil {
		t.Fatalf("table of %d bytes: %v", MaxTableBytes, err)
	}
	if n := len(partitionName(s.Table(), day("2026-01-01"))); n != 63 {
		t.Errorf("longest partition name is %d bytes, want 63", n)
	}
	if s.Schema() != DefaultSchema {
		t.Errorf("default schema %q", s.Schema())
	}
	for _, o := range []Options{
		{Table: longest + "t"},
		{Table: "inbox-messages"},
		{Table: `x"; DROP TABLE y; --`},
		{Schema: "1abc"},
		{Schema: strings.Repeat("s", 64)},
		{LockTimeout: -time.Second},
	} {
		if _, err := New(o); !errors.Is(err, storage.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", o, err)
		}
	}
	a, _ := New(Options{Schema: "a", Table: "b_c"})
	b, _ := New(Options{Schema: "a_b", Table: "c"})
	if a.lockKey == b.lockKey {
		t.Error("different tables share an advisory lock key")
	}
}

func TestPlanOps(t *testing.T) {
	plan := storage.MaintenancePlan{Today: day("2026-05-10"), PrepareThrough: day("2026-05-12"), ExpireBefore: day("2026-05-06")}
	ops := planOps(plan,
		days("2026-05-04", "2026-05-05", "2026-05-06", "2026-05-10", "2026-05-20"),
		days("2026-04-01", "2026-05-07"))
	check := func(what string, got, want []time.Time) {
		t.Helper()
		if !slices.EqualFunc(got, want, time.Time.Equal) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("create", ops.create, days("2026-05-11", "2026-05-12"))
	check("drop", ops.drop, days("2026-05-04", "2026-05-05"))
	check("leftover", ops.leftover, days("2026-04-01"))
	check("expired", ops.expiredDays(), days("2026-04-01", "2026-05-04", "2026-05-05"))

	// Nothing to do once done.
	ops = planOps(plan, days("2026-05-06", "2026-05-10", "2026-05-11", "2026-05-12"), nil)
	if len(ops.create)+len(ops.drop)+len(ops.leftover) != 0 {
		t.Errorf("second run plans %+v", ops)
	}

	// A plan that expires today never creates partitions it would drop.
	odd := storage.MaintenancePlan{Today: day("2026-05-10"), PrepareThrough: day("2026-05-11"), ExpireBefore: day("2026-05-11")}
	ops = planOps(odd, days("2026-05-10"), nil)
	check("odd create", ops.create, days("2026-05-11"))
	check("odd drop", ops.drop, days("2026-05-10"))
}

func TestIsMissingDay(t *testing.T) {
	s, _ := New(Options{Schema: "sch", Table: "inbox"})
	for _, c := range []struct {
		err  *pgconn.PgError
		want bool
	}{
		{&pgconn.PgError{Code: "23514", SchemaName: "sch", TableName: "inbox"}, true},
		{&pgconn.PgError{Code: "23514", SchemaName: "sch", TableName: "inbox_default", ConstraintName: "other"}, false},
		{&pgconn.PgError{Code: "23514", SchemaName: "sch", TableName: "inbox", ConstraintName: "a_check"}, false},
		{&pgconn.PgError{Code: "23514", SchemaName: "other", TableName: "inbox"}, false},
		{&pgconn.PgError{Code: "23514", SchemaName: "sch", TableName: "effects"}, false},
		{&pgconn.PgError{Code: "23505", SchemaName: "sch", TableName: "inbox"}, false},
	} {
		if got := s.IsMissingDay(fmt.Errorf("claim: %w", c.err)); got != c.want {
			t.Errorf("IsMissingDay(%+v) = %v, want %v", *c.err, got, c.want)
		}
	}
	if s.IsMissingDay(errors.New(`ERROR: no partition of relation "inbox" found for row (SQLSTATE 23514)`)) {
		t.Error("IsMissingDay trusted message text")
	}
	if !s.IsRetryable(&DayBusyError{Table: "inbox", Day: day("2026-01-01")}) {
		t.Error("a day whose partition is being detached is not retryable")
	}
}

func TestIsRetryable(t *testing.T) {
	s, _ := New(Options{})
	for code, want := range map[string]bool{
		"40001": true, "40P01": true, "55P03": true,
		"57P01": true, "57P02": true, "57P03": true, "08006": true, "08003": true, "08000": true,
		"23505": false, "25P02": false, "57014": false, "42P01": false, "22001": false,
	} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: "serialization failure"})
		if got := s.IsRetryable(err); got != want {
			t.Errorf("IsRetryable(SQLSTATE %s) = %v, want %v", code, got, want)
		}
	}
	if s.IsRetryable(errors.New("ERROR: could not serialize access due to concurrent update (SQLSTATE 40001)")) {
		t.Error("IsRetryable trusted message text")
	}
	// The routing race with a concurrent detach (TestDetachRaceIsRetryable
	// reproduces it) is retryable when the claim raised it, and only then.
	race := &pgconn.PgError{Code: "XX000", Message: "invalid arbiter index list", Routine: "ExecInitPartitionInfo"}
	if !s.IsRetryable(fmt.Errorf("begin and claim: %w", claimError(fmt.Errorf("postgres: claim: %w", race)))) {
		t.Error("the claim's routing race with a concurrent detach is not retryable")
	}
	if s.IsRetryable(fmt.Errorf("statement: %w", race)) {
		t.Error("XX000 of ExecInitPartitionInfo raised by a statement other than the claim (a handler's own table) is retryable")
	}
	for _, pe := range []*pgconn.PgError{
		{Code: "XX000", Message: "invalid arbiter index list", Routine: "heap_insert"},
		{Code: "XX000", Message: "invalid arbiter index list"},
		{Code: "XX001", Routine: "ExecInitPartitionInfo"},
	} {
		if s.IsRetryable(claimError(pe)) {
			t.Errorf("claim error %+v is retryable: only XX000 raised in ExecInitPartitionInfo is", pe)
		}
	}
	if s.IsRetryable(nil) {
		t.Error("IsRetryable(nil)")
	}
	for _, err := range []error{driver.ErrBadConn, sql.ErrConnDone, io.ErrUnexpectedEOF, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}} {
		if !s.IsRetryable(fmt.Errorf("claim: %w", err)) {
			t.Errorf("IsRetryable(%v) = false: a lost connection must retry the transaction", err)
		}
	}
	for _, err := range []error{context.Canceled, context.DeadlineExceeded} {
		if s.IsRetryable(fmt.Errorf("claim: %w", err)) {
			t.Errorf("IsRetryable(%v) = true: the caller's own context ended", err)
		}
	}
}
