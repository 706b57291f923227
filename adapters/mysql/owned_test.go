package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

type session struct {
	id                    int64
	inTransaction, commit int // @@in_transaction, @@autocommit
}

// sessions holds n connections of pool at once (every connection of a
// pool of n, together with new ones if it has fewer) and reads their
// session state.
func sessions(t *testing.T, pool *sql.DB, n int) []session {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var out []session
	for range n {
		c, err := pool.Conn(ctx)
		if err != nil {
			t.Fatalf("take connection %d of %d: %v", len(out)+1, n, err)
		}
		defer func() { _ = c.Close() }()
		var s session
		if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID(), @@in_transaction, @@autocommit").Scan(&s.id, &s.inTransaction, &s.commit); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// ownedPool is the Store's one pool with autocommit off.
func ownedPool(t *testing.T, store *inboxmysql.Store) *sql.DB {
	t.Helper()
	pools := inboxmysql.OwnedPools(store)
	if len(pools) != 1 {
		t.Fatalf("the Store opened %d pools of its own, want 1", len(pools))
	}
	for _, p := range pools {
		return p
	}
	return nil
}

// TestOwnedTransactionsKeepTheContract: Process claims on a connection of
// the Store's own with autocommit off, so the claim opens the transaction.
// No way out (success, a handler error, a failed statement, a panic, a
// context ended between statements or during one, a connection killed
// under the handler, a handler that sets autocommit) may leave a
// connection in a transaction, an owned connection with autocommit on, or
// one of the caller's with autocommit off.
func TestOwnedTransactionsKeepTheContract(t *testing.T) {
	const poolSize = 4
	db := testDB(t, nil)
	userPool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	userPool.SetMaxOpenConns(poolSize)
	store := newStore(t, db, inboxmysql.Options{})
	effects := "effects_" + conformance.RandomSuffix()
	if err := db.Exec("CREATE TABLE " + effects + " (id VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB").Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS " + effects).Error })
	ib, err := inbox.New(db, store, inbox.Config{MaxAttempts: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	m := func(id string) inbox.Message { return inbox.Message{Consumer: "c", ID: id, Time: now} }
	insert := func(tx *gorm.DB, id string) error { return tx.Exec("INSERT INTO "+effects+" VALUES (?)", id).Error }
	ok := func(context.Context, *gorm.DB, inbox.Message) error { return nil }

	// The transaction runs on a connection of the Store's own.
	var inTx, autocommit int
	if out, err := ib.Process(t.Context(), m("owned"), func(_ context.Context, tx *gorm.DB, _ inbox.Message) error {
		return tx.Raw("SELECT @@in_transaction, @@autocommit").Row().Scan(&inTx, &autocommit)
	}); out != inbox.Processed || err != nil {
		t.Fatalf("Process: %v %v", out, err)
	}
	if inTx != 1 || autocommit != 0 {
		t.Errorf("in the handler: @@in_transaction %d, @@autocommit %d; want 1, 0 (the claim opened the transaction)", inTx, autocommit)
	}
	owned := ownedPool(t, store)
	if got := owned.Stats().MaxOpenConnections; got != poolSize {
		t.Errorf("the Store's pool allows %d connections, want %d as the caller's", got, poolSize)
	}

	// Begin inside a handler and nested transactions: the conformance
	// checks atomicity/begin-in-handler-is-refused and
	// atomicity/nested-transaction-is-a-savepoint, which run on this path.

	// Every way out.
	for name, h := range map[string]inbox.Handler{
		"error": func(_ context.Context, tx *gorm.DB, msg inbox.Message) error {
			_ = insert(tx, msg.ID)
			return errors.New("fails")
		},
		"panic": func(_ context.Context, tx *gorm.DB, msg inbox.Message) error {
			_ = insert(tx, msg.ID)
			panic("panics")
		},
		"failed statement": func(_ context.Context, tx *gorm.DB, _ inbox.Message) error { _ = insert(tx, "outer"); return nil }, // 1062 ignored
		"success":          func(_ context.Context, tx *gorm.DB, msg inbox.Message) error { return insert(tx, msg.ID) },
		"autocommit on": func(_ context.Context, tx *gorm.DB, msg inbox.Message) error {
			return tx.Exec("SET autocommit = 1").Error // commits what the transaction holds, on its own
		},
		"killed": func(_ context.Context, tx *gorm.DB, msg inbox.Message) error {
			var id int64
			if err := tx.Raw("SELECT CONNECTION_ID()").Row().Scan(&id); err != nil {
				return err
			}
			if err := insert(tx, msg.ID); err != nil {
				return err
			}
			return db.Exec("KILL ?", id).Error
		},
	} {
		for i := range 3 {
			_, _ = ib.Process(t.Context(), m(name+"-"+string(rune('0'+i))), h)
		}
	}
	// A context that ends between statements, and one that ends during
	// one (the driver then closes the connection).
	for _, during := range []bool{false, true} {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := ib.Process(ctx, m("cancelled"), func(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
			if err := insert(tx.WithContext(ctx), "cancelled"); err != nil {
				return err
			}
			if !during {
				cancel()
				return nil
			}
			time.AfterFunc(50*time.Millisecond, cancel)
			return tx.WithContext(ctx).Exec("SELECT SLEEP(2)").Error
		})
		cancel()
		if err == nil {
			t.Errorf("Process with a context cancelled during its transaction (during a statement %v): no error", during)
		}
	}
	if n := countWhere(t, db, effects, "cancelled"); n != 0 {
		t.Errorf("a cancelled transaction committed its effect %d times", n)
	}
	if n := countWhere(t, db, effects, "killed-0"); n != 0 {
		t.Errorf("a killed transaction committed its effect %d times", n)
	}
	if n := countWhere(t, db, effects, "success-0"); n != 1 {
		t.Errorf("a successful transaction committed its effect %d times, want 1", n)
	}
	if out, err := ib.Process(t.Context(), m("success-0"), ok); out != inbox.Duplicate || err != nil {
		t.Errorf("redelivery of a committed message: %v %v", out, err)
	}

	// A claim that fails on the server, a stale watermark write.
	hold := db.Begin()
	if _, err := store.Claim(t.Context(), hold, []storage.InboxRow{conformance.RowOf(m("held"))}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	if tx, _, _, err := store.BeginClaim(ctx, db.WithContext(ctx), nil, []storage.InboxRow{conformance.RowOf(m("held"))}); err == nil || tx != nil {
		t.Errorf("BeginClaim of a row another transaction holds, past its deadline: %v, %v", tx, err)
	}
	cancel()
	_ = hold.Rollback()
	if err := store.MigrateWatermarks(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS `" + store.Table() + inboxmysql.WatermarkSuffix + "`").Error })
	k := storage.WatermarkKey{Scope: "c", Source: "s", Epoch: 1, Topic: "t", Partition: 0}
	for _, w := range []storage.WatermarkWrite{{WatermarkKey: k, New: []byte("v1")}, {WatermarkKey: k, New: []byte("v2")}, {WatermarkKey: k, Old: []byte("v0"), New: []byte("v2")}} {
		// Bounded: a connection never handed back would hold the call.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		tx, ok, err := store.BeginSaveWatermarks(ctx, db.WithContext(t.Context()), nil, []storage.WatermarkWrite{w})
		cancel()
		switch {
		case w.Old == nil && string(w.New) == "v1":
			if err != nil || !ok {
				t.Fatalf("first write: %v %v", ok, err)
			}
			if err := tx.Commit().Error; err != nil {
				t.Fatal(err)
			}
		case !errors.Is(err, storage.ErrWatermarkMoved) || tx != nil:
			t.Errorf("stale write %+v: %v, %v; want ErrWatermarkMoved and nothing open", w, tx, err)
		}
	}

	for _, st := range []*sql.DB{userPool, owned} {
		if s := st.Stats(); s.InUse != 0 {
			t.Errorf("%d connections still in use after every call returned: %+v", s.InUse, s)
		}
	}
	for _, s := range sessions(t, owned, poolSize) {
		if s.inTransaction != 0 || s.commit != 0 {
			t.Errorf("owned connection %d: @@in_transaction %d, @@autocommit %d; want 0, 0", s.id, s.inTransaction, s.commit)
		}
	}
	for _, s := range sessions(t, userPool, poolSize) {
		if s.inTransaction != 0 || s.commit != 1 {
			t.Errorf("the caller's connection %d: @@in_transaction %d, @@autocommit %d; want 0, 1", s.id, s.inTransaction, s.commit)
		}
	}
}

func countWhere(t *testing.T, db *gorm.DB, table, id string) int64 {
	t.Helper()
	var n int64
	if err := db.Raw("SELECT COUNT(*) FROM "+table+" WHERE id = ?", id).Row().Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOwnedPoolTakesTheIsolationLevel: a transaction with an isolation
// level runs on a pool of that level, whose sessions have it as their
// default, so that no statement sets it per transaction.
func TestOwnedPoolTakesTheIsolationLevel(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{})
	ib, err := inbox.New(db, store, inbox.Config{TxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var level string
	var autocommit int
	if out, err := ib.Process(t.Context(), inbox.Message{Consumer: "c", ID: "rc", Time: time.Now()}, func(_ context.Context, tx *gorm.DB, _ inbox.Message) error {
		return tx.Raw("SELECT @@tx_isolation, @@autocommit").Row().Scan(&level, &autocommit)
	}); out != inbox.Processed || err != nil {
		t.Fatalf("Process: %v %v", out, err)
	}
	if level != "READ-COMMITTED" || autocommit != 0 {
		t.Errorf("in the handler: isolation %s, autocommit %d; want READ-COMMITTED, 0", level, autocommit)
	}
	ownedPool(t, store)
}

// TestOwnedPathFallsBack: where the Store cannot open a pool of its own
// for the caller's (GORM's prepared statements, a connection the caller
// opened, a read-only transaction, a level MySQL lacks, the path turned
// off, a closed Store), BeginClaim opens nothing and the inbox begins and
// claims as usual.
func TestOwnedPathFallsBack(t *testing.T) {
	dsn, err := inboxmysql.StrictDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	db := testDB(t, nil)
	userPool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ownConn, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: userPool, DSN: dsn, DisableWithReturning: true}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	closed := newStore(t, db, inboxmysql.Options{})
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	row := []storage.InboxRow{conformance.RowOf(inbox.Message{Consumer: "c", ID: "x", Time: time.Now()})}
	for _, c := range []struct {
		name  string
		db    *gorm.DB
		store *inboxmysql.Store
		opts  *sql.TxOptions
	}{
		{"PrepareStmt", db.Session(&gorm.Session{PrepareStmt: true}), nil, nil},
		{"the caller's connection", ownConn, nil, nil},
		{"read-only", db, nil, &sql.TxOptions{ReadOnly: true}},
		{"snapshot isolation", db, nil, &sql.TxOptions{Isolation: sql.LevelSnapshot}},
		{"disabled", db, newStore(t, db, inboxmysql.Options{OwnedPool: inboxmysql.OwnedPool{Disabled: true}}), nil},
		{"closed", db, closed, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := c.store
			if store == nil {
				store = newStore(t, db, inboxmysql.Options{})
			}
			tx, _, ok, err := store.BeginClaim(t.Context(), c.db.WithContext(t.Context()), c.opts, row)
			if ok || err != nil || tx != nil {
				t.Fatalf("BeginClaim: %v %v %v; want the generic path", tx, ok, err)
			}
			if n := len(inboxmysql.OwnedPools(store)); n != 0 {
				t.Fatalf("the Store opened %d pools", n)
			}
			if c.opts != nil {
				return
			}
			processTwice(t, c.db, store)
		})
	}
}

// TestOwnedPathFallsBackWhenItCannotConnect: the Store's connections count
// against the server's limits; where it cannot connect (here a user
// allowed one connection, which the caller's pool holds), Process runs on
// the caller's pool with BEGIN rather than failing.
func TestOwnedPathFallsBackWhenItCannotConnect(t *testing.T) {
	admin := testDB(t, nil)
	cfg, err := gomysql.ParseDSN(testservers.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	user := "owned_" + conformance.RandomSuffix()
	hosts := []string{"%", "localhost", "127.0.0.1"}
	for _, host := range hosts {
		for _, q := range []string{
			"CREATE USER '" + user + "'@'" + host + "' IDENTIFIED BY 'pw' WITH MAX_USER_CONNECTIONS 1",
			"GRANT ALL PRIVILEGES ON `" + cfg.DBName + "`.* TO '" + user + "'@'" + host + "'",
		} {
			if err := admin.Exec(q).Error; err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, host := range hosts {
			_ = admin.Exec("DROP USER IF EXISTS '" + user + "'@'" + host + "'").Error
		}
	})
	cfg.User, cfg.Passwd = user, "pw"
	db, err := openDB(cfg.FormatDSN(), recommended)
	if err != nil {
		t.Fatal(err)
	}
	userPool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = userPool.Close() })
	userPool.SetMaxOpenConns(1)
	store := newStore(t, db, inboxmysql.Options{})
	processTwice(t, db, store)
	for _, pool := range inboxmysql.OwnedPools(store) {
		if n := pool.Stats().OpenConnections; n != 0 {
			t.Errorf("the Store's pool holds %d connections, want none (the user may have one, held by the caller's pool)", n)
		}
	}
}

// processTwice runs one message through an inbox on db and store twice:
// Processed, then Duplicate.
func processTwice(t *testing.T, db *gorm.DB, store *inboxmysql.Store) {
	t.Helper()
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	msg := inbox.Message{Consumer: "c", ID: "p", Time: time.Now()}
	for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
		if out, err := ib.Process(t.Context(), msg, func(context.Context, *gorm.DB, inbox.Message) error { return nil }); out != want || err != nil {
			t.Fatalf("Process: %v %v, want %v", out, err, want)
		}
	}
}
