package chaos

import "testing"

func TestMarkLogCountsByLevel(t *testing.T) {
	m := newMarkLog()
	m.add(`time=2026-12-02T01:00:00Z level=WARN msg="partition taken over by a newer generation of the group: this member's generation is over" member_generation=3`)
	m.add(`time=2026-12-02T01:00:00Z level=INFO msg="message failed; nothing of it was committed" error="context canceled"`)
	m.add(`time=2026-12-02T01:00:01Z level=ERROR msg="message failed; nothing of it was committed" error="boom"`)
	m.add(`time=2026-12-02T01:00:01Z level=WARN msg="message failed; retrying"`)
	m.add(`time=2026-12-02T01:00:02Z level=WARN msg="fetch failed; retrying"`)
	for _, c := range []struct {
		level, pattern string
		want           int
	}{
		{"WARN", markFenced, 1},
		{"", markMessageFailed, 3},
		{"ERROR", markMessageFailed, 1},
		{"INFO", markMessageFailed, 1},
		{"", markStalled, 0},
	} {
		if got := m.count(c.level, c.pattern); got != c.want {
			t.Errorf("count(%q, %q) = %d, want %d", c.level, c.pattern, got, c.want)
		}
	}
	if s := m.summary(); len(s) != 4 {
		t.Errorf("summary %q, want 4 kinds", s)
	}
}
