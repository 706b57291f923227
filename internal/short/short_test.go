package short

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{strings.Repeat("x", Max), strings.Repeat("x", Max)},
		{strings.Repeat("x", Max+1), strings.Repeat("x", Max) + "..."},
		{strings.Repeat("x", 10000), strings.Repeat("x", Max) + "..."},
		// A character across the cut is left out whole.
		{strings.Repeat("x", Max-1) + "é" + "yy", strings.Repeat("x", Max-1) + "..."},
	} {
		if got := String(tc.in); got != tc.want {
			t.Errorf("String(%d bytes) = %q, want %q", len(tc.in), got, tc.want)
		}
		if got := String([]byte(tc.in)); got != tc.want {
			t.Errorf("String([]byte of %d bytes) = %q, want %q", len(tc.in), got, tc.want)
		}
	}
}

// A message's values are shortened in records, in With and in groups;
// other attributes (an error text, a stack) are left whole.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	long := strings.Repeat("x", 10000)
	l := Logger(slog.New(slog.NewTextHandler(&buf, nil)))
	if Logger(l) != l {
		t.Error("Logger of a shortening logger made another")
	}
	l.With("source", long).Info("m", "event_id", long, "key", long, "stack", long, slog.Group("g", "event_id", long))
	line := buf.String()
	short := strings.Repeat("x", Max) + "..."
	if n := strings.Count(line, short+" ") + strings.Count(line, short+"\n"); n != 4 {
		t.Errorf("%d shortened values, want 4 (source, event_id, key, g.event_id)", n)
	}
	if !strings.Contains(line, "stack="+long) {
		t.Error("the stack attribute was shortened")
	}
	if len(line) > len(long)+500 {
		t.Errorf("line of %d bytes", len(line))
	}
	buf.Reset()
	l.Info("m", "event_id", "evt-1")
	if !strings.Contains(buf.String(), "event_id=evt-1\n") {
		t.Errorf("a short value changed: %q", buf.String())
	}
}
