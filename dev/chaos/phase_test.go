package chaos_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/chaos"
)

// phaseDB is a database a phase test runs on, with the settings that
// depend on it.
type phaseDB struct {
	dialect      string
	dsn          func(testing.TB) string
	storeOffsets bool   // Config.Offsets.Store
	end          string // the partition phase's end of a frozen link
}

var (
	sqliteDB   = phaseDB{dialect: "sqlite", dsn: func(testing.TB) string { return "" }}
	postgresDB = phaseDB{dialect: "postgres", dsn: testservers.PostgresDSN}
	mysqlDB    = phaseDB{dialect: "mysql", dsn: testservers.MySQLDSN}
)

// runPhase runs one phase of the chaos run on the shared servers, as a
// subtest per database of dbs that the environment variable only
// (comma-separated dialects, unset for all) names, each within timeout.
// run starts the phase with cfg, which has the database, the brokers, a
// fresh seed, a work directory and the test's log, and sets the rest; the
// report it returns is logged, its error fails the subtest, and check
// looks at the report. The reports end in one table, of every database.
func runPhase[T any, R interface {
	*T
	String() string
}](t *testing.T, only string, timeout time.Duration, dbs []phaseDB,
	run func(ctx context.Context, cfg chaos.Config, db phaseDB) (R, error),
	check func(t *testing.T, rep R), table func([]R) string,
) {
	brokers := testservers.KafkaBrokers(t)
	names := os.Getenv(only)
	var reps []R
	for _, db := range dbs {
		if names != "" && !strings.Contains(","+names+",", ","+db.dialect+",") {
			continue
		}
		t.Run(db.dialect, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			rep, err := run(ctx, chaos.Config{
				Dialect: db.dialect, DSN: db.dsn(t), Brokers: brokers, StoreOffsets: db.storeOffsets,
				Seed: uint64(time.Now().UnixNano()), WorkDir: t.TempDir(), Log: testWriter{t},
			}, db)
			if rep != nil {
				t.Log("\n" + rep.String())
				reps = append(reps, rep)
			}
			if err != nil {
				t.Fatal(err)
			}
			check(t, rep)
		})
	}
	t.Log("\n" + table(reps))
}
