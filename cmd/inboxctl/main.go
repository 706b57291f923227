// Command inboxctl is the operator's tool for the inbox table of
// github.com/inboxgo/inbox: it creates and upgrades the table, runs its
// maintenance (prepare the coming days, expire old ones), reports what the
// table holds and the watermarks of sequenced dedup, and checks that a live
// database keeps the inbox row and the business effect atomic.
//
// Usage:
//
//	inboxctl <command> [flags]
//
// Commands:
//
//	migrate      create or upgrade the inbox table and its watermark table
//	maintain     prepare the coming days and expire old ones (--dry-run shows the plan)
//	stats        rows per consumer and day, oldest and newest day, watermark streams per consumer, size on disk
//	watermarks   a consumer's watermarks of sequenced dedup: per stream, the sequence numbers applied
//	check        run the conformance checks against the live database
//	deadletters  list|inspect|redrive the dead letters of a dead-letter topic (Kafka only)
//	offsets      show|reset a group's stored offsets (consumer Offsets.Store), beside the log's
//	outbox       migrate|maintain|stats|source|bump-epoch for the outbox table (package outbox)
//
// Every command but deadletters takes the connection flags:
//
//	--dialect postgres|mysql|sqlite  the database (default: inferred from the DSN)
//	--dsn DSN                        the database to use (default: $INBOX_DSN)
//	--table NAME                     the inbox table (default: the adapter's default, inbox_messages)
//	--schema NAME                    the table's PostgreSQL schema (default public) or MySQL database (default the DSN's)
//	--timeout DURATION               give up after this long (default 10m)
//	--json                           print the result as JSON
//	-v                               verbose: the inbox's log on stderr; for check, what each check proves
//
// and maintain and stats take --retention-days (default 30) and
// --prepare-days (default 7), which must match the Config of the
// applications that use the inbox. "inboxctl <command> -h" prints each
// command's flags with examples.
//
// The DSN is the driver's: a URL or key=value string for PostgreSQL (pgx), the
// go-sql-driver/mysql form user:password@tcp(host:3306)/db?... for MySQL and
// MariaDB, and a go-sqlite3 file name or file: URI for SQLite. It is used
// exactly as given, so that check tests the settings the applications use.
// (Applications that open MySQL through the adapter's Open get
// STRICT_TRANS_TABLES added when their DSN sets no sql_mode; inboxctl adds
// nothing, so give it the DSN that inboxmysql.StrictDSN returns for theirs.)
//
// watermarks --consumer NAME [--topic T] [--partition N] lists the streams
// of a consumer with sequenced dedup (consumer Config.Sequenced.Sources), as
// committed in the watermark table <table>_watermarks: topic, partition,
// outbox source and epoch, and the highest sequence number applied in each
// shard of the source, as "shards 64, min 120, max 409" (-v and --json
// list every shard), sorted by topic, partition, source and epoch. A stored
// value that does not decode is reported, naming its stream, and the exit
// status is 1:
//
//	inboxctl watermarks --dsn "$DSN" --consumer billing --topic orders -v
//
// deadletters list|inspect|redrive --brokers B --topic DLQ reads a
// dead-letter topic (consumer Config.Failure.DeadLetterTopic) up to its end offsets
// as they were at the start, filtered by --reason, --original-topic,
// --from/--to (the dead-lettering time) and --partition/--offset. list
// prints a line per dead letter, inspect each in full, and redrive copies
// each back onto its original topic and partition as it is (its sequence
// headers stay renamed, so the consumer deduplicates it by its inbox row)
// with the header dlq_redriven_from (header.DLQRedrivenFrom) naming the
// dead letter, at --rate per second; --dry-run sends nothing:
//
//	inboxctl deadletters redrive --brokers kafka:9092 --topic orders.dlq --reason handler-error --dry-run
//
// offsets show|reset --group G [--topic T] reads or moves the consumer's
// stored offsets (Config.Offsets.Store, the table --table, default
// inbox_offsets), beside each partition's log start and end when --brokers
// is given. reset (--to-offset N, --to-time T, --to-start or --to-end;
// --dry-run) refuses while the group has members: stop its consumers
// first, as for any offset reset.
//
//	inboxctl offsets reset --dsn "$DSN" --brokers kafka:9092 --group billing --topic orders --to-time 2026-12-01T08:00:00Z
//
// check runs each conformance check (conformance.Checks: by default every
// area but the slow retention checks; --all for every check) in a scratch
// table named inboxctl_check_<random> that it creates and drops, never in the
// inbox table, and first asks the adapter to verify the connection's settings
// (a transactional engine, a strict SQL mode, write-ahead logging...). A
// setting that breaks atomicity is a failed check.
//
// Results go to stdout, errors and diagnostics to stderr.
//
// Exit status:
//
//	0  the command succeeded; for check, every check passed
//	1  the operation failed, or (check) at least one check failed
//	2  usage error: unknown command or flag, missing or inconsistent flags
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command: it parses args, runs the subcommand and returns
// the exit status. SIGINT and SIGTERM cancel the running operation (check
// still drops its scratch tables).
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"migrate", "create or upgrade the inbox table and its watermark table", runMigrate},
		{"maintain", "prepare the coming days and expire old ones (--dry-run shows the plan)", runMaintain},
		{"stats", "rows per consumer and day, oldest and newest day, watermark streams per consumer, size on disk", runStats},
		{"watermarks", "a consumer's watermarks of sequenced dedup: per stream, the sequence numbers applied (--consumer NAME)", runWatermarks},
		{"check", "run the conformance checks against the live database", runCheck},
		{"deadletters", "list, inspect or redrive the dead letters of a dead-letter topic (inboxctl deadletters list|inspect|redrive --topic T)", runDeadLetters},
		{"offsets", "show or reset a group's stored offsets (consumer Offsets.Store), beside the log's (inboxctl offsets show|reset --group G)", runOffsets},
		{"outbox", "migrate, maintain or report the outbox table, show or bump its epoch (inboxctl outbox migrate|maintain|stats|source|bump-epoch)", runOutbox},
	}
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	case "help":
		if len(rest) == 0 {
			usage(stdout)
			return exitOK
		}
		return runContext(ctx, []string{rest[0], "-h"}, stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, rest, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "inboxctl: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `inboxctl manages and checks the inbox table of github.com/inboxgo/inbox.

Usage:
  inboxctl <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s  %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `  help         show a command's flags and examples: inboxctl help <command>

The database is given by --dsn (or $INBOX_DSN) and --dialect postgres|mysql|sqlite
(inferred from the DSN when unambiguous).

Exit status: 0 ok; 1 the operation failed or a check failed; 2 usage error.
`)
}

// errUsage marks errors that are the caller's mistake (exit status 2).
var errUsage = errors.New("usage error")

// usageErrorf returns an error wrapping errUsage.
func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// fail prints err to stderr and returns its exit status.
func fail(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "inboxctl %s: %v\nRun \"inboxctl %s -h\" for help.\n", cmd, err, cmd)
		return exitUsage
	}
	fmt.Fprintf(stderr, "inboxctl %s: %v\n", cmd, err)
	return exitFailed
}
