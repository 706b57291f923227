package chaos

import "testing"

func TestErrorLogGroupsByMessageAndError(t *testing.T) {
	e := &errorLog{kinds: map[string]*errorKind{}}
	e.add(`time=2026-11-30T03:00:00Z level=ERROR msg="the batch could not commit; retrying it" consumer=consumer-3 messages=10 attempt=5 error="FATAL: terminating connection due to administrator command (SQLSTATE 57P01)" retry_in=1.6s`)
	e.add(`time=2026-11-30T03:00:01Z level=ERROR msg="the batch could not commit; retrying it" consumer=consumer-4 messages=3 attempt=6 error="FATAL: terminating connection due to administrator command (SQLSTATE 57P01)" retry_in=3.2s`)
	e.add(`time=2026-11-30T03:00:02Z level=ERROR msg="PARTITION STOPPED: x" error="a \"quoted\" thing"`)
	n, kinds := e.summary()
	if n != 3 || len(kinds) != 2 {
		t.Fatalf("summary = %d, %q", n, kinds)
	}
	want := `2x the batch could not commit; retrying it: FATAL: terminating connection due to administrator command (SQLSTATE 57P01)`
	if kinds[0] != want {
		t.Fatalf("kinds[0] = %q, want %q", kinds[0], want)
	}
	if kinds[1] != `1x PARTITION STOPPED: x: a \"quoted\" thing` {
		t.Fatalf("kinds[1] = %q", kinds[1])
	}
}
