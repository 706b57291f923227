package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

var outboxSpec = cmdSpec{
	name: "outbox",
	synopsis: `Manage the outbox table (github.com/inboxgo/inbox/outbox). The first argument
is the action:

  migrate   create the outbox table, its shards, relay and source tables (or
            check them); warns about settings that can lose committed
            messages
  maintain  prepare the coming days and remove published rows of days before
            today - retention-days; a day that still holds unpublished rows is
            never removed and is reported (exit status 1): is a relay running?
  stats     rows and unpublished rows per day
  source    the outbox table's source id and epoch, which the relays stamp,
            with each message's shard and sequence number, on every message
            with a key (the sequence headers inbox_source, inbox_epoch,
            inbox_shard, inbox_seq)
  bump-epoch
            raise the epoch by one; consumers see the messages published
            after it as a new stream. Never needed for an aligned outbox:
            its relay finds a restored or failed-over database from the
            partitions and raises the epoch itself. Safe at any time: what
            was published before is not sent again under the new epoch.
            --dry-run shows the change without making it

--shards must be the applications' (fixed when the table is made; migrate
refuses a different number). --retention-days here defaults to the outbox's
3 days.`,
	examples: `  inboxctl outbox migrate --dsn "$DSN"
  inboxctl outbox migrate --print-sql --dialect postgres --schema app > migrations/0002_outbox.sql
  inboxctl outbox maintain --dsn "$DSN" --retention-days 3 --dry-run
  inboxctl outbox stats --dsn "$DSN" --json
  inboxctl outbox source --dsn "$DSN"
  inboxctl outbox bump-epoch --dsn "$DSN" --dry-run
`,
	retention: true,
}

type outboxResult struct {
	Dialect string `json:"dialect"`
	Table   string `json:"table"`
	Schema  string `json:"schema,omitempty"`
	Action  string `json:"action"`
	DryRun  bool   `json:"dry_run,omitempty"`
	// maintain
	Prepared    []string `json:"prepared,omitempty"`
	Expired     []string `json:"expired,omitempty"`
	Held        []string `json:"held,omitempty"` // expired days kept: unpublished rows
	RowsRemoved int64    `json:"rows_removed,omitempty"`
	// stats
	Days        []outboxDay `json:"days,omitempty"`
	TotalRows   int64       `json:"total_rows"`
	Unpublished int64       `json:"unpublished"`
	// migrate, source, bump-epoch: the sequence headers' source id and
	// epoch (bump-epoch: the new one, and the one before it)
	Source        string `json:"source,omitempty"`
	Epoch         int64  `json:"epoch,omitempty"`
	PreviousEpoch int64  `json:"previous_epoch,omitempty"`
}

type outboxDay struct {
	Day         string `json:"day"`
	Rows        int64  `json:"rows"`
	Unpublished int64  `json:"unpublished"`
}

func runOutbox(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	action := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	fs, o := newFlagSet(outboxSpec)
	shards := fs.Int("shards", 64, "`number` of shards of the outbox table (the applications' adapter option)")
	dryRun := fs.Bool("dry-run", false, "maintain, bump-epoch: change nothing; print what would be prepared and removed, or the epoch it would move to")
	printSQL := fs.Bool("print-sql", false, "migrate: print the DDL for --dialect instead of running it; connects to nothing")
	fs.Lookup("retention-days").DefValue = "3"
	o.retentionDays = 3 // outbox.Config.RetentionDays' default
	fs.Lookup("table").Usage = "outbox `table` name (default: the adapter's, outbox_messages)"
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "outbox", err)
	}
	switch action {
	case "migrate", "maintain", "stats", "source", "bump-epoch":
	case "":
		return fail(stderr, "outbox", usageErrorf("missing action: %s", outboxActions))
	default:
		return fail(stderr, "outbox", usageErrorf("unknown action %q: want %s", action, outboxActions))
	}
	if *dryRun && action != "maintain" && action != "bump-epoch" {
		return fail(stderr, "outbox", usageErrorf("--dry-run is for maintain and bump-epoch"))
	}
	if *shards < 1 {
		return fail(stderr, "outbox", usageErrorf("--shards must be at least 1, got %d", *shards))
	}
	if *printSQL {
		if action != "migrate" {
			return fail(stderr, "outbox", usageErrorf("--print-sql is for migrate"))
		}
		return printDDL(o, o.prepareDays, stdout, stderr, ddlTarget{
			cmd: "outbox", what: "outbox table", then: "inboxctl outbox maintain (or Outbox.RunMaintenance)",
			defaultTable: func(b *backend) string { return b.defaultOutboxTable },
			newStore:     func(b *backend, table string) (any, error) { return b.newOutboxStore(table, o.schema, *shards) },
		})
	}
	o.create = action == "migrate"
	if err := o.resolve(true); err != nil {
		return fail(stderr, "outbox", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	b, err := lookupBackend(o.dialect)
	if err != nil {
		return fail(stderr, "outbox", err)
	}
	table := o.table
	if table == "" {
		table = b.defaultOutboxTable
	}
	store, err := b.newOutboxStore(table, o.schema, *shards)
	if err != nil {
		return fail(stderr, "outbox", err)
	}
	if b.mustExist != nil && !o.create {
		if err := b.mustExist(o.dsn); err != nil {
			return fail(stderr, "outbox", err)
		}
	}
	db, err := openDB(ctx, b, o.dsn)
	if err != nil {
		return fail(stderr, "outbox", err)
	}
	defer closeDB(db)
	ob, err := outbox.New(db, store, outbox.Config{RetentionDays: o.retentionDays, PrepareDays: o.prepareDays, Logger: newLogger(o, stderr)})
	if err != nil {
		return fail(stderr, "outbox", err)
	}
	schema := o.schema
	if schema == "" {
		schema = b.defaultSchema
	}
	res := outboxResult{Dialect: b.name, Table: table, Schema: schema, Action: action}
	code := exitOK
	switch action {
	case "migrate":
		if err := ob.Migrate(ctx); err != nil {
			return fail(stderr, "outbox", err)
		}
		// Migrate makes no day partitions on PostgreSQL: prepare them now.
		if _, err := ob.Maintain(ctx); err != nil {
			return fail(stderr, "outbox", err)
		}
		// Like migrate for the inbox, this DSN may not be the
		// applications': warn, do not fail.
		if v, ok := store.(storage.Verifier); ok {
			if err := v.Verify(ctx, db); err != nil {
				fmt.Fprintf(stderr, "inboxctl outbox: warning: with this DSN's settings %v\n", err)
			}
		}
		if sq, ok := store.(storage.Sequenced); ok {
			if res.Source, res.Epoch, err = sq.Source(ctx, db); err != nil {
				return fail(stderr, "outbox", err)
			}
		}
	case "source", "bump-epoch":
		sq, ok := store.(storage.Sequenced)
		if !ok {
			return fail(stderr, "outbox", fmt.Errorf("the %s outbox store keeps no source id and epoch", b.name))
		}
		if res.Source, res.Epoch, err = sq.Source(ctx, db); err != nil {
			return fail(stderr, "outbox", err)
		}
		if action == "bump-epoch" {
			res.DryRun, res.PreviousEpoch = *dryRun, res.Epoch
			if res.DryRun {
				res.Epoch++
			} else if res.Epoch, err = sq.BumpEpoch(ctx, db); err != nil {
				return fail(stderr, "outbox", err)
			}
		}
	case "maintain":
		plan := ob.Plan()
		plan.DryRun = *dryRun
		report, err := ob.MaintainPlan(ctx, plan)
		if err != nil {
			return fail(stderr, "outbox", err)
		}
		res.DryRun, res.RowsRemoved = plan.DryRun, report.RowsRemoved
		for _, d := range report.Prepared {
			res.Prepared = append(res.Prepared, day(d))
		}
		for _, d := range report.Expired {
			res.Expired = append(res.Expired, day(d))
		}
		for _, d := range report.Held {
			res.Held = append(res.Held, day(d))
		}
		if len(res.Held) > 0 {
			fmt.Fprintf(stderr, "inboxctl outbox: expired days %s still hold unpublished messages and were kept; is a relay running?\n", strings.Join(res.Held, " "))
			code = exitFailed
		}
	case "stats":
		sr, ok := store.(storage.StatsReporter)
		if !ok {
			return fail(stderr, "outbox", fmt.Errorf("the %s outbox store reports no stats", b.name))
		}
		stats, err := sr.Stats(ctx, db)
		if err != nil {
			return fail(stderr, "outbox", err)
		}
		for _, s := range stats {
			res.Days = append(res.Days, outboxDay{Day: day(s.Day), Rows: s.Rows, Unpublished: s.Unpublished})
			res.TotalRows += s.Rows
			res.Unpublished += s.Unpublished
		}
	}
	if o.json {
		if c := writeJSON(stdout, stderr, "outbox", res); c != exitOK {
			return c
		}
		return code
	}
	printOutbox(stdout, res)
	return code
}

func printOutbox(w io.Writer, r outboxResult) {
	name := qualified(r.Schema, r.Table)
	switch r.Action {
	case "migrate":
		fmt.Fprintf(w, "%s outbox table %s is ready\n", r.Dialect, name)
		if r.Source != "" {
			fmt.Fprintf(w, "  source %s, epoch %d\n", r.Source, r.Epoch)
		}
	case "source":
		fmt.Fprintf(w, "%s outbox table %s: source %s, epoch %d\n", r.Dialect, name, r.Source, r.Epoch)
	case "bump-epoch":
		if r.DryRun {
			fmt.Fprintf(w, "dry run: nothing was changed; %s outbox table %s (source %s) would go from epoch %d to %d\n", r.Dialect, name, r.Source, r.PreviousEpoch, r.Epoch)
		} else {
			fmt.Fprintf(w, "%s outbox table %s (source %s): epoch %d, was %d\n", r.Dialect, name, r.Source, r.Epoch, r.PreviousEpoch)
		}
	case "maintain":
		if r.DryRun {
			fmt.Fprintln(w, "dry run: nothing was changed")
		}
		fmt.Fprintf(w, "%s outbox table %s:\n", r.Dialect, name)
		fmt.Fprintf(w, "  prepared days: %s\n", orNone(r.Prepared))
		fmt.Fprintf(w, "  expired days:  %s\n", orNone(r.Expired))
		fmt.Fprintf(w, "  held days:     %s (unpublished rows; never removed)\n", orNone(r.Held))
		if r.RowsRemoved < 0 {
			fmt.Fprintln(w, "  rows removed:  not counted (whole partitions were dropped)")
		} else {
			fmt.Fprintf(w, "  rows removed:  %d\n", r.RowsRemoved)
		}
	case "stats":
		fmt.Fprintf(w, "%s outbox table %s: %d rows, %d unpublished\n", r.Dialect, name, r.TotalRows, r.Unpublished)
		for _, d := range r.Days {
			fmt.Fprintf(w, "  %s  %8d rows  %8d unpublished\n", d.Day, d.Rows, d.Unpublished)
		}
	}
}

// outboxActions lists the actions of inboxctl outbox, for its usage errors.
const outboxActions = "migrate, maintain, stats, source or bump-epoch"

func orNone(days []string) string {
	if len(days) == 0 {
		return "none"
	}
	return strings.Join(days, " ")
}
