package mysql

import (
	"errors"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// Tests that need no server.

func TestParseVersion(t *testing.T) {
	for _, c := range []struct {
		in        string
		mariadb   bool
		supported bool
	}{
		{"10.11.19-MariaDB-0+deb12u1", true, true},
		{"10.4.34-MariaDB", true, false},
		{"11.4.2-MariaDB-log", true, true},
		{"8.0.36", false, true},
		{"8.4.0-commercial", false, true},
		{"5.7.44-log", false, false},
	} {
		v := parseVersion(c.in)
		if v.MariaDB != c.mariadb || v.Supported() != c.supported {
			t.Errorf("%s: %+v (supported %v), want MariaDB %v, supported %v", c.in, v, v.Supported(), c.mariadb, c.supported)
		}
	}
}

func TestStrictDSN(t *testing.T) {
	dsn, err := StrictDSN("u:p@tcp(127.0.0.1:3306)/db?parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cfg.Params["sql_mode"], "STRICT_TRANS_TABLES") || !cfg.ParseTime || !cfg.InterpolateParams {
		t.Errorf("StrictDSN gave %q, want strict mode, the caller's parseTime, and interpolateParams (fewer round trips)", dsn)
	}
	dsn, err = StrictDSN("u:p@tcp(127.0.0.1:3306)/db?sql_mode=%27ANSI%27")
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _ := gomysql.ParseDSN(dsn); cfg.Params["sql_mode"] != "'ANSI'" {
		t.Errorf("StrictDSN replaced the caller's sql_mode: %q", dsn)
	}
	if _, err := StrictDSN("not a dsn"); !errors.Is(err, storage.ErrInvalidConfig) {
		t.Errorf("bad DSN: %v", err)
	}
}

func TestCheckRow(t *testing.T) {
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	good := storage.InboxRow{Consumer: "c", EventID: "e", Day: storage.DayOf(at), EventTime: at, Topic: "t"}
	if err := checkRow(good); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*storage.InboxRow){
		"long id":          func(r *storage.InboxRow) { r.EventID = strings.Repeat("x", storage.MaxEventIDBytes+1) },
		"long consumer":    func(r *storage.InboxRow) { r.Consumer = strings.Repeat("x", storage.MaxConsumerBytes+1) },
		"empty id":         func(r *storage.InboxRow) { r.EventID = "" },
		"long topic":       func(r *storage.InboxRow) { r.Topic = strings.Repeat("t", topicColumnBytes+1) },
		"bad utf8":         func(r *storage.InboxRow) { r.EventID = "\xff" },
		"year 999":         func(r *storage.InboxRow) { r.Day = time.Date(999, 1, 1, 0, 0, 0, 0, time.UTC) },
		"day not midnight": func(r *storage.InboxRow) { r.Day = r.Day.Add(time.Hour) },
	} {
		r := good
		mutate(&r)
		if err := checkRow(r); !errors.Is(err, inbox.ErrInvalidMessage) {
			t.Errorf("%s: %v, want ErrInvalidMessage", name, err)
		}
	}
}

func TestIsRetryable(t *testing.T) {
	s := &Store{}
	for n, want := range map[uint16]bool{1213: true, 1205: true, 1412: true, 1020: true, 1062: false, 1526: false, 1406: false} {
		if got := s.IsRetryable(&gomysql.MySQLError{Number: n}); got != want {
			t.Errorf("error %d: retryable %v, want %v", n, got, want)
		}
	}
	if !s.IsRetryable(&LockBusyError{Table: "t", Wait: time.Second}) || !s.IsRetryable(gomysql.ErrInvalidConn) || s.IsRetryable(errors.New("deadlock")) {
		t.Error("non-MySQL errors misclassified")
	}
}
