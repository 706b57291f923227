package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/inboxgo/inbox/internal/watermark"
	"github.com/inboxgo/inbox/storage"
)

var watermarksSpec = cmdSpec{
	name: "watermarks",
	synopsis: `List a consumer's watermarks of sequenced dedup (the consumer's
Config.Sequenced.Sources): for each stream (topic, partition, outbox source
and epoch) the highest sequence number applied in each shard of the source,
as committed in the watermark table <table>_watermarks next to the inbox
table. The consumer takes a message whose number is at or below its shard's
for a duplicate. Only aligned sources are deduplicated this way (one shard
per stream); a stream of an unaligned source was written by an earlier
version, is no longer consulted, and may be deleted.

Streams are sorted by topic, partition, source and epoch. Each line says how
many shards the stream has and the lowest and highest of their numbers
(shards 64, min 120, max 409); -v adds every shard's number (shard:number),
and --json always has them. --topic and --partition list only those streams.

A stored value that does not decode (the consumer stops such a partition
until it is repaired) is an error naming its stream and showing its bytes:
the other streams are still listed, and the exit status is 1.

No stream at all (a mistyped --consumer, --topic or --partition, or a
consumer that has applied no sequenced message yet) is an error too, exit
status 1, naming the consumers that have streams, or the consumer's streams
elsewhere when a filter left none.`,
	examples: `  inboxctl watermarks --dsn "$DSN" --consumer billing
  inboxctl watermarks --dsn "$DSN" --consumer billing --topic orders --partition 3 -v
  inboxctl watermarks --dsn "$DSN" --table orders_inbox --consumer billing --json | jq '.streams[] | select(.epoch > 1)'
`,
}

type watermarksResult struct {
	Dialect   string            `json:"dialect"`
	Table     string            `json:"table"` // the watermark table
	Schema    string            `json:"schema,omitempty"`
	Consumer  string            `json:"consumer"`
	Topic     string            `json:"topic,omitempty"`     // the --topic filter
	Partition *int32            `json:"partition,omitempty"` // the --partition filter
	Streams   []streamWatermark `json:"streams"`
	// Unreadable counts the streams whose stored value does not decode.
	Unreadable int `json:"unreadable"`
}

type streamWatermark struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Source    string `json:"source"`
	Epoch     int64  `json:"epoch"`
	Shards    int    `json:"shards"`
	Min       int64  `json:"min,omitempty"`
	Max       int64  `json:"max,omitempty"`
	// Applied is null, not empty, for a value that does not decode.
	Applied []shardSeq `json:"applied"`
	// Error and Stored (hex) describe a value that does not decode.
	Error  string `json:"error,omitempty"`
	Stored string `json:"stored,omitempty"`
}

type shardSeq struct {
	Shard int32 `json:"shard"`
	Seq   int64 `json:"seq"`
}

// partitionFlag is --partition; unset, it selects every partition.
type partitionFlag struct {
	n   int32
	set bool
}

func (p *partitionFlag) String() string {
	if p == nil || !p.set {
		return ""
	}
	return strconv.Itoa(int(p.n))
}

func (p *partitionFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return errors.New("want a partition number, 0 or more")
	}
	p.n, p.set = int32(n), true
	return nil
}

func runWatermarks(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(watermarksSpec)
	consumer := fs.String("consumer", "", "the consumer's `name` (its Config.Consumer: the watermarks' scope); required")
	topic := fs.String("topic", "", "list only the streams of this `topic`")
	var partition partitionFlag
	fs.Var(&partition, "partition", "list only the streams of this partition `number`")
	fs.Lookup("table").Usage = "the inbox `table` whose watermark table, <table>_watermarks, to read (default: the adapter's, inbox_messages)"
	fs.Lookup("v").Usage = "verbose: every shard's applied sequence number"
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "watermarks", err)
	}
	if *consumer == "" {
		return fail(stderr, "watermarks", usageErrorf("--consumer is required: the consumer's name, whose watermarks to list"))
	}
	if err := o.resolve(false); err != nil {
		return fail(stderr, "watermarks", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	c, err := connect(ctx, o)
	if err != nil {
		return fail(stderr, "watermarks", err)
	}
	defer c.close()
	ws, ok := c.store.(storage.WatermarkStore)
	if !ok {
		return fail(stderr, "watermarks", fmt.Errorf("the %s adapter keeps no watermarks (its Store does not implement storage.WatermarkStore)", c.b.name))
	}
	wmTable := c.table + c.b.watermarkSuffix
	p := int32(-1)
	if partition.set {
		p = partition.n
	}
	rows, err := ws.Watermarks(ctx, c.db, *consumer, *topic, p)
	if err != nil {
		// An impossible name (too long, not UTF-8) in the flags, or an
		// inbox table's name too long for a watermark table.
		if errors.Is(err, storage.ErrInvalidConfig) {
			return fail(stderr, "watermarks", usageErrorf("%v", err))
		}
		if missing := c.missingTable(ctx, wmTable); missing != nil {
			return fail(stderr, "watermarks", missing)
		}
		return fail(stderr, "watermarks", err)
	}
	if len(rows) == 0 {
		return fail(stderr, "watermarks", c.noStreams(ctx, ws, wmTable, *consumer, *topic, p))
	}
	slices.SortFunc(rows, func(a, b storage.WatermarkRow) int { return a.Compare(b.WatermarkKey) })
	res := watermarksResult{Dialect: c.b.name, Table: wmTable, Schema: c.schema, Consumer: *consumer, Topic: *topic, Streams: []streamWatermark{}}
	if partition.set {
		res.Partition = &partition.n
	}
	for _, r := range rows {
		s := streamWatermark{Topic: r.Topic, Partition: r.Partition, Source: r.Source, Epoch: r.Epoch}
		applied, err := watermark.Decode(r.Applied)
		if err != nil {
			s.Error, s.Stored = err.Error(), hex.EncodeToString(r.Applied)
			res.Unreadable++
			fmt.Fprintf(stderr, "inboxctl watermarks: %s: the stored value does not decode: %v (%s)\n", streamName(s), err, storedBytes(r.Applied))
		} else {
			s.Applied = make([]shardSeq, 0, len(applied))
			for _, sh := range slices.Sorted(maps.Keys(applied)) {
				seq := applied[sh]
				s.Applied = append(s.Applied, shardSeq{Shard: sh, Seq: seq})
				if s.Min == 0 || seq < s.Min {
					s.Min = seq
				}
				s.Max = max(s.Max, seq)
			}
			s.Shards = len(s.Applied)
		}
		res.Streams = append(res.Streams, s)
	}
	code := exitOK
	if res.Unreadable > 0 {
		code = exitFailed
	}
	if o.json {
		if rc := writeJSON(stdout, stderr, "watermarks", res); rc != exitOK {
			return rc
		}
		return code
	}
	printWatermarks(stdout, res, o.verbose)
	return code
}

// noStreams is the error for a listing of consumer's streams on topic ("":
// any) and partition (-1: any) that found none: it says whether consumer
// has streams elsewhere, or else which consumers have any.
func (c *conn) noStreams(ctx context.Context, ws storage.WatermarkStore, wmTable, consumer, topic string, partition int32) error {
	where := qualified(c.schema, wmTable)
	if topic != "" || partition >= 0 {
		filter := ""
		if topic != "" {
			filter += " on topic " + cell(topic)
		}
		if partition >= 0 {
			filter += fmt.Sprintf(" on partition %d", partition)
		}
		if all, err := ws.Watermarks(ctx, c.db, consumer, "", -1); err == nil && len(all) > 0 {
			return fmt.Errorf("consumer %s has %d stream(s) in %s, none%s", cell(consumer), len(all), where, filter)
		}
	}
	err := fmt.Errorf("no stream of consumer %s exists in %s (--consumer is the consumer's Config.Consumer; a consumer has streams once it applied a message of a trusted sequenced source)", cell(consumer), where)
	if others, oerr := c.watermarkConsumers(ctx, wmTable); oerr == nil && len(others) > 0 {
		names := make([]string, len(others))
		for i, o := range others {
			names[i] = cell(o.Consumer)
		}
		err = fmt.Errorf("%w; consumers with streams: %s", err, strings.Join(names, ", "))
	}
	return err
}

// watermarkConsumer is one consumer's streams in a watermark table.
type watermarkConsumer struct {
	Consumer string `json:"consumer"`
	Streams  int64  `json:"streams"` // (topic, partition, source, epoch)
	Sources  int64  `json:"sources"` // distinct source ids
}

// watermarkConsumers returns the consumers that have streams in the
// watermark table wmTable, sorted by name.
func (c *conn) watermarkConsumers(ctx context.Context, wmTable string) ([]watermarkConsumer, error) {
	var out []watermarkConsumer
	err := c.db.WithContext(ctx).Table(qualified(c.schema, wmTable)).
		Select("scope AS consumer, COUNT(*) AS streams, COUNT(DISTINCT source) AS sources").
		Group("scope").Scan(&out).Error
	slices.SortFunc(out, func(a, b watermarkConsumer) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out, err
}

// hasTable reports whether table exists (false if the catalogue cannot
// tell).
func (c *conn) hasTable(ctx context.Context, table string) bool {
	names, err := c.b.tables(ctx, c.db, c.schema, table)
	return err == nil && slices.Contains(names, table)
}

// missingTable returns an error saying how to create table if it does not
// exist, and nil if it does or the catalogue cannot tell.
func (c *conn) missingTable(ctx context.Context, table string) error {
	names, err := c.b.tables(ctx, c.db, c.schema, table)
	if err != nil || slices.Contains(names, table) {
		return nil
	}
	return fmt.Errorf("watermark table %s does not exist: inboxctl migrate (or the consumer's Migrate) creates it", qualified(c.schema, table))
}

// shardsPerLine keeps the -v lists of many shards readable.
const shardsPerLine = 8

func printWatermarks(out io.Writer, r watermarksResult, verbose bool) {
	filter := ""
	if r.Topic != "" {
		filter += ", topic " + cell(r.Topic)
	}
	if r.Partition != nil {
		filter += fmt.Sprintf(", partition %d", *r.Partition)
	}
	fmt.Fprintf(out, "%s watermark table %s, consumer %s%s: %d stream(s)\n", r.Dialect, qualified(r.Schema, r.Table), cell(r.Consumer), filter, len(r.Streams))
	if len(r.Streams) == 0 {
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nTOPIC\tPARTITION\tSOURCE\tEPOCH\tAPPLIED")
	for _, s := range r.Streams {
		fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", cell(s.Topic), s.Partition, cell(s.Source), s.Epoch, appliedSummary(s))
		if !verbose {
			continue
		}
		// Leading empty cells keep the list under APPLIED, and in the
		// table's block, so the columns stay aligned.
		for chunk := range slices.Chunk(s.Applied, shardsPerLine) {
			pairs := make([]string, len(chunk))
			for i, a := range chunk {
				pairs[i] = fmt.Sprintf("%d:%d", a.Shard, a.Seq)
			}
			fmt.Fprintf(w, "\t\t\t\t  %s\n", strings.Join(pairs, " "))
		}
	}
	_ = w.Flush()
	if r.Unreadable > 0 {
		fmt.Fprintf(out, "\n%d stream(s) with a stored value that does not decode\n", r.Unreadable)
	}
}

func appliedSummary(s streamWatermark) string {
	switch {
	case s.Error != "":
		return "UNREADABLE: " + s.Error
	case s.Shards == 0:
		return "shards 0"
	}
	return fmt.Sprintf("shards %d, min %d, max %d", s.Shards, s.Min, s.Max)
}

// streamName names a stream in errors.
func streamName(s streamWatermark) string {
	return fmt.Sprintf("stream topic %s partition %d, source %s epoch %d", cell(s.Topic), s.Partition, cell(s.Source), s.Epoch)
}

// maxStoredShown bounds the bytes of an undecodable value shown in its
// error (--json has them all): up to storage.MaxWatermarkBytes.
const maxStoredShown = 32

func storedBytes(b []byte) string {
	if len(b) <= maxStoredShown {
		return fmt.Sprintf("%d bytes: %x", len(b), b)
	}
	return fmt.Sprintf("%d bytes: %x...", len(b), b[:maxStoredShown])
}

// cell quotes a stored name that is empty or holds spaces or unprintable
// characters, which would break the table's columns or hide in them.
func cell(s string) string {
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}
