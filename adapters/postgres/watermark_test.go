package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/storage"
)

// ownPool saves watermarks in a transaction of its own pool, committed
// before SaveWatermarks returns: outside the caller's transaction, and
// without holding the stream's row while that transaction runs.
type ownPool struct {
	*inboxpg.Store
	db *gorm.DB
}

func (s ownPool) SaveWatermarks(ctx context.Context, _ *gorm.DB, writes []storage.WatermarkWrite) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return s.Store.SaveWatermarks(ctx, tx, writes) })
}

// On a server that runs writers side by side, a store that writes outside
// the caller's transaction does not make a second member wait: the check
// says so (on SQLite the second member waits for the first one's write
// lock whatever the store does).
func TestWatermarkChecksCatchWritesOutsideTheTransaction(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
	healthy := newHarness(dsn, nil, openDB, false)
	broken := func(ctx context.Context) (*conformance.Harness, error) {
		h, err := healthy(ctx)
		if err != nil {
			return nil, err
		}
		own, err := openDB(dsn)
		if err != nil {
			return nil, err
		}
		h.Store = ownPool{Store: h.Store.(*inboxpg.Store), db: own}
		closeHarness := h.Close
		h.Close = func() error { _ = closeDB(own); return closeHarness() }
		return h, nil
	}
	for _, id := range []string{"watermark/second-member-waits", "watermark/atomic-with-effect"} {
		c := check(t, id)
		err := conformance.RunCheck(t.Context(), broken, c)
		if err == nil || errors.Is(err, conformance.ErrSkipped) {
			t.Errorf("check %s on a store that writes outside the transaction: %v, want it failed", id, err)
			continue
		}
		t.Logf("caught: %v", err)
	}
}

// check returns the suite's check id.
func check(t *testing.T, id string) conformance.Check {
	t.Helper()
	for _, c := range conformance.Checks() {
		if c.ID() == id {
			return c
		}
	}
	t.Fatalf("no check %s", id)
	return conformance.Check{}
}

// Every update of a stream is a heap-only tuple update: no index covers
// what it changes, so no index entry is written for it.
func TestWatermarkUpdatesAreHOT(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	ctx := t.Context()
	if err := store.MigrateWatermarks(ctx, db); err != nil {
		t.Fatal(err)
	}
	k := storage.WatermarkKey{Scope: "c", Source: "src", Epoch: 1, Topic: "orders"}
	if err := db.Transaction(func(tx *gorm.DB) error {
		return store.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{{WatermarkKey: k, New: []byte("0")}})
	}); err != nil {
		t.Fatal(err)
	}
	table := `"` + store.Schema() + `"."` + store.Table() + inboxpg.WatermarkSuffix + `"`
	const updates = 20
	err := db.Transaction(func(tx *gorm.DB) error {
		for i := range updates {
			w := storage.WatermarkWrite{WatermarkKey: k, Old: fmt.Append(nil, i), New: fmt.Append(nil, i+1)}
			if err := store.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{w}); err != nil {
				return err
			}
		}
		// This transaction's own counts: the server's statistics of other
		// transactions arrive late.
		var n struct{ Updated, HOT int64 }
		if err := tx.Raw(`SELECT pg_stat_get_xact_tuples_updated(?::regclass) AS updated, pg_stat_get_xact_tuples_hot_updated(?::regclass) AS hot`,
			table, table).Scan(&n).Error; err != nil {
			return err
		}
		if n.Updated != updates || n.HOT != updates {
			t.Errorf("%d updates of a stream: %d rows updated, %d of them heap-only; want all %d heap-only", updates, n.Updated, n.HOT, updates)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// MigrateWatermarks and Verify refuse a watermark table of another
// layout, naming the table and what they found.
func TestMigrateWatermarksRefusesOtherLayouts(t *testing.T) {
	const names = `scope text COLLATE "C" NOT NULL, source text COLLATE "C" NOT NULL, topic text COLLATE "C" NOT NULL`
	const rest = `epoch bigint NOT NULL, partition_no integer NOT NULL, applied bytea NOT NULL, updated_at timestamptz NOT NULL`
	const key = `PRIMARY KEY (scope, topic, partition_no, source, epoch)`
	for name, c := range map[string]struct{ ddl, says string }{
		"a key without the epoch": {`(` + names + `, ` + rest + `, PRIMARY KEY (scope, topic, partition_no, source))`, "primary key is (scope,topic,partition_no,source)"},
		"a nondeterministic collation": {`(` + strings.Replace(names, `scope text COLLATE "C"`, `scope text COLLATE "und-x-icu-ci"`, 1) + `, ` + rest + `, ` + key + `)`,
			"column scope has a nondeterministic collation"},
		"values as text":       {`(` + names + `, ` + strings.Replace(rest, "applied bytea", "applied text", 1) + `, ` + key + `)`, `column applied has type "text", want bytea`},
		"a 32-bit epoch":       {`(` + names + `, ` + strings.Replace(rest, "epoch bigint", "epoch integer", 1) + `, ` + key + `)`, `column epoch has type "integer", want bigint`},
		"a nullable value":     {`(` + names + `, ` + strings.Replace(rest, "applied bytea NOT NULL", "applied bytea", 1) + `, ` + key + `)`, "column applied is nullable"},
		"no updated_at column": {`(` + names + `, ` + strings.Replace(rest, ", updated_at timestamptz NOT NULL", "", 1) + `, ` + key + `)`, "no column updated_at"},
		"no primary key":       {`(` + names + `, ` + rest + `)`, "primary key is ()"},
	} {
		ddl := c.ddl
		t.Run(name, func(t *testing.T) {
			db, store := fresh(t, inboxpg.Options{})
			if strings.Contains(ddl, "icu") {
				if err := db.Exec(`CREATE COLLATION IF NOT EXISTS "` + store.Schema() + `"."und-x-icu-ci" (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`).Error; err != nil {
					t.Skipf("no ICU collations on this server: %v", err)
				}
				ddl = strings.ReplaceAll(ddl, `"und-x-icu-ci"`, `"`+store.Schema()+`"."und-x-icu-ci"`)
			}
			table := `"` + store.Schema() + `"."` + store.Table() + inboxpg.WatermarkSuffix + `"`
			if err := db.Exec(`CREATE TABLE ` + table + ` ` + ddl).Error; err != nil {
				t.Fatal(err)
			}
			for what, err := range map[string]error{
				"MigrateWatermarks": store.MigrateWatermarks(t.Context(), db),
				"Verify":            store.Verify(t.Context(), db),
			} {
				if err == nil || !strings.Contains(err.Error(), store.Table()+inboxpg.WatermarkSuffix) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("%s on a table with %s: %v, want an error naming the table that says %q", what, name, err, c.says)
				}
			}
		})
	}
}

// The longest inbox table name New takes leaves no room for the watermark
// table's suffix: the watermark methods refuse it, the inbox works.
func TestWatermarkTableNameTooLong(t *testing.T) {
	store, err := inboxpg.New(inboxpg.Options{Table: strings.Repeat("t", inboxpg.MaxTableBytes)})
	if err != nil {
		t.Fatal(err)
	}
	if err := conformance.CheckNoWatermarkTable(t.Context(), store); err != nil {
		t.Error(err)
	}
}

// A member that waits for a stream longer than its lock_timeout gives up
// with an error IsRetryable reports, never "moved" (a deadlock is the
// suite's watermark/crossed-writes).
func TestWatermarkLockTimeoutIsRetryable(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	ctx := t.Context()
	shortWait := func(tx *gorm.DB) error { return tx.Exec(`SET LOCAL lock_timeout = '100ms'`).Error }
	if err := store.MigrateWatermarks(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := conformance.CheckWatermarkLockWait(ctx, store, db, db, shortWait); err != nil {
		t.Fatal(err)
	}
}
