// Package txn runs the transactions of the inbox, the consumer and the
// outbox: it follows their statements, and tells the database's failures
// apart from those of the work done in them.
package txn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// The fault model. Every retry loop of this library retries without limit
// only what IsDatabaseFailure (exported as inbox.IsDatabaseFailure)
// reports: a failure of the database itself, never anything a handler or a
// payload can produce. An error is a database
// failure when
//   - BEGIN failed, or the inbox's own claim statement failed, or COMMIT
//     failed with an error the storage.InboxStore classifies as transient (a lost
//     connection, a serialization failure) in a transaction none of whose
//     statements had failed before; or
//   - a statement sent to the database through the transaction failed with
//     an error the storage.InboxStore classifies as transient (a deadlock, a lock
//     timeout, a lost connection): the database may have ended the
//     transaction, so whatever the handler returned (even nil) the
//     transaction is rolled back and run again.
//
//   - a step of the transaction's own (BEGIN, the claim, COMMIT, ROLLBACK;
//     the consumer's stored-offset write) did not end within the bound
//     its caller set (consumer.Config.Timeouts.Database): a *TimeoutError.
//     A COMMIT given up this way has an unknown outcome: it may still
//     commit once the database gets it. That is the case of a COMMIT that
//     failed transiently: the transaction is run again, and its inbox row,
//     if it committed, makes the run a duplicate.
//
// Everything else is the message's failure and counts as an attempt: the
// handler's own errors, also a net.Error from an HTTP call, io.EOF from a
// decoder, a context deadline of its own, even when marked with
// inbox.Retryable; a COMMIT refused for a reason that is not transient (a
// deferred constraint); a panic.
//
// What is "a statement sent through the transaction" is decided by GORM
// callbacks that [TrackStatements] registers: an error is recorded only when
// it was raised while GORM executed the statement (not by a hook, not by
// the handler after the statement returned). Statements run on the
// underlying *sql.Tx directly, bypassing GORM, are not seen.

// Failure is a database failure (see the fault model above). It is in an
// internal package so that a handler cannot make one up: only this module
// creates it, from what the database returned. One whose Err is the end of
// the caller's context ([ContextEnded]) is retried the same way, but its
// text says that the context ended, not that the database failed.
type Failure struct {
	Op         string // begin, claim, statement, commit, savepoint, before-commit
	Err        error  // what the database returned
	HandlerErr error  // what the handler returned, if anything, after a failed statement
}

func (e *Failure) Error() string {
	label := "database failure"
	if ContextEnded(e.Err) {
		label = "the context ended"
	}
	s := fmt.Sprintf("%s at %s: %v", label, e.Op, e.Err)
	if e.HandlerErr != nil {
		s += fmt.Sprintf(" (the handler then returned: %v)", e.HandlerErr)
	}
	return s
}

func (e *Failure) Unwrap() error { return e.Err }

// DatabaseFailure marks err, returned by the database for op (one of a
// store's own operations, BEGIN, a claim), as the database's failure. It
// returns nil for a nil err.
func DatabaseFailure(op string, err error) error {
	if err == nil {
		return nil
	}
	return &Failure{Op: op, Err: err}
}

// ContextEnded reports whether err is the end of its caller's context (a
// cancellation, a deadline), not a step's bound (a *TimeoutError: the
// database did not answer).
func ContextEnded(err error) bool {
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var te *TimeoutError
	return !errors.As(err, &te)
}

// IsDatabaseFailure reports whether err is, or wraps, a *Failure.
func IsDatabaseFailure(err error) bool {
	var f *Failure
	return errors.As(err, &f)
}

// TimeoutError is a step of a transaction (BEGIN, the claim, COMMIT,
// ROLLBACK, a stored-offset write) that did not end within its bound: the
// database did not answer (a link that drops every packet, a server that
// hangs). It wraps context.DeadlineExceeded and, if the step returned one
// by then, the driver's error. A *Failure carries it: it is never a
// message's failure.
type TimeoutError struct {
	Step  string
	Bound time.Duration
	Err   error // what the step returned once it was given up; nil if it had not returned
}

func (e *TimeoutError) Error() string {
	s := fmt.Sprintf("the database did not answer %s within %v", e.Step, e.Bound)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns context.DeadlineExceeded and the step's error, if any.
func (e *TimeoutError) Unwrap() []error {
	if e.Err == nil {
		return []error{context.DeadlineExceeded}
	}
	return []error{context.DeadlineExceeded, e.Err}
}

// errBound is the cause of a context ended by a step's bound.
var errBound = errors.New("inbox: a step's bound passed")

// WithBound returns ctx with a deadline bound from now, for one step of a
// transaction (see [TimeoutError]), and a function that returns the step's
// error as the database's: err itself if the bound did not pass, else a
// *TimeoutError for step wrapping err. A bound of zero or less leaves ctx
// as it is.
func WithBound(ctx context.Context, step string, bound time.Duration) (context.Context, func(err error) error, context.CancelFunc) {
	if bound <= 0 {
		return ctx, func(err error) error { return err }, func() {}
	}
	bctx, cancel := context.WithTimeoutCause(ctx, bound, errBound)
	return bctx, func(err error) error {
		if err != nil && errors.Is(context.Cause(bctx), errBound) {
			return &TimeoutError{Step: step, Bound: bound, Err: err}
		}
		return err
	}, cancel
}

// within runs fn, giving up on it after bound (if positive): it then
// returns a *TimeoutError for step while fn goes on in a goroutine of its
// own until the driver returns. It is for the steps a driver may run
// without a context (go-sql-driver/mysql's COMMIT and ROLLBACK, and
// COMMIT in the PostgreSQL store's pipelined transactions), which a link
// that drops every packet holds until the kernel gives up on the
// connection (about 15 minutes): the connection stays with fn meanwhile,
// and the pool opens another.
func within(bound time.Duration, step string, fn func() error) error {
	if bound <= 0 {
		return fn()
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return &TimeoutError{Step: step, Bound: bound}
	}
}

// CommitRefused reports that COMMIT refused a transaction for a reason the
// classifier does not call transient; nothing of the transaction was
// committed. What reaches applications is an *inbox.CommitError instead:
// package inbox, and every other caller whose errors reach them, converts
// it.
type CommitRefused struct{ Err error }

func (e *CommitRefused) Error() string { return "commit refused: " + e.Err.Error() }

func (e *CommitRefused) Unwrap() error { return e.Err }

// ErrorClassifier tells transient database errors apart; every
// storage.InboxStore and storage.OutboxStore is one.
type ErrorClassifier interface {
	IsRetryable(err error) bool
}

// txState follows the statements of one transaction.
type txState struct {
	classify ErrorClassifier

	mu     sync.Mutex
	poison error // the first statement error classify calls transient
	failed error // the first statement error of any kind
	// ownDeadline: a statement failed because the handler's context ended
	// before any transient error. Drivers close a connection whose statement
	// was cancelled (go-sql-driver/mysql does), so the lost connection that
	// follows is the handler's doing, not the database's.
	ownDeadline bool
	// commits: the transaction is RunFrom's, which runs afterCommit once
	// COMMIT succeeded. A savepoint's state does not commit; its parent,
	// if followed, is the state of the transaction around it.
	commits     bool
	parent      *txState
	afterCommit []func()
}

// AfterCommit arranges for fn to run once the transaction tx belongs to has
// committed (in the goroutine that committed it), and reports whether it
// could: only a transaction run by [RunFrom] or [Transact] (an inbox
// handler's, a consumer's), or a savepoint inside one, tells its commit.
// fn does not run when the transaction does not commit; it may run after a
// savepoint's work was rolled back, when the transaction around it
// commits.
func AfterCommit(tx *gorm.DB, fn func()) bool {
	for st := lookupState(tx); st != nil; st = st.parent {
		if st.commits {
			st.mu.Lock()
			st.afterCommit = append(st.afterCommit, fn)
			st.mu.Unlock()
			return true
		}
	}
	return false
}

// committed runs the functions AfterCommit registered.
func (s *txState) committed() {
	s.mu.Lock()
	fns := s.afterCommit
	s.afterCommit = nil
	s.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

func (s *txState) record(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = err
	}
	if s.poison == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		s.ownDeadline = true
	}
	if s.poison == nil && s.classify.IsRetryable(err) {
		s.poison = err
	}
}

func (s *txState) state() (poison, failed error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.poison, s.failed
}

// doomed returns the error to report for a transaction a transient
// statement error has doomed: a database failure, unless the handler's own
// deadline caused it; then handlerErr (or, if the handler returned nil, the
// statement error) is the message's failure. It returns nil if no transient
// statement error occurred.
func (s *txState) doomed(handlerErr error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.poison == nil:
		return nil
	case s.ownDeadline && handlerErr != nil:
		return handlerErr
	case s.ownDeadline:
		return fmt.Errorf("inbox: a statement failed after the handler's own deadline, and the handler returned nil: %w", s.poison)
	case IsDatabaseFailure(handlerErr):
		return handlerErr
	}
	return &Failure{Op: "statement", Err: s.poison, HandlerErr: handlerErr}
}

// ErrTransactionAborted is returned, instead of running it, for every
// statement sent through a transaction after an earlier statement of it
// failed with a transient error (package inbox exports it as
// inbox.ErrTransactionAborted). On MySQL and MariaDB a deadlock rolls back
// the whole transaction and the session goes on in autocommit mode: a
// handler that ignored the error would otherwise commit its later writes on
// their own, without the inbox row.
var ErrTransactionAborted = errors.New("inbox: an earlier statement of this transaction failed with a transient error; the transaction is being rolled back and run again")

type txStateKey struct{}

// trackedTx maps a transaction's connection pool value (the *sql.Tx, or
// GORM's *PreparedStmtTX) to its state: handlers that replace the context of
// their *gorm.DB are still followed.
var trackedTx sync.Map

func lookupState(db *gorm.DB) *txState {
	st := db.Statement
	if st == nil {
		return nil
	}
	if p := st.ConnPool; p != nil && reflect.TypeOf(p).Kind() == reflect.Pointer {
		if v, ok := trackedTx.Load(p); ok {
			return v.(*txState)
		}
	}
	if st.Context != nil {
		if s, ok := st.Context.Value(txStateKey{}).(*txState); ok {
			return s
		}
	}
	return nil
}

// withState is ctx carrying st, for a transaction opened with it (see
// RunFrom): track then finds st there and need not derive a new
// *gorm.DB, whose statement GORM would copy once more.
func withState(ctx context.Context, st *txState) context.Context {
	return context.WithValue(ctx, txStateKey{}, st)
}

// track follows tx's statements with st until the returned function is
// called. A transaction already followed with another state (ProcessTx
// inside a handler of Process) keeps that state; one whose context already
// carries st (opened under withState) is only registered by its connection
// pool value.
func track(tx *gorm.DB, st *txState) (*gorm.DB, *txState, func()) {
	if cur := lookupState(tx); cur != nil && cur != st {
		return tx, cur, func() {}
	}
	if c := tx.Statement.Context; c == nil || c.Value(txStateKey{}) != st {
		if c == nil {
			c = context.Background()
		}
		tx = tx.WithContext(withState(c, st))
	}
	p := tx.Statement.ConnPool
	if p == nil || reflect.TypeOf(p).Kind() != reflect.Pointer {
		return tx, st, func() {}
	}
	trackedTx.Store(p, st)
	// Idempotent, and never removes a later transaction's entry.
	return tx, st, func() { trackedTx.CompareAndDelete(p, st) }
}

const (
	cbBefore = "inbox:before_statement"
	cbAfter  = "inbox:after_statement"
	preErr   = "inbox:error_before_statement"
)

var registerMu sync.Mutex

// TrackStatements registers the GORM callbacks by which the transactions
// of this package follow their statements (see the fault model above) on
// db's configuration, once; further calls do nothing. inbox.New,
// outbox.New and consumer.New call it. GORM's callbacks are not safe to
// change while db is in use: call it at start-up, before using [Transact]
// on db.
//
// The callbacks cost a map lookup per statement. For statements outside
// these transactions they do nothing else.
func TrackStatements(db *gorm.DB) error {
	if db == nil || db.Config == nil {
		return fmt.Errorf("%w: TrackStatements needs a *gorm.DB", storage.ErrInvalidConfig)
	}
	registerMu.Lock()
	defer registerMu.Unlock()
	cb := db.Callback()
	if cb.Raw().Get(cbBefore) != nil {
		return nil
	}
	regs := []struct {
		exec          string
		before, after func(name string, fn func(*gorm.DB)) error
	}{
		{"gorm:create", func(n string, f func(*gorm.DB)) error { return cb.Create().Before("gorm:create").Register(n, f) },
			func(n string, f func(*gorm.DB)) error { return cb.Create().After("gorm:create").Register(n, f) }},
		{"gorm:query", func(n string, f func(*gorm.DB)) error { return cb.Query().Before("gorm:query").Register(n, f) },
			func(n string, f func(*gorm.DB)) error { return cb.Query().After("gorm:query").Register(n, f) }},
		{"gorm:update", func(n string, f func(*gorm.DB)) error { return cb.Update().Before("gorm:update").Register(n, f) },
			func(n string, f func(*gorm.DB)) error { return cb.Update().After("gorm:update").Register(n, f) }},
		{"gorm:delete", func(n string, f func(*gorm.DB)) error { return cb.Delete().Before("gorm:delete").Register(n, f) },
			func(n string, f func(*gorm.DB)) error { return cb.Delete().After("gorm:delete").Register(n, f) }},
		{"gorm:row", func(n string, f func(*gorm.DB)) error { return cb.Row().Before("gorm:row").Register(n, f) },
			func(n string, f func(*gorm.DB)) error { return cb.Row().After("gorm:row").Register(n, f) }},
		{"gorm:raw", func(n string, f func(*gorm.DB)) error { return cb.Raw().Before("gorm:raw").Register(n, f) },
			func(n string, f func(*gorm.DB)) error { return cb.Raw().After("gorm:raw").Register(n, f) }},
	}
	for _, r := range regs {
		if err := r.before(cbBefore, beforeStatement); err != nil {
			return fmt.Errorf("inbox: register the %s callback before %s: %w", cbBefore, r.exec, err)
		}
		if err := r.after(cbAfter, afterStatement); err != nil {
			return fmt.Errorf("inbox: register the %s callback after %s: %w", cbAfter, r.exec, err)
		}
	}
	return nil
}

// beforeStatement refuses a statement of a transaction that a transient
// statement error has already doomed, and notes an error that is there
// before the statement runs (from a hook), which the statement did not
// raise.
func beforeStatement(db *gorm.DB) {
	st := lookupState(db)
	if st == nil {
		return
	}
	if poison, _ := st.state(); poison != nil && db.Error == nil {
		_ = db.AddError(fmt.Errorf("%w (the earlier error: %w)", ErrTransactionAborted, poison))
	}
	if db.Error != nil {
		db.Statement.Settings.Store(preErr, db.Error)
	}
}

// afterStatement records the error the statement raised, if any.
func afterStatement(db *gorm.DB) {
	if db.Error == nil || errors.Is(db.Error, gorm.ErrRecordNotFound) {
		return
	}
	if v, ok := db.Statement.Settings.Load(preErr); ok && v == db.Error {
		return
	}
	if st := lookupState(db); st != nil {
		st.record(db.Error)
	}
}

// Begin opens a transaction on db whose statements run under ctx. It is
// GORM's db.WithContext(ctx).Begin(opts) with one copy of db's statement
// instead of three (each a few allocations, per transaction): the same
// *gorm.DB (a copy of db's statement, whose later statements copy it again,
// as GORM's Begin gives) on the transaction that db's connection pool
// begins. Where GORM's Begin does more or otherwise (a
// DefaultTransactionTimeout to apply, an error already on db, a pool that
// cannot begin by itself), GORM's Begin runs. The returned function must be
// called once the transaction has ended.
//
// database/sql rolls back a transaction whose BeginTx context is done from a
// goroutine of its own, and Tx.Commit then answers ctx.Err() at once: the
// caller would return while its transaction still holds its locks (on
// SQLite, the database's write lock, so that the redelivery, or the next
// writer without a busy timeout, fails with SQLITE_BUSY). So the transaction
// is begun under detach(ctx), which ctx's end does not cancel, and
// RunFrom ends it itself before it returns.
//
// A positive bound bounds BEGIN (taking a connection from the pool,
// dialling one, BEGIN itself): past it, the transaction's context is
// cancelled, which every driver honours while it begins, and the error is
// a *Failure with a *TimeoutError. The returned function cancels that
// context too, which ends a COMMIT or ROLLBACK still waiting on it (pgx's).
func Begin(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, bound time.Duration) (*gorm.DB, func(), error) {
	txCtx, release := detach(ctx, rollbackGrace)
	if bound <= 0 {
		tx, err := beginOn(ctx, txCtx, db, opts)
		if err != nil {
			release()
			return nil, nil, err
		}
		return tx, release, nil
	}
	txCtx, abort := context.WithCancelCause(txCtx)
	end := func() { abort(nil); release() }
	timer := time.AfterFunc(bound, func() { abort(errBound) })
	tx, err := beginOn(ctx, txCtx, db, opts)
	if !timer.Stop() {
		// The bound passed, while BEGIN ran or just as it returned: the
		// transaction's context is done, so database/sql rolls back one that
		// began.
		if err == nil {
			_ = tx.Rollback().Error
		} else {
			var f *Failure
			if errors.As(err, &f) {
				err = f.Err
			}
		}
		end()
		return nil, nil, &Failure{Op: "begin", Err: &TimeoutError{Step: "BEGIN", Bound: bound, Err: err}}
	}
	if err != nil {
		end()
		return nil, nil, err
	}
	return tx, end, nil
}

func beginOn(ctx, txCtx context.Context, db *gorm.DB, opts *sql.TxOptions) (*gorm.DB, error) {
	if db.Error != nil || db.DefaultTransactionTimeout > 0 {
		return gormBegin(ctx, txCtx, db, opts)
	}
	tx := db.WithContext(ctx)
	var err error
	switch b := tx.Statement.ConnPool.(type) {
	case gorm.TxBeginner:
		var t *sql.Tx
		if t, err = b.BeginTx(txCtx, opts); err == nil {
			tx.Statement.ConnPool = t
		}
	case gorm.ConnPoolBeginner:
		var t gorm.ConnPool
		if t, err = b.BeginTx(txCtx, opts); err == nil {
			tx.Statement.ConnPool = t
		}
	default:
		return gormBegin(ctx, txCtx, db, opts)
	}
	if err != nil {
		return nil, &Failure{Op: "begin", Err: err}
	}
	return tx, nil
}

// gormBegin opens a transaction with GORM's Begin under txCtx, whose
// statements then run under ctx.
func gormBegin(ctx, txCtx context.Context, db *gorm.DB, opts *sql.TxOptions) (*gorm.DB, error) {
	var txOpts []*sql.TxOptions
	if opts != nil {
		txOpts = append(txOpts, opts)
	}
	tx := db.WithContext(txCtx).Begin(txOpts...)
	if tx.Error != nil {
		return nil, &Failure{Op: "begin", Err: tx.Error}
	}
	// Begin's session has a statement of its own.
	tx.Statement.Context = ctx
	return tx, nil
}

// rollbackGrace bounds how long a transaction may take to end once its
// caller's context is done (as the PostgreSQL adapter bounds its own
// ROLLBACK).
var rollbackGrace = 10 * time.Second

// detach returns a context with ctx's values that ctx's end does not
// cancel: it is cancelled grace after ctx is done (so that a driver whose
// COMMIT or ROLLBACK waits on it, pgx's, cannot hang an ended caller for
// ever), or by release, which must be called once. Its deadline, if ctx has
// one, is grace after ctx's: GORM's Begin then adds no
// DefaultTransactionTimeout of its own, as it would not have to ctx.
func detach(ctx context.Context, grace time.Duration) (context.Context, func()) {
	if ctx.Done() == nil {
		// Never cancelled and without a deadline: nothing to detach from,
		// and a transaction per call need not pay for it.
		return ctx, func() {}
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if d, ok := ctx.Deadline(); ok {
		var cancelDeadline context.CancelFunc
		dctx, cancelDeadline = context.WithDeadline(dctx, d.Add(grace))
		prev := cancel
		cancel = func() { cancelDeadline(); prev() }
	}
	// A timer still pending at release only cancels what release already
	// cancelled.
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return dctx, func() {
		stop()
		cancel()
	}
}

// RunFrom is [Transact] with the transaction opened by begin ([Begin], or a
// store's BEGIN and claim), under the context it is given (ctx carrying the
// transaction's statement state), whose errors must be database failures
// already; begin's function, if not nil, is called once the transaction has
// ended. A positive bound bounds COMMIT and ROLLBACK (begin bounds BEGIN
// itself): see [TimeoutError].
func RunFrom(ctx context.Context, bound time.Duration, begin func(ctx context.Context) (*gorm.DB, func(), error), classify ErrorClassifier, fn func(tx *gorm.DB) error) error {
	st := &txState{classify: classify, commits: true}
	tx, release, err := begin(withState(ctx, st))
	if err != nil {
		return err
	}
	if release != nil {
		defer release()
	}
	tx, st, untrack := track(tx, st)
	defer untrack()
	ended := false
	defer func() {
		if !ended {
			// Its error says nothing new: the transaction did not commit, and
			// a connection that cannot roll back is discarded by database/sql.
			// A ROLLBACK given up after the bound goes on in the background.
			_ = within(bound, "ROLLBACK", func() error { return tx.Rollback().Error })
		}
	}()
	if err := fn(tx); err != nil {
		if doomed := st.doomed(err); doomed != nil {
			return doomed
		}
		return err
	}
	if doomed := st.doomed(nil); doomed != nil {
		return doomed
	}
	_, failed := st.state()
	// A done context refuses COMMIT, as database/sql's Tx.Commit does; the
	// deferred rollback ends the transaction before the caller goes on.
	if err := ctx.Err(); err != nil {
		return commitError(classify, failed, err)
	}
	ended = true
	if err := within(bound, "COMMIT", func() error { return tx.Commit().Error }); err != nil {
		var te *TimeoutError
		if errors.As(err, &te) {
			// The outcome is unknown: the transaction may commit once the
			// database gets the COMMIT. Run again, its inbox row makes it a
			// duplicate if it did.
			return &Failure{Op: "commit", Err: err}
		}
		return commitError(classify, failed, err)
	}
	st.committed()
	return nil
}

// commitError is the error of a transaction that did not commit at COMMIT:
// a database failure if the database refused it for a transient reason and
// no statement had failed before, else a *CommitRefused.
func commitError(classify ErrorClassifier, failed, err error) error {
	if failed == nil && classify.IsRetryable(err) {
		return &Failure{Op: "commit", Err: err}
	}
	return &CommitRefused{Err: err}
}

// Transact runs fn in a new transaction on db and commits it, with the
// fault model of inbox.Process but no inbox row: for naturally idempotent
// effects that must still tell a database failure from their own. classify
// decides which database errors are transient (the adapter's store); a
// positive bound bounds BEGIN, COMMIT and ROLLBACK (see [TimeoutError]). The
// transaction is not retried: [IsDatabaseFailure] on the error says
// whether the database failed (retry without counting an attempt); any
// other error is fn's, or a *CommitRefused. The transaction is rolled back
// whenever it does not commit, also when fn panics (the panic goes on:
// a caller that runs an application's code in fn recovers it there), and
// it has ended when Transact returns.
//
// db must have been prepared with [TrackStatements], or statement failures
// inside fn count as fn's own.
func Transact(ctx context.Context, db *gorm.DB, classify ErrorClassifier, opts *sql.TxOptions, bound time.Duration, fn func(tx *gorm.DB) error) error {
	if db == nil || classify == nil || fn == nil {
		return fmt.Errorf("%w: Transact needs a db, a classifier and a function", storage.ErrInvalidConfig)
	}
	return RunFrom(ctx, bound, func(tctx context.Context) (*gorm.DB, func(), error) { return Begin(tctx, db, opts, bound) }, classify, fn)
}

// savepointSeq names savepoints: unique within the process, so nested
// ProcessTx calls never reuse a name.
var savepointSeq atomic.Uint64

// ErrRollbackToFailed marks an error of InSavepoint after which the
// caller's transaction may hold part of the savepoint's work.
var ErrRollbackToFailed = errors.New("rolling back to the savepoint failed too, so the caller's transaction may hold part of it and must be rolled back")

// InSavepoint runs fn inside a savepoint of the caller's transaction tx,
// rolling back to it when fn fails and releasing it otherwise, with the
// fault model of [Transact] for fn's statements. It issues the savepoint
// itself, so a *gorm.DB with DisableNestedTransaction still gets one.
func InSavepoint(ctx context.Context, tx *gorm.DB, classify ErrorClassifier, fn func(sp *gorm.DB) error) error {
	if c, ok := tx.Statement.ConnPool.(gorm.TxCommitter); !ok || c == nil {
		return fmt.Errorf("%w: ProcessTx needs a *gorm.DB inside a transaction (from db.Begin or db.Transaction)", storage.ErrInvalidConfig)
	}
	tx = quietSession(ctx, tx)
	name := fmt.Sprintf("inbox_sp_%d", savepointSeq.Add(1))
	if err := tx.SavePoint(name).Error; err != nil {
		return &Failure{Op: "savepoint", Err: err}
	}
	sp, st, untrack := track(tx, &txState{classify: classify, parent: lookupState(tx)})
	err := fn(sp)
	// The savepoint's own statements must not be refused as the doomed
	// transaction's.
	untrack()
	if doomed := st.doomed(err); doomed != nil {
		err = doomed
	}
	if err != nil {
		if rerr := tx.RollbackTo(name).Error; rerr != nil {
			return fmt.Errorf("%w; %w: %w", err, ErrRollbackToFailed, rerr)
		}
		return err
	}
	if err := tx.Exec("RELEASE SAVEPOINT " + name).Error; err != nil {
		return &Failure{Op: "savepoint", Err: err}
	}
	return nil
}

// Statements are the statements of one transaction, as followed.
type Statements struct{ st *txState }

// StatementsOf returns the statements of the transaction tx belongs to
// (one run by [RunFrom] or [Transact]).
func StatementsOf(tx *gorm.DB) Statements { return Statements{st: lookupState(tx)} }

// EndedByContext reports whether a statement of the transaction failed
// because its context was done (a deadline, a cancellation) before any
// statement failed transiently: a statement the handler's deadline cut
// short, or one the handler sent after it.
func (s Statements) EndedByContext() bool {
	if s.st == nil {
		return false
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.ownDeadline
}

// FirstFailure returns the first statement error of any kind so far, or
// nil if none failed or the transaction is not followed.
func (s Statements) FirstFailure() error {
	if s.st == nil {
		return nil
	}
	_, failed := s.st.state()
	return failed
}
