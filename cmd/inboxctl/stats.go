package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/inboxgo/inbox/storage"
)

var statsSpec = cmdSpec{
	name: "stats",
	synopsis: `Report what the inbox table holds: rows per consumer and day, each consumer's
oldest and newest day and total, the days that maintain would expire under
--retention-days, and the space the table takes on disk where the database
can tell (PostgreSQL pg_total_relation_size per partition, MySQL/MariaDB
information_schema data and index length per partition, SQLite dbstat or
the database file's page_count*page_size).

Consumers that deduplicate by watermark (sequenced dedup) keep no inbox rows
for those messages: where the watermark table <table>_watermarks exists,
stats lists each consumer's streams and sources in it too.`,
	examples: `  inboxctl stats --dsn "$DSN"
  inboxctl stats --dsn "$DSN" --table orders_inbox --retention-days 14 --json | jq .consumers
`,
	retention: true,
}

type statsResult struct {
	Dialect       string          `json:"dialect"`
	Table         string          `json:"table"`
	Schema        string          `json:"schema,omitempty"`
	TotalRows     int64           `json:"total_rows"`
	OldestDay     string          `json:"oldest_day,omitempty"`
	NewestDay     string          `json:"newest_day,omitempty"`
	RetentionDays int             `json:"retention_days"`
	ExpireBefore  string          `json:"expire_before"`
	ExpiredRows   int64           `json:"expired_rows"` // rows maintain would remove now
	Consumers     []consumerStats `json:"consumers"`
	Size          *sizeInfo       `json:"size,omitempty"`
	SizeError     string          `json:"size_error,omitempty"`
	// WatermarkTable and WatermarkConsumers: the consumers with streams of
	// sequenced dedup; both omitted where the table does not exist.
	WatermarkTable     string              `json:"watermark_table,omitempty"`
	WatermarkConsumers []watermarkConsumer `json:"watermark_consumers,omitempty"`
}

type consumerStats struct {
	Consumer  string     `json:"consumer"`
	Rows      int64      `json:"rows"`
	OldestDay string     `json:"oldest_day"`
	NewestDay string     `json:"newest_day"`
	Days      []dayCount `json:"days"`
}

type dayCount struct {
	Day  string `json:"day"`
	Rows int64  `json:"rows"`
}

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(statsSpec)
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "stats", err)
	}
	if err := o.resolve(true); err != nil {
		return fail(stderr, "stats", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	c, err := connect(ctx, o)
	if err != nil {
		return fail(stderr, "stats", err)
	}
	defer c.close()
	sr, ok := c.store.(storage.StatsReporter)
	if !ok {
		return fail(stderr, "stats", fmt.Errorf("the %s adapter cannot report rows per day (no Stats method)", c.b.name))
	}
	ib, err := c.newInbox(o, stderr)
	if err != nil {
		return fail(stderr, "stats", err)
	}
	rows, err := sr.Stats(ctx, c.db)
	if err != nil {
		return fail(stderr, "stats", err)
	}
	slices.SortFunc(rows, func(a, b storage.DayStats) int {
		return cmp.Or(cmp.Compare(a.Consumer, b.Consumer), a.Day.Compare(b.Day))
	})
	expireBefore := ib.Plan().ExpireBefore
	res := statsResult{Dialect: c.b.name, Table: c.table, Schema: c.schema, RetentionDays: o.retentionDays,
		ExpireBefore: day(expireBefore), Consumers: []consumerStats{}}
	var oldest, newest time.Time
	for _, s := range rows {
		if n := len(res.Consumers); n == 0 || res.Consumers[n-1].Consumer != s.Consumer {
			res.Consumers = append(res.Consumers, consumerStats{Consumer: s.Consumer, OldestDay: day(s.Day), NewestDay: day(s.Day)})
		}
		cs := &res.Consumers[len(res.Consumers)-1]
		cs.Rows += s.Rows
		cs.Days = append(cs.Days, dayCount{Day: day(s.Day), Rows: s.Rows})
		if d := day(s.Day); d < cs.OldestDay {
			cs.OldestDay = d
		} else if d > cs.NewestDay {
			cs.NewestDay = d
		}
		res.TotalRows += s.Rows
		if s.Day.Before(expireBefore) {
			res.ExpiredRows += s.Rows
		}
		if oldest.IsZero() || s.Day.Before(oldest) {
			oldest = s.Day
		}
		if s.Day.After(newest) {
			newest = s.Day
		}
	}
	if !oldest.IsZero() {
		res.OldestDay, res.NewestDay = day(oldest), day(newest)
	}
	if wm := c.table + c.b.watermarkSuffix; c.hasTable(ctx, wm) {
		wcs, err := c.watermarkConsumers(ctx, wm)
		if err != nil {
			return fail(stderr, "stats", fmt.Errorf("read watermark table %s: %w", qualified(c.schema, wm), err))
		}
		res.WatermarkTable, res.WatermarkConsumers = wm, wcs
	}
	if c.b.size != nil {
		size, err := c.b.size(ctx, c.db, c.schema, c.table)
		if err != nil {
			res.SizeError = err.Error()
		} else {
			res.Size = size
		}
	}
	if o.json {
		return writeJSON(stdout, stderr, "stats", res)
	}
	printStats(stdout, res)
	return exitOK
}

func printStats(out io.Writer, r statsResult) {
	fmt.Fprintf(out, "%s table %s\n", r.Dialect, qualified(r.Schema, r.Table))
	if r.TotalRows == 0 {
		fmt.Fprintln(out, "no rows")
	} else {
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "\nCONSUMER\tDAY\tROWS\t")
		for _, c := range r.Consumers {
			for _, d := range c.Days {
				note := ""
				if d.Day < r.ExpireBefore {
					note = "expired"
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", c.Consumer, d.Day, d.Rows, note)
			}
		}
		fmt.Fprintln(w, "\nCONSUMER\tROWS\tDAYS\tOLDEST\tNEWEST\t")
		days := map[string]bool{}
		for _, c := range r.Consumers {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t\n", c.Consumer, c.Rows, len(c.Days), c.OldestDay, c.NewestDay)
			for _, d := range c.Days {
				days[d.Day] = true
			}
		}
		fmt.Fprintf(w, "(all %d)\t%d\t%d\t%s\t%s\t\n", len(r.Consumers), r.TotalRows, len(days), r.OldestDay, r.NewestDay)
		_ = w.Flush()
		fmt.Fprintf(out, "\nretention %d days: %d rows of days before %s would be removed by maintain\n", r.RetentionDays, r.ExpiredRows, r.ExpireBefore)
	}
	if r.WatermarkTable != "" {
		fmt.Fprintf(out, "\nwatermark table %s (sequenced dedup, no inbox rows): ", qualified(r.Schema, r.WatermarkTable))
		if len(r.WatermarkConsumers) == 0 {
			fmt.Fprintln(out, "no streams")
		} else {
			fmt.Fprintf(out, "%d consumer(s)\n", len(r.WatermarkConsumers))
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CONSUMER\tSTREAMS\tSOURCES\t")
			for _, c := range r.WatermarkConsumers {
				fmt.Fprintf(w, "%s\t%d\t%d\t\n", cell(c.Consumer), c.Streams, c.Sources)
			}
			_ = w.Flush()
		}
		fmt.Fprintln(out)
	}
	switch {
	case r.Size != nil:
		fmt.Fprintf(out, "size on disk: %s (%s; %s)\n", humanBytes(r.Size.Bytes), r.Size.Scope, r.Size.Method)
		if len(r.Size.Partitions) > 0 {
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PARTITION\tSIZE\tROWS (estimate)\t")
			for _, p := range r.Size.Partitions {
				rows := "-"
				if p.Rows >= 0 {
					rows = fmt.Sprint(p.Rows)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t\n", p.Name, humanBytes(p.Bytes), rows)
			}
			_ = w.Flush()
		}
	case r.SizeError != "":
		fmt.Fprintf(out, "size on disk: unknown (%s)\n", r.SizeError)
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
