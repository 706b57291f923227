package storage

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrInvalidConfig is wrapped by the configuration errors of the adapters'
// constructors, as by those of inbox.New and outbox.New (inbox.ErrInvalidConfig
// is the same value).
var ErrInvalidConfig = errors.New("inbox: invalid configuration")

var identifierPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidateIdentifier reports whether name can be used unquoted as a table or
// schema name in every supported dialect: ASCII letters, digits and
// underscores, not starting with a digit, at most 63 bytes. Adapters call it
// on every configured name before it goes into SQL; its error wraps
// ErrInvalidConfig.
func ValidateIdentifier(kind, name string) error {
	if !identifierPattern.MatchString(name) {
		return &identifierError{kind: kind, name: name}
	}
	return nil
}

type identifierError struct{ kind, name string }

func (e *identifierError) Error() string {
	v := e.name
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return fmt.Sprintf("inbox: invalid %s %q: must be 1-63 ASCII letters, digits or underscores, not starting with a digit", e.kind, v)
}

func (e *identifierError) Unwrap() error { return ErrInvalidConfig }

// MissingTableReporter is an optional capability of an InboxStore or an
// OutboxStore. IsMissingTable reports whether err, returned by one of the
// store's operations or by any statement on its database, says that a
// table does not exist: one never migrated, or dropped while the
// application runs. The consumer and the relay still retry such a failure
// as any other failure of the database (the table may come back), but
// their log then names the missing table and the Migrate call that makes
// it. The decision must rest on error codes (PostgreSQL's SQLSTATE 42P01,
// MySQL's and MariaDB's error 1146), never on message text where the
// database has a code for it (SQLite has none: its SQLITE_ERROR says
// "no such table").
type MissingTableReporter interface {
	IsMissingTable(err error) bool
}
