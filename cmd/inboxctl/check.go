package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"
)

var checkSpec = cmdSpec{
	name: "check",
	synopsis: `Run the inbox conformance checks against the live database of the DSN, so
that you verify that your own server, driver settings and table engine keep
the inbox row and the business effect atomic: a duplicate is skipped, a
rollback removes both, concurrent deliveries apply an effect once, ids are
stored byte for byte.

First the adapter verifies the connection's settings (settings/verify: e.g.
a strict sql_mode and InnoDB on MySQL/MariaDB, WAL and a busy timeout on
SQLite); a setting that breaks the guarantees fails the check with the reason.
Then each check runs in its own scratch table, inboxctl_check_<random>, with
its own connection pool opened from the DSN as given; the scratch tables are
dropped afterwards, also when a check fails or the command is interrupted.
The inbox table (--table) is never touched.

The outbox checks (outbox-*) follow: the outbox Store of the same dialect,
in scratch tables of its own (inboxctl_check_<random>, with their _shards,
_relay and _source tables), against a broker stand-in that records what a
relay publishes: messages exist if and only if their transaction commits,
are published in commit order per key, survive a relay that fails or is
taken over, carry sequence headers that match their stored rows on every
copy, and expiry never removes an unpublished row. The outbox table (--table)
is never touched either.

By default every area runs except the slow retention checks, which move a
clock over several days of maintenance; --all adds them.`,
	examples: `  inboxctl check --dsn "$DSN"
  inboxctl check --dialect mysql --dsn 'app:secret@tcp(db:3306)/app?parseTime=true' --all
  inboxctl check --dsn "$DSN" --run 'atomicity|concurrency' --json
  inboxctl check --dsn "$DSN" --run '^outbox-'  # the outbox table only
  inboxctl check --dsn "$DSN" --isolation serializable
  inboxctl check --list --all
`,
	timeout: 30 * time.Minute,
}

// scratchPrefix starts the name of every table check creates.
const scratchPrefix = "inboxctl_check_"

// effectsPrefix starts the names of the conformance suite's own effect tables.
const effectsPrefix = "conformance_effects_"

// Status of one check.
const (
	statusPass = "PASS"
	statusFail = "FAIL"
	statusSkip = "SKIP"
)

type checkResult struct {
	Check   string  `json:"check"`
	Doc     string  `json:"doc"`
	Status  string  `json:"status"`
	Reason  string  `json:"reason,omitempty"`
	Seconds float64 `json:"seconds"`
}

type checkReport struct {
	Dialect     string        `json:"dialect"`
	Passed      int           `json:"passed"`
	Failed      int           `json:"failed"`
	Skipped     int           `json:"skipped"`
	NotRun      int           `json:"not_run"` // after an interrupt or timeout
	Seconds     float64       `json:"seconds"`
	Results     []checkResult `json:"results"`
	Interrupted bool          `json:"interrupted,omitempty"`
}

// verifyCheck is the first line of every run: the adapter's own verdict on
// the connection's settings.
var verifyCheck = conformance.Check{Area: "settings", Name: "verify",
	Doc: "the adapter finds the connection's settings safe (transactional engine, strict SQL mode, WAL...)"}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(checkSpec)
	all := fs.Bool("all", false, "also run the slow retention checks")
	pattern := fs.String("run", "", "run only the checks whose area/name matches this `regexp`")
	list := fs.Bool("list", false, "list the checks that would run, and exit")
	isolation := fs.String("isolation", "", "run the inbox transactions at this isolation `level`, as the applications do: read-committed, repeatable-read or serializable (default: the database's)")
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, "check", err)
	}
	var re *regexp.Regexp
	if *pattern != "" {
		var err error
		if re, err = regexp.Compile(*pattern); err != nil {
			return fail(stderr, "check", usageErrorf("--run: %v", err))
		}
	}
	txOpts, err := txOptions(*isolation)
	if err != nil {
		return fail(stderr, "check", err)
	}
	checks := selectChecks(*all, re)
	if *list {
		for _, c := range checks {
			fmt.Fprintf(stdout, "%-50s %s\n", c.ID(), c.Doc)
		}
		return exitOK
	}
	if len(checks) == 0 {
		return fail(stderr, "check", usageErrorf("--run %q matches no check (see inboxctl check --list --all)", *pattern))
	}
	if err := o.resolve(false); err != nil {
		return fail(stderr, "check", err)
	}
	if o.table != "" {
		fmt.Fprintf(stderr, "inboxctl check: note: --table %s is not used; every check works in its own scratch table\n", o.table)
	}
	b, err := lookupBackend(o.dialect)
	if err != nil {
		return fail(stderr, "check", err)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, o.timeout, fmt.Errorf("--timeout %v reached", o.timeout))
	defer cancel()

	ck := &checker{b: b, o: o, txOpts: txOpts, stderr: stderr}
	if b.mustExist != nil {
		if err := b.mustExist(o.dsn); err != nil {
			return fail(stderr, "check", err)
		}
	}
	probe, err := openDB(ctx, b, o.dsn)
	if err != nil {
		return fail(stderr, "check", err)
	}
	defer closeDB(probe)

	report := checkReport{Dialect: b.name, Results: []checkResult{}}
	if !o.json {
		fmt.Fprintf(stdout, "checking the %s database: %d checks, each in a scratch table %s<random>\n", b.name, len(checks)+1, scratchPrefix)
	}
	emit := func(r checkResult) {
		report.Results = append(report.Results, r)
		switch r.Status {
		case statusPass:
			report.Passed++
		case statusFail:
			report.Failed++
		case statusSkip:
			report.Skipped++
		}
		if !o.json {
			printCheckResult(stdout, r, o.verbose)
		}
	}

	if dropSchema := ck.schemaCreatedByRun(ctx, probe); dropSchema != nil {
		defer dropSchema()
	}
	start := time.Now()
	emit(ck.verify(ctx, probe))
	for i, c := range checks {
		if ctx.Err() != nil {
			report.NotRun = len(checks) - i
			report.Interrupted = true
			break
		}
		t0 := time.Now()
		r := checkResult{Check: c.ID(), Doc: c.Doc, Status: statusPass}
		if err := conformance.RunCheck(ctx, ck.harness, c); err != nil {
			r.Status = statusFail
			if errors.Is(err, conformance.ErrSkipped) {
				r.Status = statusSkip
			}
			r.Reason = strings.TrimPrefix(err.Error(), c.ID()+": ")
			if ctx.Err() != nil {
				report.Interrupted = true
				// What the check saw after the interrupt is noise.
				r.Reason = fmt.Sprintf("interrupted before it finished (%v)", context.Cause(ctx))
			}
		}
		r.Seconds = time.Since(t0).Seconds()
		emit(r)
	}
	report.Seconds = time.Since(start).Seconds()

	if o.json {
		if code := writeJSON(stdout, stderr, "check", report); code != exitOK {
			return code
		}
	} else {
		printCheckSummary(stdout, report)
	}
	if report.Interrupted {
		fmt.Fprintf(stderr, "inboxctl check: interrupted (%v); %d check(s) not run\n", context.Cause(ctx), report.NotRun)
	}
	if report.Failed > 0 || report.Interrupted {
		return exitFailed
	}
	return exitOK
}

// selectChecks returns the checks to run: the suite's, all with all, else
// every area but retention; filtered by re (on the IDs) when set.
func selectChecks(all bool, re *regexp.Regexp) []conformance.Check {
	var out []conformance.Check
	for _, c := range conformance.Checks() {
		if !all && c.Area == "retention" {
			continue
		}
		if re != nil && !re.MatchString(c.ID()) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// checker makes the harnesses of one check run.
type checker struct {
	b      *backend
	o      *options
	txOpts *sql.TxOptions
	stderr io.Writer
}

// txOptions parses --isolation.
func txOptions(level string) (*sql.TxOptions, error) {
	levels := map[string]sql.IsolationLevel{
		"read-committed":  sql.LevelReadCommitted,
		"repeatable-read": sql.LevelRepeatableRead,
		"serializable":    sql.LevelSerializable,
	}
	if level == "" {
		return nil, nil
	}
	l, ok := levels[strings.ToLower(strings.ReplaceAll(level, " ", "-"))]
	if !ok {
		return nil, usageErrorf("unknown --isolation %q: want read-committed, repeatable-read or serializable", level)
	}
	return &sql.TxOptions{Isolation: l}, nil
}

// schema is the schema the scratch tables go to ("" where the dialect has
// none).
func (ck *checker) schema() string {
	if ck.o.schema != "" {
		return ck.o.schema
	}
	return ck.b.defaultSchema
}

// schemaCreatedByRun returns, if the scratch tables' schema does not exist
// yet (the Store's Migrate will create it), a function that drops it again
// once it is empty; nil otherwise.
func (ck *checker) schemaCreatedByRun(ctx context.Context, db *gorm.DB) func() {
	if ck.b.schemaExists == nil || ck.schema() == "" {
		return nil
	}
	exists, err := ck.b.schemaExists(ctx, db, ck.schema())
	if err != nil || exists {
		return nil
	}
	return func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := ck.b.dropEmptySchema(cctx, db, ck.schema()); err != nil {
			fmt.Fprintf(ck.stderr, "inboxctl check: warning: could not drop schema %s, created for the scratch tables: %v\n", ck.schema(), err)
		}
	}
}

// verify asks the adapter whether the connection's settings keep its
// guarantees, on a migrated scratch table (adapters check the table's layout
// and engine too).
func (ck *checker) verify(ctx context.Context, db *gorm.DB) (r checkResult) {
	r = checkResult{Check: verifyCheck.ID(), Doc: verifyCheck.Doc, Status: statusPass}
	t0 := time.Now()
	defer func() { r.Seconds = time.Since(t0).Seconds() }()
	table := scratchPrefix + conformance.RandomSuffix()
	store, err := ck.b.newStore(table, ck.o.schema)
	if err != nil {
		r.Status, r.Reason = statusFail, err.Error()
		return r
	}
	var problems []error
	if ck.b.sessionCheck != nil {
		if err := ck.b.sessionCheck(ctx, db); err != nil {
			problems = append(problems, err)
		}
	}
	defer func() {
		if len(problems) > 0 {
			r.Status, r.Reason = statusFail, errors.Join(problems...).Error()
		}
	}()
	v, ok := store.(storage.Verifier)
	if !ok {
		if len(problems) == 0 {
			r.Status, r.Reason = statusSkip, "the "+ck.b.name+" adapter cannot check its settings"
		}
		return r
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := ck.dropScratch(cctx, db, table); err != nil {
			problems = append(problems, err) // reported by the deferred call above
		}
	}()
	if err := store.Migrate(ctx, db); err != nil {
		problems = append(problems, fmt.Errorf("migrate a scratch table: %w", err))
		return r
	}
	if err := v.Verify(ctx, db); err != nil {
		problems = append(problems, err)
	}
	return r
}

// harness is the conformance.HarnessMaker: a fresh inbox Store and a fresh
// outbox Store on scratch tables of their own (the check migrates the one it
// is about), and a fresh connection pool from the DSN, for every check.
func (ck *checker) harness(ctx context.Context) (*conformance.Harness, error) {
	table, outboxTable := scratchPrefix+conformance.RandomSuffix(), scratchPrefix+conformance.RandomSuffix()
	store, err := ck.b.newStore(table, ck.o.schema)
	if err != nil {
		return nil, err
	}
	ob, err := ck.b.newOutboxStore(outboxTable, ck.o.schema, 0)
	if err != nil {
		return nil, err
	}
	db, err := openDB(ctx, ck.b, ck.o.dsn)
	if err != nil {
		return nil, err
	}
	effectsBefore, err := ck.b.tables(ctx, db, "", effectsPrefix)
	if err != nil {
		closeDB(db)
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return &conformance.Harness{
		DB:        db,
		Store:     store,
		Outbox:    ob,
		TxOptions: ck.txOpts,
		Open:      func(ctx context.Context) (*gorm.DB, error) { return openDB(ctx, ck.b, ck.o.dsn) },
		Features:  ck.b.features,
		Close: func() error {
			defer closeDB(db)
			// Clean up even when ctx was cancelled: that is when it matters.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			// The outbox's _shards, _relay and _source tables and the partitions
			// share their table's prefix.
			err := errors.Join(ck.dropScratch(cctx, db, table), ck.dropScratch(cctx, db, outboxTable))
			ck.warnEffects(cctx, db, effectsBefore)
			return err
		},
	}, nil
}

// dropScratch drops the scratch table and every table whose name starts
// with it (partitions, detached ones included), and makes sure none is left.
func (ck *checker) dropScratch(ctx context.Context, db *gorm.DB, table string) error {
	var errs []error
	for attempt := 0; attempt < 3; attempt++ {
		names, err := ck.b.tables(ctx, db, ck.schema(), table)
		if err != nil {
			return fmt.Errorf("list scratch tables %s*: %w", table, err)
		}
		if len(names) == 0 {
			return nil
		}
		errs = errs[:0]
		// The parent first: on PostgreSQL it takes its partitions along.
		slices.Sort(names)
		for _, n := range names {
			if err := ck.b.dropTable(ctx, db, ck.schema(), n); err != nil {
				errs = append(errs, fmt.Errorf("drop %s: %w", n, err))
			}
		}
	}
	names, err := ck.b.tables(ctx, db, ck.schema(), table)
	if err == nil && len(names) > 0 {
		errs = append(errs, fmt.Errorf("scratch tables left behind: %s", strings.Join(names, ", ")))
	}
	return errors.Join(append(errs, err)...)
}

// warnEffects reports effect tables of the conformance suite that appeared
// while the check ran and are still there. The suite drops its own; one left
// behind is named so that it can be dropped by hand (it may belong to another
// run on the same database, so it is not dropped here).
func (ck *checker) warnEffects(ctx context.Context, db *gorm.DB, before []string) {
	after, err := ck.b.tables(ctx, db, "", effectsPrefix)
	if err != nil {
		return
	}
	for _, n := range after {
		if !slices.Contains(before, n) {
			fmt.Fprintf(ck.stderr, "inboxctl check: warning: table %s appeared during the check and is still there; drop it if no other check runs on this database\n", n)
		}
	}
}

func printCheckResult(w io.Writer, r checkResult, verbose bool) {
	fmt.Fprintf(w, "%s  %-58s %6.2fs\n", r.Status, r.Check, r.Seconds)
	if verbose {
		fmt.Fprintf(w, "      %s\n", r.Doc)
	}
	if r.Reason == "" {
		return
	}
	lines := strings.Split(r.Reason, "\n")
	for i, line := range lines {
		if i == maxReasonLines && len(lines) > maxReasonLines+1 {
			fmt.Fprintf(w, "      ... %d more lines (--json gives the whole reason)\n", len(lines)-i)
			break
		}
		fmt.Fprintf(w, "      %s\n", line)
	}
}

// maxReasonLines bounds the reason printed under a failed check; a check of
// concurrent deliveries can fail with hundreds of joined errors.
const maxReasonLines = 10

func printCheckSummary(w io.Writer, r checkReport) {
	total := len(r.Results) + r.NotRun
	var b strings.Builder
	if r.Failed == 0 && !r.Interrupted {
		fmt.Fprintf(&b, "PASS: %d of %d checks passed", r.Passed, total)
	} else {
		fmt.Fprintf(&b, "FAIL: %d of %d checks failed, %d passed", r.Failed, total, r.Passed)
	}
	if r.Skipped > 0 {
		fmt.Fprintf(&b, ", %d skipped", r.Skipped)
	}
	if r.NotRun > 0 {
		fmt.Fprintf(&b, ", %d not run", r.NotRun)
	}
	fmt.Fprintf(&b, " against %s in %.1fs", r.Dialect, r.Seconds)
	fmt.Fprintln(w, b.String())
}
