package inbox_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// FuzzMessageValidate: validation never panics, accepts exactly the ids the
// contract allows, and a valid message's row carries the id and consumer
// byte for byte.
func FuzzMessageValidate(f *testing.F) {
	for _, s := range []string{"", "a", "order-1", "\xff", "a\x00b", strings.Repeat("x", 256), "注文", "'; DROP TABLE x; --"} {
		f.Add("consumer", s, int64(1764460800), int32(0), int64(0))
	}
	f.Fuzz(func(t *testing.T, consumer, id string, unix int64, partition int32, offset int64) {
		m := inbox.Message{Consumer: consumer, ID: id, Time: time.Unix(unix, 0), Partition: partition, Offset: offset, Topic: "orders"}
		err := m.Validate()
		ok := func(s string, max int) bool {
			return s != "" && len(s) <= max && utf8.ValidString(s) && !strings.Contains(s, "\x00")
		}
		year := m.Time.UTC().Year()
		want := ok(consumer, storage.MaxConsumerBytes) && ok(id, storage.MaxEventIDBytes) && year >= 1970 && year <= 9999 && partition >= 0 && offset >= 0
		if want != (err == nil) {
			t.Fatalf("Validate(%q, %q, %v) = %v, want valid=%v", consumer, id, m.Time, err, want)
		}
		if err != nil {
			if !errors.Is(err, inbox.ErrInvalidMessage) {
				t.Fatalf("error %v does not wrap ErrInvalidMessage", err)
			}
			_ = err.Error()
			return
		}
		r := storage.InboxRow{Consumer: m.Consumer, EventID: m.ID, Day: m.Day()}
		if r.EventID != id || r.Consumer != consumer || !r.Day.Equal(storage.DayOf(m.Time)) || r.Day.After(m.Time) || m.Time.Sub(r.Day) >= 24*time.Hour {
			t.Fatalf("row %+v does not match message %+v", r, m)
		}
	})
}

var plainIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// FuzzValidateIdentifier: only plain ASCII identifiers of at most 63 bytes
// pass, so a configured name can never carry SQL.
func FuzzValidateIdentifier(f *testing.F) {
	for _, s := range []string{"inbox", "", "a;b", `x"`, "1a", "ä", strings.Repeat("a", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := storage.ValidateIdentifier("table", name)
		want := len(name) <= 63 && plainIdentifier.MatchString(name)
		if want != (err == nil) {
			t.Fatalf("ValidateIdentifier(%q) = %v, want valid=%v", name, err, want)
		}
	})
}
