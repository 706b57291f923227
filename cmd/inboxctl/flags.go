package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"
)

// dsnEnv names the environment variable --dsn defaults to.
const dsnEnv = "INBOX_DSN"

// options are the flags every command shares.
type options struct {
	dialect string
	dsn     string
	table   string
	schema  string
	timeout time.Duration
	json    bool
	verbose bool

	// create allows opening a database that does not exist yet (migrate).
	create bool

	// Only for commands that take the retention flags.
	retentionDays int
	prepareDays   int
}

// cmdSpec describes one command's help.
type cmdSpec struct {
	name      string
	synopsis  string // one paragraph: what the command does
	examples  string
	retention bool          // takes --retention-days and --prepare-days
	timeout   time.Duration // default --timeout; 10m if zero
}

// newFlagSet returns the command's flag set with the shared flags defined.
func newFlagSet(spec cmdSpec) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet("inboxctl "+spec.name, flag.ContinueOnError)
	o := &options{}
	fs.StringVar(&o.dialect, "dialect", "", "database `dialect`: postgres, mysql (also MariaDB) or sqlite; inferred from the DSN when unambiguous")
	fs.StringVar(&o.dsn, "dsn", "", "the driver's `DSN`, used exactly as given (default $"+dsnEnv+")")
	fs.StringVar(&o.table, "table", "", "inbox `table` name (default: the adapter's, inbox_messages)")
	fs.StringVar(&o.schema, "schema", "", "`schema` of the inbox table: PostgreSQL schema (default public), MySQL database (default the DSN's)")
	timeout := spec.timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	fs.DurationVar(&o.timeout, "timeout", timeout, "give up after this `duration`")
	fs.BoolVar(&o.json, "json", false, "print the result as JSON")
	fs.BoolVar(&o.verbose, "v", false, "verbose: the inbox's log on stderr; for check, what each check proves")
	if spec.retention {
		fs.IntVar(&o.retentionDays, "retention-days", 30, "`days` before today whose rows are kept (the applications' Config.RetentionDays)")
		fs.IntVar(&o.prepareDays, "prepare-days", 7, "`days` after today to prepare storage for (the applications' Config.PrepareDays)")
	}
	fs.Usage = func() { printHelp(fs.Output(), fs, spec) }
	return fs, o
}

func printHelp(w io.Writer, fs *flag.FlagSet, spec cmdSpec) {
	fmt.Fprintf(w, "Usage: inboxctl %s [flags]\n\n%s\n\nFlags:\n", spec.name, spec.synopsis)
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		line := "  " + dash + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
	fmt.Fprintf(w, "\nExamples:\n%s\nExit status: 0 ok; 1 the operation failed%s; 2 usage error.\n",
		spec.examples, map[bool]string{true: " or a check failed", false: ""}[spec.name == "check"])
}

// parseFlags parses args. It returns errHelp after printing the help to
// stdout for -h, and a usage error (the flag package's message) otherwise.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(stdout)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return errHelp
	}
	if err != nil {
		// The flag package's message is the first line it printed.
		msg, _, _ := strings.Cut(out.String(), "\n")
		return usageErrorf("%s", msg)
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q (every option is a flag)", fs.Arg(0))
	}
	return nil
}

var errHelp = errors.New("help requested")

// Dialect names.
const (
	dialectPostgres = "postgres"
	dialectMySQL    = "mysql"
	dialectSQLite   = "sqlite"
)

// resolve fills the DSN from the environment, infers or validates the
// dialect and checks the numeric flags.
func (o *options) resolve(retention bool) error {
	if o.dsn == "" {
		o.dsn = strings.TrimSpace(os.Getenv(dsnEnv))
	}
	if o.dsn == "" {
		return usageErrorf("no database: pass --dsn or set $%s", dsnEnv)
	}
	if o.dialect == "" {
		d, err := inferDialect(o.dsn)
		if err != nil {
			return err
		}
		o.dialect = d
	} else if err := o.normalizeDialect(); err != nil {
		return err
	}
	if o.schema != "" && o.dialect == dialectSQLite {
		return usageErrorf("--schema is for PostgreSQL and MySQL only; the SQLite table lives in the database file")
	}
	if o.timeout <= 0 {
		return usageErrorf("--timeout must be positive, got %v", o.timeout)
	}
	if retention {
		if o.retentionDays < 1 {
			return usageErrorf("--retention-days must be at least 1, got %d", o.retentionDays)
		}
		if o.prepareDays < 0 {
			return usageErrorf("--prepare-days must not be negative, got %d", o.prepareDays)
		}
	}
	return nil
}

// normalizeDialect turns the --dialect given into one of the dialect
// constants.
func (o *options) normalizeDialect() error {
	switch strings.ToLower(o.dialect) {
	case "postgres", "postgresql", "pg", "pgx":
		o.dialect = dialectPostgres
	case "mysql", "mariadb":
		o.dialect = dialectMySQL
	case "sqlite", "sqlite3":
		o.dialect = dialectSQLite
	default:
		return usageErrorf("unknown --dialect %q: want postgres, mysql or sqlite", o.dialect)
	}
	return nil
}

var (
	// user:password@tcp(host:3306)/db, @unix(/path)/db, tcp(host)/db, or user@/db.
	mysqlDSNForm = regexp.MustCompile(`^([^@/]*@)?(tcp|tcp4|tcp6|unix)\([^)]*\)/|^[^@/\s]*@/`)
	// libpq key=value form.
	pgKeyValue = regexp.MustCompile(`(^|\s)(host|hostaddr|dbname|user|port|sslmode|password)=`)
	sqliteExt  = regexp.MustCompile(`(?i)\.(db|sqlite|sqlite3|db3)$`)
)

// inferDialect guesses the dialect from the form of the DSN, and refuses to
// guess when the form does not say.
func inferDialect(dsn string) (string, error) {
	lower := strings.ToLower(dsn)
	path, _, _ := strings.Cut(dsn, "?")
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return dialectPostgres, nil
	case strings.HasPrefix(lower, "mysql://"), strings.HasPrefix(lower, "mariadb://"):
		return "", usageErrorf("MySQL DSNs are in the go-sql-driver/mysql form user:password@tcp(host:3306)/dbname?parseTime=true, not a URL")
	case mysqlDSNForm.MatchString(dsn):
		return dialectMySQL, nil
	case strings.HasPrefix(lower, "file:"), sqliteExt.MatchString(path):
		return dialectSQLite, nil
	case pgKeyValue.MatchString(dsn):
		return dialectPostgres, nil
	}
	return "", usageErrorf("cannot tell the dialect from the DSN; pass --dialect postgres, mysql or sqlite")
}
