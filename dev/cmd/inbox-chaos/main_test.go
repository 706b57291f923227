package main

import (
	"bytes"
	"strings"
	"testing"
)

// The full run is make chaos; its short form is TestChaosShort in
// internal/chaos. Here only the command line is checked.
func TestUsageErrors(t *testing.T) {
	t.Setenv("INBOX_KAFKA_BROKERS", "127.0.0.1:1")
	for _, args := range [][]string{
		{"-orders", "0"},
		{"-dup", "2"},
		{"-kills", "-1"},
		{"-batch", "-1"},
		{"-db", "oracle"},
		{"stray"},
		{"-no-such-flag"},
		{"-phases", "storm"},
		{"-fault-batches", "0"},
		{"-fault-max-attempts", "1"},
		{"-chain-orders", "0"},
		{"-chain-kills", "-1"},
		{"-gap-rounds", "0"},
		{"-gap-orders", "-1"},
		{"-pauses", "0"},
		{"-pause-for", "-1s"},
		{"-freezes", "0"},
		{"-partition-max-stall", "1s"},
		{"-partition-idle-tx-timeout", "10ms"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}

func TestNeedsBrokers(t *testing.T) {
	t.Setenv("INBOX_KAFKA_BROKERS", "")
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "make chaos") {
		t.Fatalf("exit %d, stderr %q: want 2 and a pointer to make chaos", code, errOut.String())
	}
}
