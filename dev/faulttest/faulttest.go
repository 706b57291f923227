// Package faulttest holds what the fault-model tests of several packages
// share: a Store with an error classification of the test's choosing, and
// the classifications the real adapters make.
package faulttest

import (
	"errors"
	"io"
	"net"
	"strings"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// ClassifyingStore is a Store (in tests, the SQLite one) whose
// IsRetryable also reports what Transient reports, so that the inbox's
// fault model can be tried against the classifications of other adapters.
type ClassifyingStore struct {
	storage.InboxStore
	Transient func(error) bool
}

// IsRetryable reports Transient's answer or the Store's.
func (s ClassifyingStore) IsRetryable(err error) bool {
	return s.Transient(err) || s.InboxStore.IsRetryable(err)
}

// PostgresLike classifies as the PostgreSQL adapter does errors without a
// SQLSTATE: network errors and EOFs are lost connections.
func PostgresLike(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// NoSuchTable reports SQLite's "no such table" (SQLITE_ERROR): a statement
// error a test can provoke at will, to stand in for a deadlock or a lost
// connection.
func NoSuchTable(err error) bool {
	code, ok := inboxsqlite.ErrorCode(err)
	return ok && code == 1 && strings.Contains(err.Error(), "no such table")
}
