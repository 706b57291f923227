package txn

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/callbacks"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/migrator"
	"gorm.io/gorm/schema"
)

// hangDriver is a database/sql driver whose BEGIN waits for its context
// (as every driver's does), and whose COMMIT and ROLLBACK wait for release
// whatever their context (as go-sql-driver/mysql's, over a link that drops
// every packet).
type hangDriver struct {
	hang     atomic.Value // "begin", "commit", "rollback" or ""
	release  chan struct{}
	inFlight atomic.Int32 // COMMITs and ROLLBACKs waiting for release
}

func (d *hangDriver) Open(string) (driver.Conn, error) { return &hangConn{d: d}, nil }

type hangConn struct{ d *hangDriver }

func (c *hangConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("no statements") }
func (c *hangConn) Close() error                        { return nil }
func (c *hangConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *hangConn) BeginTx(ctx context.Context, _ driver.TxOptions) (driver.Tx, error) {
	if c.d.hang.Load() == "begin" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &hangTx{d: c.d}, nil
}

type hangTx struct{ d *hangDriver }

func (t *hangTx) end(step string) error {
	if t.d.hang.Load() == step {
		t.d.inFlight.Add(1)
		defer t.d.inFlight.Add(-1)
		<-t.d.release
	}
	return nil
}

func (t *hangTx) Commit() error   { return t.end("commit") }
func (t *hangTx) Rollback() error { return t.end("rollback") }

// hangDialector is the least GORM needs to run transactions on a pool.
type hangDialector struct{ pool *sql.DB }

func (d hangDialector) Name() string { return "hang" }
func (d hangDialector) Initialize(db *gorm.DB) error {
	callbacks.RegisterDefaultCallbacks(db, &callbacks.Config{})
	db.ConnPool = d.pool
	return nil
}
func (d hangDialector) Migrator(db *gorm.DB) gorm.Migrator {
	return migrator.Migrator{Config: migrator.Config{DB: db, Dialector: d}}
}
func (hangDialector) DataTypeOf(*schema.Field) string                     { return "" }
func (hangDialector) DefaultValueOf(*schema.Field) clause.Expression      { return nil }
func (hangDialector) BindVarTo(w clause.Writer, _ *gorm.Statement, _ any) { _ = w.WriteByte('?') }
func (hangDialector) QuoteTo(w clause.Writer, s string)                   { _, _ = w.WriteString(s) }
func (hangDialector) Explain(s string, _ ...any) string                   { return s }

type noneTransient struct{}

func (noneTransient) IsRetryable(error) bool { return false }

func openHang(t *testing.T) (*gorm.DB, *hangDriver) {
	t.Helper()
	d := &hangDriver{release: make(chan struct{})}
	pool := sql.OpenDB(hangConnector{d})
	t.Cleanup(func() {
		d.hang.Store("")
		select {
		case <-d.release:
		default:
			close(d.release)
		}
		// The steps given up return once the driver does: none is left.
		for deadline := time.Now().Add(5 * time.Second); d.inFlight.Load() > 0; {
			if time.Now().After(deadline) {
				t.Error("a COMMIT or ROLLBACK given up never returned")
				break
			}
			time.Sleep(time.Millisecond)
		}
		pool.Close()
	})
	db, err := gorm.Open(hangDialector{pool: pool}, &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := TrackStatements(db); err != nil {
		t.Fatal(err)
	}
	return db, d
}

type hangConnector struct{ d *hangDriver }

func (c hangConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open("") }
func (c hangConnector) Driver() driver.Driver                        { return c.d }

// Each of a transaction's own steps gives up after its bound, as a database
// failure wrapping a *TimeoutError (and context.DeadlineExceeded): BEGIN,
// which the driver ends when its context is cancelled; COMMIT and ROLLBACK,
// which it does not (the step goes on in the background until the driver
// returns). Without a bound COMMIT waits for the driver.
func TestStepsGiveUpAfterTheirBound(t *testing.T) {
	const bound = 100 * time.Millisecond
	errHandler := errors.New("the handler's own failure")
	for _, tc := range []struct {
		hang    string
		fnErr   error
		wantOp  string // the Failure's Op; "" for fn's own error
		wantErr error
	}{
		{hang: "begin", wantOp: "begin"},
		{hang: "commit", wantOp: "commit"},
		{hang: "rollback", fnErr: errHandler, wantErr: errHandler},
	} {
		t.Run(tc.hang, func(t *testing.T) {
			db, d := openHang(t)
			d.hang.Store(tc.hang)
			ran := false
			start := time.Now()
			err := Transact(t.Context(), db, noneTransient{}, nil, bound, func(*gorm.DB) error { ran = true; return tc.fnErr })
			took := time.Since(start)
			if took > bound+2*time.Second {
				t.Fatalf("Transact returned after %v, bound %v", took, bound)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			var f *Failure
			var te *TimeoutError
			switch {
			case !errors.As(err, &f) || f.Op != tc.wantOp:
				t.Fatalf("err = %v, want a database failure at %s", err, tc.wantOp)
			case !errors.As(err, &te) || te.Bound != bound:
				t.Fatalf("err = %v, want a *TimeoutError with the bound", err)
			case !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("err = %v does not wrap context.DeadlineExceeded", err)
			case took < bound:
				t.Fatalf("gave up after %v, before the bound %v", took, bound)
			}
			if ran != (tc.hang != "begin") {
				t.Fatalf("fn ran: %v", ran)
			}
		})
	}

	t.Run("commit without a bound", func(t *testing.T) {
		db, d := openHang(t)
		d.hang.Store("commit")
		done := make(chan error, 1)
		go func() {
			done <- Transact(context.Background(), db, noneTransient{}, nil, 0, func(*gorm.DB) error { return nil })
		}()
		select {
		case err := <-done:
			t.Fatalf("COMMIT returned without the driver: %v", err)
		case <-time.After(3 * bound):
		}
		close(d.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// WithBound tells a step's error that its bound caused from one that came
// before it, and from one caused by the caller's own cancellation.
func TestWithBound(t *testing.T) {
	errStep := errors.New("the driver's error")
	ctx, bounded, cancel := WithBound(t.Context(), "the claim", 20*time.Millisecond)
	if err := bounded(errStep); err != errStep {
		t.Fatalf("before the bound: %v", err)
	}
	<-ctx.Done()
	var te *TimeoutError
	if err := bounded(errStep); !errors.As(err, &te) || !errors.Is(err, errStep) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the bound: %v", err)
	}
	if bounded(nil) != nil {
		t.Fatal("a step that succeeded got an error")
	}
	cancel()

	parent, cancelParent := context.WithCancel(t.Context())
	_, bounded, cancel = WithBound(parent, "the claim", time.Hour)
	defer cancel()
	cancelParent()
	if err := bounded(errStep); err != errStep {
		t.Fatalf("the caller's cancellation taken for the bound: %v", err)
	}
	ctx, bounded, cancel = WithBound(t.Context(), "the claim", 0)
	defer cancel()
	if _, ok := ctx.Deadline(); ok || bounded(errStep) != errStep {
		t.Fatal("no bound still bounded")
	}
}

// BenchmarkBoundsCost is what the bounds add to one consumer transaction
// on the non-pipelined path: a timer for BEGIN, one for the claim and one
// for the stored offset's write, and a goroutine with a timer for COMMIT.
func BenchmarkBoundsCost(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for b.Loop() {
		t := time.AfterFunc(time.Minute, func() {})
		t.Stop()
		for range 2 {
			sctx, bounded, stop := WithBound(ctx, "a step", time.Minute)
			_ = bounded(sctx.Err())
			stop()
		}
		_ = within(time.Minute, "COMMIT", func() error { return nil })
	}
}

// AfterCommit's functions run once the transaction committed, never for
// one that rolled back; outside
// a transaction run by Transact it reports that it cannot.
func TestAfterCommit(t *testing.T) {
	db, _ := openHang(t)
	ran := 0
	if err := Transact(t.Context(), db, noneTransient{}, nil, 0, func(tx *gorm.DB) error {
		if !AfterCommit(tx, func() { ran++ }) {
			t.Fatal("AfterCommit refused a transaction run by Transact")
		}
		if ran != 0 {
			t.Fatal("ran before the commit")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Fatalf("ran %d times after the commit, want 1", ran)
	}
	errFn := errors.New("rolled back")
	if err := Transact(t.Context(), db, noneTransient{}, nil, 0, func(tx *gorm.DB) error {
		AfterCommit(tx, func() { ran++ })
		return errFn
	}); !errors.Is(err, errFn) {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Fatal("ran after a rollback")
	}
	tx := db.Begin()
	defer tx.Rollback()
	if AfterCommit(tx, func() { ran++ }) {
		t.Fatal("AfterCommit took a transaction that does not tell its commit")
	}
}
