package inbox

import (
	"github.com/inboxgo/inbox/internal/txn"
)

// IsDatabaseFailure reports whether err says that the database failed
// rather than the message: BEGIN, the inbox's claim or COMMIT failed, or a
// statement of the transaction failed with an error the storage.InboxStore classifies as
// transient. Nothing a handler returns by itself makes it true. Such
// failures say nothing about the message: a caller retrying messages
// should retry them without counting an attempt.
func IsDatabaseFailure(err error) bool { return txn.IsDatabaseFailure(err) }

// CommitError reports that COMMIT refused a transaction for a reason the
// storage.InboxStore does not classify as transient, typically a deferred constraint
// checked only at commit, or a transaction the database had already
// aborted after a statement error that the handler ignored. Nothing of the
// transaction was committed. It is the failure of the message (or, in a
// batch, of one of its messages: ProcessBatch then runs them one by one to
// find it).
type CommitError struct{ Err error }

func (e *CommitError) Error() string { return "commit refused: " + e.Err.Error() }

func (e *CommitError) Unwrap() error { return e.Err }

// fromTxn is err, returned by a transaction of package txn, with a COMMIT
// the database refused as a *CommitError.
func fromTxn(err error) error {
	if r, ok := err.(*txn.CommitRefused); ok {
		return &CommitError{Err: r.Err}
	}
	return err
}

// ErrTransactionAborted is returned, instead of running it, for every
// statement a handler sends after an earlier statement of the same
// transaction failed with a transient error. On MySQL and MariaDB a deadlock
// rolls back the whole transaction and the session goes on in autocommit
// mode: a handler that ignored the error would otherwise commit its later
// writes on their own, without the inbox row.
var ErrTransactionAborted = txn.ErrTransactionAborted
