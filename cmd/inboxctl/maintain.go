package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
)

var maintainSpec = cmdSpec{
	name: "maintain",
	synopsis: `Prepare storage (partitions) from today through --prepare-days ahead, and
remove the days older than the retention window: every day before
today - retention-days - 1 (one day of grace for clocks that differ between
hosts). Idempotent and safe while applications process messages; run it at
least daily. --retention-days and --prepare-days must match the Config of the
applications that use the table: a shorter retention here removes rows they
still rely on to detect duplicates.

With --dry-run nothing is changed: the plan, the days that would be prepared
and those that would be removed, with the rows of each, are printed (counting
them scans the table).`,
	examples: `  inboxctl maintain --dsn "$DSN" --retention-days 14 --dry-run
  inboxctl maintain --dsn "$DSN" --retention-days 14 --prepare-days 3
  inboxctl maintain --dialect sqlite --dsn app.db --json
`,
	retention: true,
}

type maintainResult struct {
	Dialect        string       `json:"dialect"`
	Table          string       `json:"table"`
	Schema         string       `json:"schema,omitempty"`
	DryRun         bool         `json:"dry_run"`
	RetentionDays  int          `json:"retention_days"`
	PrepareDays    int          `json:"prepare_days"`
	Today          string       `json:"today"`
	PrepareThrough string       `json:"prepare_through"`
	ExpireBefore   string       `json:"expire_before"`
	Prepared       []string     `json:"prepared"`
	Expired        []expiredDay `json:"expired"`
	// RowsRemoved is -1 when the Store cannot count them (a dropped partition).
	RowsRemoved int64 `json:"rows_removed"`
}

type expiredDay struct {
	Day string `json:"day"`
	// Rows the day holds; counted in a dry run only (a full scan), else -1.
	Rows int64 `json:"rows"`
}

func runMaintain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(maintainSpec)
	dryRun := fs.Bool("dry-run", false, "change nothing; print the plan and what would be prepared and removed")
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "maintain", err)
	}
	if err := o.resolve(true); err != nil {
		return fail(stderr, "maintain", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	c, err := connect(ctx, o)
	if err != nil {
		return fail(stderr, "maintain", err)
	}
	defer c.close()
	ib, err := c.newInbox(o, stderr)
	if err != nil {
		return fail(stderr, "maintain", err)
	}
	plan := ib.Plan()
	plan.PrepareThrough = plan.Today.AddDate(0, 0, o.prepareDays)
	plan.DryRun = *dryRun

	// In a dry run, the rows of each day that would go. Counting scans the
	// whole table, so a real run (daily, on a big table) does not.
	var rowsByDay map[time.Time]int64
	if sr, ok := c.store.(storage.StatsReporter); ok && plan.DryRun {
		rowsByDay = map[time.Time]int64{}
		stats, err := sr.Stats(ctx, c.db)
		if err != nil {
			return fail(stderr, "maintain", fmt.Errorf("count rows per day: %w", err))
		}
		for _, s := range stats {
			rowsByDay[s.Day] += s.Rows
		}
	}

	report, err := ib.MaintainPlan(ctx, plan)
	if err != nil {
		return fail(stderr, "maintain", err)
	}
	res := maintainResult{
		Dialect: c.b.name, Table: c.table, Schema: c.schema, DryRun: plan.DryRun,
		RetentionDays: o.retentionDays, PrepareDays: o.prepareDays,
		Today: day(plan.Today), PrepareThrough: day(plan.PrepareThrough), ExpireBefore: day(plan.ExpireBefore),
		Prepared: []string{}, Expired: []expiredDay{}, RowsRemoved: report.RowsRemoved,
	}
	for _, d := range report.Prepared {
		res.Prepared = append(res.Prepared, day(d))
	}
	for _, d := range report.Expired {
		n := int64(-1)
		if rowsByDay != nil {
			n = rowsByDay[storage.DayOf(d)]
		}
		res.Expired = append(res.Expired, expiredDay{Day: day(d), Rows: n})
	}
	if o.json {
		return writeJSON(stdout, stderr, "maintain", res)
	}
	printMaintain(stdout, res)
	return exitOK
}

func printMaintain(w io.Writer, r maintainResult) {
	verb := map[bool][2]string{false: {"prepared", "removed"}, true: {"would prepare", "would remove"}}[r.DryRun]
	if r.DryRun {
		fmt.Fprintln(w, "dry run: nothing was changed")
	}
	fmt.Fprintf(w, "plan for %s table %s (retention %d days, prepare %d days):\n", r.Dialect, qualified(r.Schema, r.Table), r.RetentionDays, r.PrepareDays)
	fmt.Fprintf(w, "  today            %s\n", r.Today)
	fmt.Fprintf(w, "  prepare through  %s\n", r.PrepareThrough)
	fmt.Fprintf(w, "  expire before    %s (every day before this one is removed)\n", r.ExpireBefore)
	if len(r.Prepared) == 0 {
		fmt.Fprintf(w, "%s: nothing (this dialect needs no preparation, or all is ready)\n", verb[0])
	} else {
		fmt.Fprintf(w, "%s: %s\n", verb[0], strings.Join(r.Prepared, " "))
	}
	if len(r.Expired) == 0 {
		fmt.Fprintf(w, "%s: no expired days\n", verb[1])
		return
	}
	fmt.Fprintf(w, "%s %d expired day(s):\n", verb[1], len(r.Expired))
	for _, e := range r.Expired {
		if e.Rows < 0 {
			fmt.Fprintf(w, "  %s\n", e.Day)
		} else {
			fmt.Fprintf(w, "  %s  %d rows\n", e.Day, e.Rows)
		}
	}
	if r.RowsRemoved >= 0 {
		fmt.Fprintf(w, "rows %s: %d\n", verb[1], r.RowsRemoved)
	} else {
		fmt.Fprintf(w, "rows %s: not counted (whole partitions are dropped)\n", verb[1])
	}
}

func day(t time.Time) string { return t.UTC().Format(time.DateOnly) }
