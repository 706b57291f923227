package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
)

// dlqMessage builds a dead letter as the consumer writes it: the original
// headers (sequence headers renamed), then the dlq_* ones.
func dlqMessage(dlqPartition int, key, value, topic string, partition int, offset int64, eventID, reason, at, errText string) kafka.Message {
	hs := []kafka.Header{
		{Key: header.EventID, Value: []byte(eventID)},
		{Key: header.EventTime, Value: []byte("2026-11-30T09:00:00Z")},
		{Key: header.DLQSequencePrefix + header.SeqSource, Value: []byte("src-1")},
		{Key: header.DLQSequencePrefix + header.Seq, Value: []byte("17")},
		{Key: header.DLQError, Value: []byte(errText)},
		{Key: header.DLQReason, Value: []byte(reason)},
		{Key: header.DLQTopic, Value: []byte(topic)},
		{Key: header.DLQPartition, Value: []byte(strconv.Itoa(partition))},
		{Key: header.DLQOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		{Key: header.DLQGroup, Value: []byte("billing")},
		{Key: header.DLQAttempts, Value: []byte("5")},
		{Key: header.DLQTime, Value: []byte(at)},
		{Key: header.DLQEventID, Value: []byte(eventID)},
	}
	return kafka.Message{Partition: dlqPartition, Key: []byte(key), Value: []byte(value), Headers: hs}
}

type listJSON struct {
	Topic string    `json:"topic"`
	Stats scanStats `json:"scan"`
	DL    []struct {
		Partition     int     `json:"partition"`
		Offset        int64   `json:"offset"`
		OriginalTopic string  `json:"original_topic"`
		EventID       string  `json:"event_id"`
		Reason        string  `json:"reason"`
		Error         string  `json:"error"`
		Value         *string `json:"value"`
		Headers       []headerJSON
	} `json:"dead_letters"`
}

// TestDeadLettersListInspectRedrive lists, filters, inspects, dry-runs and
// redrives dead letters on the real broker: the redriven copies land on
// their original topic and partition with the dead letter's key, value and
// headers unchanged (sequence headers still renamed) plus the audit header.
func TestDeadLettersListInspectRedrive(t *testing.T) {
	brokers := testBrokers(t)
	orders := newTopic(t, brokers, "orders", 3)
	other := newTopic(t, brokers, "other", 1)
	dlq := newTopic(t, brokers, "orders-dlq", 2)
	long := strings.Repeat("decode: unexpected end of JSON input ", 10)
	produce(t, brokers, dlq,
		dlqMessage(0, "k1", `{"id":1}`, orders, 2, 7, "e1", "handler-error", "2026-12-01T10:00:00Z", long),
		dlqMessage(0, "k2", `{"id":2}`, orders, 0, 3, "e2", "invalid", "2026-12-02T10:00:00Z", "bad"),
		dlqMessage(1, "k3", `{"id":3}`, other, 0, 1, "e3", "handler-error", "2026-12-03T10:00:00Z", "boom\nsecond line"),
		kafka.Message{Partition: 1, Key: []byte("x"), Value: []byte("not a dead letter")},
		dlqMessage(1, "k4", `{"id":4}`, orders, 1, 9, "e4", "handler-error", "2026-12-04T10:00:00Z", "again"),
	)
	b := brokersArg(brokers)

	r := runArgs(t, "deadletters", "list", "--brokers", b, "--topic", dlq)
	expectCode(t, r, exitOK)
	for _, want := range []string{"PARTITION  OFFSET", orders + "/2/7", "e1", "handler-error", "2026-12-01T10:00:00Z",
		"decode: unexpected end of JSON input decode: unexpected e...\n", "  boom second line\n",
		dlq + ": 4 dead letter(s) matched of 5 read (1 without dlq_topic skipped)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("list lacks %q:\n%v", want, r)
		}
	}
	if strings.Contains(r.stdout, long) {
		t.Errorf("list did not truncate the error:\n%v", r)
	}

	ids := func(args ...string) []string {
		t.Helper()
		r := runArgs(t, append([]string{"deadletters", "list", "--brokers", b, "--topic", dlq, "--json"}, args...)...)
		expectCode(t, r, exitOK)
		var out []string
		for _, d := range decodeJSON[listJSON](t, r).DL {
			out = append(out, d.EventID)
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"e1", "e2", "e3", "e4"}},
		{[]string{"--reason", "handler-error"}, []string{"e1", "e3", "e4"}},
		{[]string{"--reason", "invalid,expired"}, []string{"e2"}},
		{[]string{"--original-topic", orders}, []string{"e1", "e2", "e4"}},
		{[]string{"--from", "2026-12-02T00:00:00Z", "--to", "2026-12-03T12:00:00Z"}, []string{"e2", "e3"}},
		{[]string{"--from", "2026-12-04"}, []string{"e4"}},
		{[]string{"--partition", "1"}, []string{"e3", "e4"}},
		{[]string{"--reason", "handler-error", "--original-topic", orders, "--limit", "1"}, []string{"e1"}},
		{[]string{"--reason", "nope"}, nil},
		{[]string{"--since", "2000-01-01"}, []string{"e1", "e2", "e3", "e4"}},
		{[]string{"--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, nil},
	} {
		if got := ids(c.args...); !slices.Equal(got, c.want) {
			t.Errorf("list %v: got %v, want %v", c.args, got, c.want)
		}
	}

	r = runArgs(t, "deadletters", "inspect", "--brokers", b, "--topic", dlq, "--partition", "0", "--offset", "1")
	expectCode(t, r, exitOK)
	for _, want := range []string{"dead letter " + dlq + "/0/1", `header dlq_reason: "invalid"`, `header dlq_inbox_seq: "17"`, `key: "k2"`, `value (8 bytes): "{\"id\":2}"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect lacks %q:\n%v", want, r)
		}
	}
	r = runArgs(t, "deadletters", "inspect", "--brokers", b, "--topic", dlq, "--partition", "0", "--offset", "5")
	expectCode(t, r, exitFailed)
	r = runArgs(t, "deadletters", "inspect", "--brokers", b, "--topic", dlq, "--offset", "1")
	expectCode(t, r, exitUsage)

	// Dry run: says what it would send, sends nothing.
	r = runArgs(t, "deadletters", "redrive", "--brokers", b, "--topic", dlq, "--original-topic", orders, "--reason", "handler-error", "--dry-run")
	expectCode(t, r, exitOK)
	for _, want := range []string{"would redrive " + dlq + "/0/0 -> " + orders + "/2 event e1", "would redrive " + dlq + "/1/2 -> " + orders + "/1 event e4", "2 dead letter(s) would be redriven (dry run)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run lacks %q:\n%v", want, r)
		}
	}
	if got := readAll(t, brokers, orders); len(got) != 0 {
		t.Fatalf("dry run wrote %d message(s) to %s", len(got), orders)
	}

	r = runArgs(t, "deadletters", "redrive", "--brokers", b, "--topic", dlq, "--original-topic", orders, "--reason", "handler-error", "--rate", "100")
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "redriven "+dlq+"/0/0 -> "+orders+"/2") || !strings.Contains(r.stdout, "2 dead letter(s) redriven of 5 read") {
		t.Errorf("redrive output:\n%v", r)
	}
	got := readAll(t, brokers, orders)
	if len(got) != 2 {
		t.Fatalf("want 2 redriven messages on %s, got %d", orders, len(got))
	}
	dead := readAll(t, brokers, dlq)
	byOffset := map[string]kafka.Message{}
	for _, m := range dead {
		byOffset[fmt.Sprintf("%d/%d", m.Partition, m.Offset)] = m
	}
	for _, m := range got {
		hs := headerMap(m.Headers)
		from := hs[header.DLQRedrivenFrom]
		src, ok := byOffset[strings.TrimPrefix(from, dlq+"/")]
		if !ok || !strings.HasPrefix(from, dlq+"/") {
			t.Fatalf("redriven %s/%d has %s %q, not a dead letter's place", orders, m.Partition, header.DLQRedrivenFrom, from)
		}
		if string(m.Key) != string(src.Key) || string(m.Value) != string(src.Value) {
			t.Errorf("redriven copy of %s: key/value %s/%s, want %s/%s", from, m.Key, m.Value, src.Key, src.Value)
		}
		// The dead letter's headers, in order, then the audit header only.
		if len(m.Headers) != len(src.Headers)+1 {
			t.Fatalf("redriven copy of %s has %d headers, want %d", from, len(m.Headers), len(src.Headers)+1)
		}
		for i, h := range src.Headers {
			if m.Headers[i].Key != h.Key || string(m.Headers[i].Value) != string(h.Value) {
				t.Errorf("redriven copy of %s: header %d is %s=%s, want %s=%s", from, i, m.Headers[i].Key, m.Headers[i].Value, h.Key, h.Value)
			}
		}
		if _, live := hs[header.Seq]; live {
			t.Errorf("redriven copy of %s carries a live %s header", from, header.Seq)
		}
		if want, _ := strconv.Atoi(headerMap(src.Headers)[header.DLQPartition]); m.Partition != want {
			t.Errorf("redriven copy of %s went to partition %d, want its original %d", from, m.Partition, want)
		}
	}
}

// TestDeadLettersRedriveStopsAtAMissingTopic: a dead letter whose original
// topic is gone stops the redrive with exit status 1, naming it.
func TestDeadLettersRedriveStopsAtAMissingTopic(t *testing.T) {
	brokers := testBrokers(t)
	dlq := newTopic(t, brokers, "gone-dlq", 1)
	produce(t, brokers, dlq, dlqMessage(0, "k", "v", "no-such-topic-"+dlq, 0, 1, "e1", "handler-error", "2026-12-01T10:00:00Z", "x"))
	r := runArgs(t, "deadletters", "redrive", "--brokers", brokersArg(brokers), "--topic", dlq)
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "dead letter "+dlq+"/0/0: topic no-such-topic-"+dlq+" does not exist (0 sent before it)") {
		t.Errorf("stderr:\n%v", r)
	}
}

func TestDeadLettersUsage(t *testing.T) {
	t.Setenv(brokersEnv, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"deadletters"}, "missing action: list, inspect or redrive"},
		{[]string{"deadletters", "purge", "--brokers", "b:9092", "--topic", "d"}, `unknown action "purge"`},
		{[]string{"deadletters", "list", "--topic", "d"}, "no brokers: pass --brokers or set $INBOX_KAFKA_BROKERS"},
		{[]string{"deadletters", "list", "--brokers", "b:9092"}, "--topic is required"},
		{[]string{"deadletters", "list", "--brokers", "b:9092", "--topic", "d", "--dry-run"}, "--dry-run is for redrive"},
		{[]string{"deadletters", "list", "--brokers", "b:9092", "--topic", "d", "--from", "yesterday"}, "want an RFC 3339 time"},
		{[]string{"deadletters", "list", "--brokers", "b:9092", "--topic", "d", "--from", "2026-12-02", "--to", "2026-12-01"}, "--to (2026-12-01T00:00:00Z) is before --from"},
		{[]string{"deadletters", "redrive", "--brokers", "b:9092", "--topic", "d", "--rate", "-1"}, "--rate must not be negative"},
	} {
		r := runArgs(t, c.args...)
		expectCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: stderr lacks %q:\n%v", c.args, c.want, r)
		}
	}
	r := runArgs(t, "help", "deadletters")
	expectCode(t, r, exitOK)
	for _, want := range []string{"Usage: inboxctl deadletters [flags]", "--rate messages", "dlq_redriven_from", "Examples:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help lacks %q:\n%s", want, r.stdout)
		}
	}
}
