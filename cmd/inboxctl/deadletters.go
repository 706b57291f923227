package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/header"
)

var deadLettersSpec = cmdSpec{
	name: "deadletters",
	synopsis: `List, inspect or redrive the dead letters on a dead-letter topic (the
consumer's Config.Failure.DeadLetterTopic). The first argument is the action:

  list     one line per dead letter: its partition and offset, the original
           topic/partition/offset, event id, dlq_reason, attempts, when it
           was dead-lettered and the error, truncated to --width
  inspect  each dead letter in full: every header, the key and the value
           (up to --max-value bytes); pick one with --partition and --offset
  redrive  copy each dead letter back onto its original topic (dlq_topic)
           and partition (dlq_partition), with its key, value and headers as
           they are plus dlq_redriven_from = "topic/partition/offset" (the
           dead letter's own place, for audit), at --rate messages per
           second, acks=all. --dry-run prints what would be sent

Every action reads each partition of --topic from the log start (or, with
--since, from the first dead letter whose Kafka timestamp, the original
message's, is at or after that time) up to the log end as it was when the
command started, so it ends; dead letters produced meanwhile wait for the
next run. The filters (--reason, --original-topic, --from, --to, --partition,
--offset) select which dead letters an action sees; --from and --to compare
the dead-lettering time (dlq_time). A message without dlq_topic is not a
dead letter of this library: it is counted and skipped.

A redriven copy is consumed like any message, but its sequence headers stay
renamed (dlq_inbox_seq ...), so the consumer deduplicates it by its inbox
row, never by a watermark: an event applied already (redriven twice, or
applied by an earlier copy) is skipped, so a redrive that stopped half way
can be run again. Fix what made the handler fail before redriving: a copy
that fails again is dead-lettered again, with the dlq_* headers of both
failures (the later ones last, which is what this command reads).`,
	examples: `  inboxctl deadletters list --brokers kafka:9092 --topic orders.dlq
  inboxctl deadletters list --topic orders.dlq --reason handler-error --from 2026-12-01T00:00:00Z --json
  inboxctl deadletters inspect --topic orders.dlq --partition 0 --offset 42
  inboxctl deadletters redrive --topic orders.dlq --original-topic orders --dry-run
  inboxctl deadletters redrive --topic orders.dlq --original-topic orders --rate 50 --limit 1000
`,
}

const deadLetterActions = "list, inspect or redrive"

// deadLetterQuery selects the dead letters an action sees.
type deadLetterQuery struct {
	brokers       []string
	topic         string    // the dead-letter topic
	partition     int       // -1: every partition
	offset        int64     // -1: every offset
	since         time.Time // zero: from the log start
	reasons       []string  // empty: every reason
	originalTopic string
	from, to      time.Time // dlq_time bounds, inclusive; zero: none
	limit         int       // 0: no limit
	// idle is how long a partition may deliver nothing before its end
	// offset is reached (transaction markers or compaction at the end of
	// the log): it is then given up, with a note.
	idle time.Duration
}

// deadLetter is one dead letter as read from the dead-letter topic.
type deadLetter struct {
	Partition         int       `json:"partition"` // in the dead-letter topic
	Offset            int64     `json:"offset"`
	Timestamp         time.Time `json:"timestamp"` // the Kafka timestamp: the original message's
	OriginalTopic     string    `json:"original_topic"`
	OriginalPartition string    `json:"original_partition"`
	OriginalOffset    string    `json:"original_offset"`
	EventID           string    `json:"event_id,omitempty"`
	Reason            string    `json:"reason"`
	Attempts          string    `json:"attempts,omitempty"`
	Time              string    `json:"time"` // dlq_time
	Group             string    `json:"group,omitempty"`
	Consumer          string    `json:"consumer,omitempty"`
	Error             string    `json:"error"`
	RedrivenFrom      string    `json:"redriven_from,omitempty"` // a copy dead-lettered again
	// For inspect only.
	Headers     []headerJSON `json:"headers,omitempty"`
	Key         *string      `json:"key,omitempty"`
	Value       *string      `json:"value,omitempty"`
	ValueBytes  int          `json:"value_bytes"`
	ValueBinary bool         `json:"value_binary,omitempty"` // Value is hex

	msg kafka.Message
}

type headerJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// lastHeader returns the value of the last header named k: a copy
// dead-lettered again carries both failures' dlq_* headers, the later last.
func lastHeader(hs []kafka.Header, k string) (string, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == k {
			return string(hs[i].Value), true
		}
	}
	return "", false
}

// parseDeadLetter reads the dlq_* headers of m; ok is false when m has no
// dlq_topic (not a dead letter of this library).
func parseDeadLetter(m kafka.Message) (deadLetter, bool) {
	h := func(k string) string { v, _ := lastHeader(m.Headers, k); return v }
	d := deadLetter{
		Partition: m.Partition, Offset: m.Offset, Timestamp: m.Time.UTC(),
		OriginalTopic: h(header.DLQTopic), OriginalPartition: h(header.DLQPartition), OriginalOffset: h(header.DLQOffset),
		EventID: h(header.DLQEventID), Reason: h(header.DLQReason), Attempts: h(header.DLQAttempts),
		Time: h(header.DLQTime), Group: h(header.DLQGroup), Consumer: h(header.DLQConsumer),
		Error: h(header.DLQError), RedrivenFrom: h(header.DLQRedrivenFrom),
		ValueBytes: len(m.Value), msg: m,
	}
	_, ok := lastHeader(m.Headers, header.DLQTopic)
	return d, ok && d.OriginalTopic != ""
}

// match reports whether d passes the query's filters.
func (q *deadLetterQuery) match(d deadLetter) bool {
	if q.offset >= 0 && d.Offset != q.offset {
		return false
	}
	if len(q.reasons) > 0 && !slices.Contains(q.reasons, d.Reason) {
		return false
	}
	if q.originalTopic != "" && d.OriginalTopic != q.originalTopic {
		return false
	}
	if !q.from.IsZero() || !q.to.IsZero() {
		t, err := time.Parse(time.RFC3339Nano, d.Time)
		if err != nil {
			return false // no dlq_time: cannot be said to be in the window
		}
		if !q.from.IsZero() && t.Before(q.from) || !q.to.IsZero() && t.After(q.to) {
			return false
		}
	}
	return true
}

// scanStats counts what a scan read.
type scanStats struct {
	Read    int `json:"read"`    // messages read
	Foreign int `json:"foreign"` // messages without dlq_topic, skipped
	Matched int `json:"matched"`
	// Incomplete lists the partitions given up before their end offset.
	Incomplete []string `json:"incomplete,omitempty"`
}

// errStopScan ends a scan early without an error.
var errStopScan = errors.New("stop scan")

// scanDeadLetters reads the dead letters q selects, partition by
// partition in offset order, from the start (or q.since) up to the end
// offsets read when it starts, and calls fn with each; fn returning
// errStopScan ends the scan.
func scanDeadLetters(ctx context.Context, q *deadLetterQuery, stderr io.Writer, fn func(deadLetter) error) (scanStats, error) {
	var st scanStats
	k := newKafkaClient(q.brokers)
	parts, err := k.partitions(ctx, q.topic)
	if err != nil {
		return st, err
	}
	if q.partition >= 0 {
		if !slices.Contains(parts, q.partition) {
			return st, usageErrorf("topic %s has no partition %d (it has %d)", q.topic, q.partition, len(parts))
		}
		parts = []int{q.partition}
	}
	bounds, err := k.bounds(ctx, q.topic, parts)
	if err != nil {
		return st, err
	}
	starts := make(map[int]int64, len(parts))
	for _, p := range parts {
		starts[p] = bounds[p].start
	}
	if !q.since.IsZero() {
		if starts, err = k.offsetsForTime(ctx, q.topic, parts, q.since, bounds); err != nil {
			return st, err
		}
	}
	for _, p := range parts {
		start, end := max(starts[p], bounds[p].start), bounds[p].end
		if q.offset >= 0 {
			if q.offset < start || q.offset >= end {
				continue
			}
			start = q.offset
		}
		if start >= end {
			continue
		}
		err := scanPartition(ctx, q, p, start, end, &st, stderr, fn)
		if errors.Is(err, errStopScan) {
			return st, nil
		}
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

func scanPartition(ctx context.Context, q *deadLetterQuery, p int, start, end int64, st *scanStats, stderr io.Writer, fn func(deadLetter) error) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: q.brokers, Topic: q.topic, Partition: p,
		MinBytes: 1, MaxBytes: 11 << 20, MaxWait: 500 * time.Millisecond,
		IsolationLevel: kafka.ReadCommitted,
	})
	defer r.Close()
	if err := r.SetOffset(start); err != nil {
		return fmt.Errorf("read %s/%d from offset %d: %w", q.topic, p, start, err)
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, q.idle)
		m, err := r.ReadMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				// Nothing more before the end offset: transaction markers,
				// aborted or compacted messages fill the rest.
				fmt.Fprintf(stderr, "inboxctl deadletters: %s/%d: nothing more to read after %v before its end offset %d; stopped there\n",
					q.topic, p, q.idle, end)
				st.Incomplete = append(st.Incomplete, fmt.Sprintf("%s/%d", q.topic, p))
				return nil
			}
			return fmt.Errorf("read %s/%d: %w", q.topic, p, err)
		}
		if m.Offset >= end {
			return nil
		}
		st.Read++
		d, ok := parseDeadLetter(m)
		switch {
		case !ok:
			st.Foreign++
		case q.match(d):
			st.Matched++
			if err := fn(d); err != nil {
				return err
			}
			if q.limit > 0 && st.Matched >= q.limit {
				return errStopScan
			}
		}
		if q.offset >= 0 || m.Offset+1 >= end {
			return nil
		}
	}
}

// redriveResult is what a redrive did.
type redriveResult struct {
	Topic     string          `json:"topic"`
	DryRun    bool            `json:"dry_run"`
	Stats     scanStats       `json:"scan"`
	Redriven  []redriveRecord `json:"redriven"`
	Failed    int             `json:"failed"`
	FirstFail string          `json:"first_failure,omitempty"`
}

type redriveRecord struct {
	From      string `json:"from"` // the dead letter: topic/partition/offset
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	EventID   string `json:"event_id,omitempty"`
	Reason    string `json:"reason"`
}

// redriveOptions are redrive's own settings.
type redriveOptions struct {
	dryRun bool
	rate   float64 // messages per second
	// progress, if set, is called after each message is sent (or would
	// be, on a dry run).
	progress func(redriveRecord)
}

// redriveMessage is the copy of d that a redrive writes: its key, value,
// headers and timestamp as they are, plus the audit header.
func redriveMessage(topic string, d deadLetter) kafka.Message {
	hs := make([]kafka.Header, 0, len(d.msg.Headers)+1)
	hs = append(hs, d.msg.Headers...)
	hs = append(hs, kafka.Header{Key: header.DLQRedrivenFrom, Value: []byte(fmt.Sprintf("%s/%d/%d", topic, d.Partition, d.Offset))})
	return kafka.Message{Topic: d.OriginalTopic, Key: d.msg.Key, Value: d.msg.Value, Headers: hs, Time: d.msg.Time}
}

// redrive copies the dead letters q selects back onto their original
// topics and partitions, one at a time with acks=all, at o.rate per second.
// It stops at the first dead letter it cannot send (an original topic that
// is gone, a partition it no longer has, a write the brokers refuse): what
// was sent before stays sent, and the result says how far it got.
func redrive(ctx context.Context, q *deadLetterQuery, o redriveOptions, stderr io.Writer) (redriveResult, error) {
	res := redriveResult{Topic: q.topic, DryRun: o.dryRun, Redriven: []redriveRecord{}}
	k := newKafkaClient(q.brokers)
	known := map[string][]int{} // original topic: its partitions
	w := &kafka.Writer{
		Addr:         kafka.TCP(q.brokers...),
		Balancer:     dlqPartition{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    1,
		BatchBytes:   12 << 20,
		MaxAttempts:  5,
	}
	defer w.Close()
	var interval time.Duration
	if o.rate > 0 {
		interval = time.Duration(float64(time.Second) / o.rate)
	}
	var next time.Time
	stats, err := scanDeadLetters(ctx, q, stderr, func(d deadLetter) error {
		rec := redriveRecord{From: fmt.Sprintf("%s/%d/%d", q.topic, d.Partition, d.Offset), Topic: d.OriginalTopic, EventID: d.EventID, Reason: d.Reason}
		fail := func(err error) error {
			res.Failed++
			res.FirstFail = rec.From + ": " + err.Error()
			return err
		}
		p, err := strconv.Atoi(d.OriginalPartition)
		if err != nil || p < 0 {
			return fail(fmt.Errorf("dead letter %s: its %s header %q is not a partition number", rec.From, header.DLQPartition, d.OriginalPartition))
		}
		rec.Partition = p
		parts, ok := known[d.OriginalTopic]
		if !ok {
			if parts, err = k.partitions(ctx, d.OriginalTopic); err != nil {
				return fail(fmt.Errorf("dead letter %s: %w", rec.From, err))
			}
			known[d.OriginalTopic] = parts
		}
		if !slices.Contains(parts, p) {
			return fail(fmt.Errorf("dead letter %s: its original topic %s has no partition %d now (it has %d): was it recreated?", rec.From, d.OriginalTopic, p, len(parts)))
		}
		if !o.dryRun {
			if interval > 0 {
				if wait := time.Until(next); wait > 0 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(wait):
					}
				}
				next = time.Now().Add(interval)
			}
			if err := w.WriteMessages(ctx, redriveMessage(q.topic, d)); err != nil {
				return fail(fmt.Errorf("dead letter %s: write to %s/%d: %w", rec.From, d.OriginalTopic, p, err))
			}
		}
		res.Redriven = append(res.Redriven, rec)
		if o.progress != nil {
			o.progress(rec)
		}
		return nil
	})
	res.Stats = stats
	return res, err
}

// dlqPartition sends each redriven copy to its original partition, named
// by its dlq_partition header (checked before the write): the partition
// that holds its key's other events, whatever partitioner their producer
// used.
type dlqPartition struct{}

func (dlqPartition) Balance(m kafka.Message, partitions ...int) int {
	if v, ok := lastHeader(m.Headers, header.DLQPartition); ok {
		if p, err := strconv.Atoi(v); err == nil && slices.Contains(partitions, p) {
			return p
		}
	}
	return partitions[0] // not reached: redrive checked the partition
}

// timeFlag is a flag holding an RFC 3339 time (a date alone means its
// midnight, UTC).
type timeFlag struct{ t time.Time }

func (f *timeFlag) String() string {
	if f == nil || f.t.IsZero() {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

func (f *timeFlag) Set(s string) error {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			f.t = t.UTC()
			return nil
		}
	}
	return errors.New("want an RFC 3339 time (2026-12-01T08:00:00Z) or a date (2026-12-01, UTC)")
}

func runDeadLetters(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "deadletters"
	action := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("inboxctl "+cmd, flag.ContinueOnError)
	fs.Usage = func() { printHelp(fs.Output(), fs, deadLettersSpec) }
	brokers := fs.String("brokers", "", "the Kafka `brokers`, comma-separated (default $"+brokersEnv+")")
	topic := fs.String("topic", "", "the dead-letter `topic` to read (the consumer's Config.Failure.DeadLetterTopic); required")
	var partition partitionFlag
	fs.Var(&partition, "partition", "only this `partition` of the dead-letter topic")
	offset := fs.Int64("offset", -1, "only the dead letter at this `offset` (with --partition, unless the topic has one)")
	reasons := fs.String("reason", "", "only these dlq_reason `values`, comma-separated (handler-error, no-event-id, invalid, expired)")
	originalTopic := fs.String("original-topic", "", "only dead letters of this original `topic` (dlq_topic)")
	var since, from, to timeFlag
	fs.Var(&since, "since", "start each partition at the first dead letter whose Kafka timestamp (the original message's) is at or after this `time`: skips older ones fast")
	fs.Var(&from, "from", "only dead letters dead-lettered (dlq_time) at or after this `time`")
	fs.Var(&to, "to", "only dead letters dead-lettered (dlq_time) at or before this `time`")
	limit := fs.Int("limit", 0, "stop after this `many` matching dead letters (0: no limit)")
	width := fs.Int("width", 60, "list: truncate the error and event id to this many `characters` (0: no limit)")
	maxValue := fs.Int("max-value", 4096, "inspect: show up to this many `bytes` of each key and value (0: no limit)")
	dryRun := fs.Bool("dry-run", false, "redrive: send nothing; print what would be sent")
	rate := fs.Float64("rate", 10, "redrive: at most this many `messages` per second (0: no limit)")
	idle := fs.Duration("idle", 10*time.Second, "give a partition up when it delivers nothing for this `long` before its end offset")
	timeout := fs.Duration("timeout", time.Hour, "give up after this `duration`")
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, cmd, err)
	}
	switch action {
	case "list", "inspect", "redrive":
	case "":
		return fail(stderr, cmd, usageErrorf("missing action: %s", deadLetterActions))
	default:
		return fail(stderr, cmd, usageErrorf("unknown action %q: want %s", action, deadLetterActions))
	}
	q := &deadLetterQuery{
		brokers: splitBrokers(*brokers, true), topic: *topic, partition: -1, offset: *offset,
		since: since.t, originalTopic: *originalTopic, from: from.t, to: to.t, limit: *limit, idle: *idle,
	}
	if partition.set {
		q.partition = int(partition.n)
	}
	for _, r := range strings.Split(*reasons, ",") {
		if r = strings.TrimSpace(r); r != "" {
			q.reasons = append(q.reasons, r)
		}
	}
	switch {
	case len(q.brokers) == 0:
		return fail(stderr, cmd, usageErrorf("no brokers: pass --brokers or set $%s", brokersEnv))
	case q.topic == "":
		return fail(stderr, cmd, usageErrorf("--topic is required: the dead-letter topic to read"))
	case *offset < -1:
		return fail(stderr, cmd, usageErrorf("--offset must not be negative, got %d", *offset))
	case *limit < 0:
		return fail(stderr, cmd, usageErrorf("--limit must not be negative, got %d", *limit))
	case *rate < 0:
		return fail(stderr, cmd, usageErrorf("--rate must not be negative, got %v", *rate))
	case *width < 0 || *maxValue < 0:
		return fail(stderr, cmd, usageErrorf("--width and --max-value must not be negative"))
	case *idle <= 0 || *timeout <= 0:
		return fail(stderr, cmd, usageErrorf("--idle and --timeout must be positive"))
	case !q.from.IsZero() && !q.to.IsZero() && q.to.Before(q.from):
		return fail(stderr, cmd, usageErrorf("--to (%s) is before --from (%s)", to.String(), from.String()))
	}
	if action != "redrive" {
		var misplaced error
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "dry-run" || f.Name == "rate" {
				misplaced = usageErrorf("--%s is for redrive", f.Name)
			}
		})
		if misplaced != nil {
			return fail(stderr, cmd, misplaced)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if q.offset >= 0 && q.partition < 0 {
		parts, err := newKafkaClient(q.brokers).partitions(ctx, q.topic)
		if err != nil {
			return fail(stderr, cmd, err)
		}
		if len(parts) > 1 {
			return fail(stderr, cmd, usageErrorf("--offset needs --partition: topic %s has %d partitions", q.topic, len(parts)))
		}
	}

	switch action {
	case "list", "inspect":
		var found []deadLetter
		var tw *tabwriter.Writer
		if !*jsonOut && action == "list" {
			tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PARTITION\tOFFSET\tORIGINAL\tEVENT ID\tREASON\tATTEMPTS\tDEAD-LETTERED\tERROR")
		}
		st, err := scanDeadLetters(ctx, q, stderr, func(d deadLetter) error {
			if action == "inspect" {
				d.fillInspect(*maxValue)
			}
			switch {
			case *jsonOut:
				found = append(found, d)
			case tw != nil:
				fmt.Fprintf(tw, "%d\t%d\t%s/%s/%s\t%s\t%s\t%s\t%s\t%s\n", d.Partition, d.Offset,
					cell(d.OriginalTopic), cell(d.OriginalPartition), cell(d.OriginalOffset),
					cell(truncate(d.EventID, *width)), cell(d.Reason), d.Attempts, d.Time, truncate(oneLine(d.Error), *width))
			default:
				d.printInspect(stdout, q.topic)
			}
			return nil
		})
		if tw != nil {
			tw.Flush()
		}
		if err != nil {
			return fail(stderr, cmd, err)
		}
		if *jsonOut {
			if found == nil {
				found = []deadLetter{}
			}
			return writeJSON(stdout, stderr, cmd, struct {
				Topic       string       `json:"topic"`
				Stats       scanStats    `json:"scan"`
				DeadLetters []deadLetter `json:"dead_letters"`
			}{q.topic, st, found})
		}
		fmt.Fprintf(stdout, "%s: %d dead letter(s) matched of %d read", q.topic, st.Matched, st.Read)
		if st.Foreign > 0 {
			fmt.Fprintf(stdout, " (%d without dlq_topic skipped)", st.Foreign)
		}
		fmt.Fprintln(stdout)
		if q.offset >= 0 && st.Matched == 0 {
			return fail(stderr, cmd, fmt.Errorf("no dead letter at offset %d of %s matches", q.offset, q.topic))
		}
		return exitOK
	}

	res, err := redrive(ctx, q, redriveOptions{dryRun: *dryRun, rate: *rate, progress: func(r redriveRecord) {
		if *jsonOut {
			return
		}
		verb := "redriven"
		if *dryRun {
			verb = "would redrive"
		}
		fmt.Fprintf(stdout, "%s %s -> %s/%d event %s reason %s\n", verb, r.From, cell(r.Topic), r.Partition, cell(truncate(r.EventID, *width)), cell(r.Reason))
	}}, stderr)
	if *jsonOut {
		if code := writeJSON(stdout, stderr, cmd, res); code != exitOK {
			return code
		}
	} else {
		verb := "redriven"
		if *dryRun {
			verb = "would be redriven (dry run)"
		}
		fmt.Fprintf(stdout, "%s: %d dead letter(s) %s of %d read\n", q.topic, len(res.Redriven), verb, res.Stats.Read)
	}
	if err != nil {
		return fail(stderr, cmd, fmt.Errorf("%w (%d sent before it)", err, len(res.Redriven)))
	}
	return exitOK
}

// fillInspect sets the fields only inspect shows.
func (d *deadLetter) fillInspect(maxBytes int) {
	for _, h := range d.msg.Headers {
		d.Headers = append(d.Headers, headerJSON{Key: h.Key, Value: string(h.Value)})
	}
	show := func(b []byte) (string, bool) {
		if maxBytes > 0 && len(b) > maxBytes {
			b = b[:maxBytes]
		}
		if utf8.Valid(b) {
			return string(b), false
		}
		return fmt.Sprintf("%x", b), true
	}
	if d.msg.Key != nil {
		k, bin := show(d.msg.Key)
		if bin {
			k = "hex:" + k
		}
		d.Key = &k
	}
	v, bin := show(d.msg.Value)
	d.Value, d.ValueBinary = &v, bin
}

func (d *deadLetter) printInspect(w io.Writer, topic string) {
	fmt.Fprintf(w, "dead letter %s/%d/%d (timestamp %s)\n", topic, d.Partition, d.Offset, d.Timestamp.Format(time.RFC3339Nano))
	for _, h := range d.Headers {
		fmt.Fprintf(w, "  header %s: %s\n", h.Key, strconv.Quote(h.Value))
	}
	if d.Key != nil {
		fmt.Fprintf(w, "  key: %s\n", strconv.Quote(*d.Key))
	} else {
		fmt.Fprintln(w, "  key: none")
	}
	kind := ""
	if d.ValueBinary {
		kind = ", hex"
	}
	fmt.Fprintf(w, "  value (%d bytes%s): %s\n\n", d.ValueBytes, kind, strconv.Quote(*d.Value))
}

// truncate shortens s to n characters, marking the cut; n 0 keeps it.
func truncate(s string, n int) string {
	if n <= 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	if n <= 3 {
		return string(r[:n])
	}
	return string(r[:n-3]) + "..."
}

// oneLine joins the lines of an error text.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
